//! `Einsum` equations: one parser for the verifier, shape inference and the interpreter.

use std::collections::HashSet;

/// One term of an equation: the labels before and after its `...`, if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// Labels before the ellipsis (all of them when there is none).
    pub pre: Vec<char>,
    /// Labels after the ellipsis.
    pub post: Vec<char>,
    /// Whether the term has `...`.
    pub ellipsis: bool,
}

impl Term {
    fn parse(term: &str) -> Result<Term, String> {
        if term.matches("...").count() > 1 {
            return Err(format!("'{term}' has more than one '...'"));
        }
        let (pre, post, ellipsis) = match term.split_once("...") {
            Some((a, b)) => (a, b, true),
            None => (term, "", false),
        };
        if let Some(c) = pre
            .chars()
            .chain(post.chars())
            .find(|c| !c.is_ascii_alphabetic())
        {
            return Err(format!("'{c}' in '{term}' is not a label (a letter)"));
        }
        Ok(Term {
            pre: pre.chars().collect(),
            post: post.chars().collect(),
            ellipsis,
        })
    }

    /// The named labels, in order.
    pub fn labels(&self) -> impl Iterator<Item = char> + '_ {
        self.pre.iter().chain(&self.post).copied()
    }
}

/// A parsed equation: one term per operand, and the output term when `->` gives one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Equation {
    /// The operands' terms.
    pub inputs: Vec<Term>,
    /// The output term (`None`: implicit, the labels that appear once, in order).
    pub output: Option<Term>,
}

/// Parses `equation` (whitespace ignored) for `operands` operands, with what ONNX and numpy
/// require: one term per operand, terms of letters with at most one `...`, and an output whose
/// labels each come from an input, once, with `...` only where an input has it.
pub fn parse(equation: &str, operands: usize) -> Result<Equation, EinsumError> {
    parse_text(equation, operands).map_err(EinsumError)
}

/// An equation [`parse`] refuses: what is wrong with it (the caller names the equation).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EinsumError(pub String);

fn parse_text(equation: &str, operands: usize) -> Result<Equation, String> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let inputs = lhs
        .split(',')
        .map(Term::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if inputs.len() != operands {
        return Err(format!(
            "{} input terms for {operands} operands",
            inputs.len()
        ));
    }
    let output = rhs.map(Term::parse).transpose()?;
    if let Some(out) = &output {
        if out.ellipsis && !inputs.iter().any(|t| t.ellipsis) {
            return Err("the output has '...' and no input does".to_owned());
        }
        let seen: HashSet<char> = inputs.iter().flat_map(Term::labels).collect();
        let mut once = HashSet::new();
        for c in out.labels() {
            if !seen.contains(&c) {
                return Err(format!("output label '{c}' is in no input"));
            }
            if !once.insert(c) {
                return Err(format!("output label '{c}' repeats"));
            }
        }
    }
    Ok(Equation { inputs, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_terms_and_refuses_what_onnx_refuses() {
        let e = parse(" bi...j, jk -> ...ik", 2).expect("parses");
        assert_eq!(e.inputs[0].pre, ['b', 'i']);
        assert_eq!(e.inputs[0].post, ['j']);
        assert!(e.inputs[0].ellipsis && !e.inputs[1].ellipsis);
        assert_eq!(
            e.output.as_ref().map(|o| o.labels().collect::<String>()),
            Some("ik".into())
        );
        assert_eq!(parse("ij", 1).expect("implicit").output, None);
        for (eq, n, want) in [
            ("ij->jj", 1, "output label 'j' repeats"),
            ("ij,jk->ik", 1, "2 input terms for 1 operands"),
            ("ij->k", 1, "output label 'k' is in no input"),
            ("i$->i", 1, "'$' in 'i$' is not a label (a letter)"),
            ("ij->...i", 1, "the output has '...' and no input does"),
            ("...i...->i", 1, "'...i...' has more than one '...'"),
        ] {
            assert_eq!(parse(eq, n).expect_err(eq).0, want, "{eq}");
        }
    }
}
