//! Symbolic dimensions.
//!
//! A [`Dim`] is either unknown (`?`) or a [`DimExpr`]: an integer polynomial over symbols and
//! floor divisions by positive constants, kept in one canonical form (terms sorted, like terms
//! merged, zero terms dropped, exact divisions folded). Equality and hashing are structural on that
//! canonical form: `seq + past` and `past + seq` are the same value, and no simplifier runs inside
//! `==`. Two unknown dims are equal as values, but never *provably* equal: use
//! [`Dim::provably_eq`] for that question.

use std::fmt;

use crate::arena::entity;

entity!(
    /// A dimension symbol (`batch`, `seq`), declared in [`crate::Module::symbols`].
    Sym,
    "sym"
);

/// A symbol's declaration: its name and the range of values it may take.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymbolData {
    /// The source name (`batch`, `past_sequence_length`).
    pub name: String,
    /// Smallest value (defaults to 0, or 1 for unconstrained dims).
    pub min: Option<i64>,
    /// Largest value, if bounded.
    pub max: Option<i64>,
    /// An expression over other symbols that this symbol equals, where the source declared both
    /// for one dim (an output declared `total_seq` that inference computes as `past_seq + seq`).
    /// Inference writes the expression in place of the symbol, so both spellings compare equal;
    /// the interpreter checks the equality when inputs bind both sides.
    pub equals: Option<DimExpr>,
}

/// One factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// A symbol.
    Sym(Sym),
    /// Floor division of a non-constant expression by a constant greater than 1.
    Div(Box<DimExpr>, i64),
}

/// A canonical integer expression over symbols: `constant + Σ coef · Π atoms`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DimExpr {
    /// Non-constant terms, sorted by monomial; each monomial is a sorted, non-empty atom list and
    /// each coefficient is non-zero.
    terms: Vec<(Vec<Atom>, i64)>,
    constant: i64,
}

impl DimExpr {
    /// The constant `n`.
    pub fn constant(n: i64) -> Self {
        DimExpr {
            terms: Vec::new(),
            constant: n,
        }
    }

    /// The symbol `s`.
    pub fn sym(s: Sym) -> Self {
        DimExpr {
            terms: vec![(vec![Atom::Sym(s)], 1)],
            constant: 0,
        }
    }

    /// The value if the expression is a constant.
    pub fn as_constant(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    /// The symbol if the expression is exactly one symbol.
    pub fn as_sym(&self) -> Option<Sym> {
        match (self.terms.as_slice(), self.constant) {
            ([(atoms, 1)], 0) => match atoms.as_slice() {
                [Atom::Sym(s)] => Some(*s),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether the expression is at least 0 for every binding of its symbols (which stand for
    /// sizes, never negative): a non-negative constant plus terms with positive coefficients
    /// whose atoms are symbols or floor divisions of such expressions. Conservative: `false`
    /// means "not proven".
    pub fn provably_nonneg(&self) -> bool {
        self.constant >= 0
            && self.terms.iter().all(|(atoms, coef)| {
                *coef > 0
                    && atoms.iter().all(|a| match a {
                        Atom::Sym(_) => true,
                        Atom::Div(e, d) => *d > 0 && e.provably_nonneg(),
                    })
            })
    }

    /// The terms of the canonical form (monomial, coefficient) and the constant.
    pub fn parts(&self) -> (&[(Vec<Atom>, i64)], i64) {
        (&self.terms, self.constant)
    }

    /// Every symbol that occurs in the expression.
    pub fn symbols(&self, out: &mut Vec<Sym>) {
        for (atoms, _) in &self.terms {
            for a in atoms {
                match a {
                    Atom::Sym(s) => out.push(*s),
                    Atom::Div(e, _) => e.symbols(out),
                }
            }
        }
    }

    /// The canonical form of a sum of terms; `None` when merging coefficients overflows.
    fn from_terms(mut terms: Vec<(Vec<Atom>, i64)>, constant: i64) -> Option<Self> {
        terms.sort();
        let mut merged: Vec<(Vec<Atom>, i64)> = Vec::with_capacity(terms.len());
        for (m, c) in terms {
            match merged.last_mut() {
                Some((last, lc)) if *last == m => *lc = lc.checked_add(c)?,
                _ => merged.push((m, c)),
            }
        }
        merged.retain(|(_, c)| *c != 0);
        Some(DimExpr {
            terms: merged,
            constant,
        })
    }

    /// `self + other`; `None` when a coefficient overflows 64 bits. The arithmetic of dim
    /// expressions is checked throughout: a size read from a file never wraps into another one.
    pub fn add(&self, other: &DimExpr) -> Option<DimExpr> {
        let terms = self.terms.iter().chain(&other.terms).cloned().collect();
        Self::from_terms(terms, self.constant.checked_add(other.constant)?)
    }

    /// `self - other`; `None` on overflow.
    pub fn sub(&self, other: &DimExpr) -> Option<DimExpr> {
        self.add(&other.scale(-1)?)
    }

    /// `k * self`; `None` on overflow.
    pub fn scale(&self, k: i64) -> Option<DimExpr> {
        let terms = self
            .terms
            .iter()
            .map(|(m, c)| Some((m.clone(), c.checked_mul(k)?)))
            .collect::<Option<Vec<_>>>()?;
        Self::from_terms(terms, self.constant.checked_mul(k)?)
    }

    /// `self * other`; `None` on overflow.
    pub fn mul(&self, other: &DimExpr) -> Option<DimExpr> {
        let mut terms = Vec::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Vec<Atom> = ma.iter().chain(mb).cloned().collect();
                m.sort();
                terms.push((m, ca.checked_mul(*cb)?));
            }
            if other.constant != 0 {
                terms.push((ma.clone(), ca.checked_mul(other.constant)?));
            }
        }
        if self.constant != 0 {
            for (mb, cb) in &other.terms {
                terms.push((mb.clone(), cb.checked_mul(self.constant)?));
            }
        }
        Self::from_terms(terms, self.constant.checked_mul(other.constant)?)
    }

    /// `floor(self / d)`; `None` when `d <= 0`.
    pub fn floor_div(&self, d: i64) -> Option<DimExpr> {
        if d <= 0 {
            return None;
        }
        if d == 1 {
            return Some(self.clone());
        }
        if let Some(c) = self.as_constant() {
            return Some(DimExpr::constant(c.div_euclid(d)));
        }
        if self.constant % d == 0 && self.terms.iter().all(|(_, c)| c % d == 0) {
            let terms = self.terms.iter().map(|(m, c)| (m.clone(), c / d)).collect();
            return Self::from_terms(terms, self.constant / d);
        }
        // (x / a) / b == x / (a * b) for positive a, b.
        if let ([(atoms, 1)], 0) = (self.terms.as_slice(), self.constant)
            && let [Atom::Div(inner, a)] = atoms.as_slice()
        {
            return inner.floor_div(a.checked_mul(d)?);
        }
        Some(DimExpr {
            terms: vec![(vec![Atom::Div(Box::new(self.clone()), d)], 1)],
            constant: 0,
        })
    }

    /// `ceil(self / d)`; `None` when `d <= 0` or on overflow.
    pub fn ceil_div(&self, d: i64) -> Option<DimExpr> {
        self.add(&DimExpr::constant(d.checked_sub(1)?))?
            .floor_div(d)
    }

    /// The expression with every symbol `s` for which `f(s)` is `Some(e)` replaced by `e`, in
    /// canonical form; `None` if a floor division of the result is undefined or a coefficient
    /// overflows.
    pub fn substitute(&self, f: &dyn Fn(Sym) -> Option<DimExpr>) -> Option<DimExpr> {
        let mut out = DimExpr::constant(self.constant);
        for (atoms, c) in &self.terms {
            let mut term = DimExpr::constant(*c);
            for a in atoms {
                let x = match a {
                    Atom::Sym(s) => f(*s).unwrap_or_else(|| DimExpr::sym(*s)),
                    Atom::Div(inner, d) => inner.substitute(f)?.floor_div(*d)?,
                };
                term = term.mul(&x)?;
            }
            out = out.add(&term)?;
        }
        Some(out)
    }

    /// Evaluates the expression with `value(sym)` for each symbol.
    pub fn eval(&self, value: &dyn Fn(Sym) -> Option<i64>) -> Option<i64> {
        let mut total = self.constant;
        for (atoms, c) in &self.terms {
            let mut prod = *c;
            for a in atoms {
                let v = match a {
                    Atom::Sym(s) => value(*s)?,
                    Atom::Div(e, d) => e.eval(value)?.div_euclid(*d),
                };
                prod = prod.checked_mul(v)?;
            }
            total = total.checked_add(prod)?;
        }
        Some(total)
    }

    /// Writes the expression with symbol names from `name`.
    pub fn write(&self, f: &mut dyn fmt::Write, name: &dyn Fn(Sym) -> String) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "{}", self.constant);
        }
        for (i, (atoms, c)) in self.terms.iter().enumerate() {
            let mag = c.unsigned_abs();
            if i == 0 {
                if *c < 0 {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if *c < 0 { " - " } else { " + " })?;
            }
            let single = atoms.len() == 1 && mag == 1;
            if mag != 1 {
                write!(f, "{mag} * ")?;
            }
            for (j, a) in atoms.iter().enumerate() {
                if j > 0 {
                    f.write_str(" * ")?;
                }
                match a {
                    Atom::Sym(s) => f.write_str(&name(*s))?,
                    Atom::Div(e, d) => {
                        if !single {
                            f.write_str("(")?;
                        }
                        let simple = e.terms.len() == 1 && e.constant == 0 && {
                            let (m, c) = &e.terms[0];
                            *c == 1 && m.len() == 1 && matches!(m[0], Atom::Sym(_))
                        };
                        if !simple {
                            f.write_str("(")?;
                        }
                        e.write(f, name)?;
                        if !simple {
                            f.write_str(")")?;
                        }
                        write!(f, " / {d}")?;
                        if !single {
                            f.write_str(")")?;
                        }
                    }
                }
            }
        }
        match self.constant {
            0 => Ok(()),
            c if c < 0 => write!(f, " - {}", c.unsigned_abs()),
            c => write!(f, " + {c}"),
        }
    }

    /// Renders the expression with symbol names from `name`.
    pub fn render(&self, name: &dyn Fn(Sym) -> String) -> String {
        let mut s = String::new();
        let _ = self.write(&mut s, name);
        s
    }
}

/// One dimension of a shape: unknown, or a canonical expression (a constant in the common case).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// Not known at compile time and not named (ONNX: a dim with neither value nor param).
    Unknown,
    /// A known constant or a symbolic expression.
    Expr(DimExpr),
}

impl Dim {
    /// The constant dimension `n`.
    pub fn known(n: i64) -> Dim {
        Dim::Expr(DimExpr::constant(n))
    }

    /// The dimension named by `s`.
    pub fn sym(s: Sym) -> Dim {
        Dim::Expr(DimExpr::sym(s))
    }

    /// The value, when constant.
    pub fn as_known(&self) -> Option<i64> {
        match self {
            Dim::Expr(e) => e.as_constant(),
            Dim::Unknown => None,
        }
    }

    /// The expression, when not unknown.
    pub fn expr(&self) -> Option<&DimExpr> {
        match self {
            Dim::Expr(e) => Some(e),
            Dim::Unknown => None,
        }
    }

    /// Whether both dims are known to be equal for every symbol binding.
    pub fn provably_eq(&self, other: &Dim) -> bool {
        matches!((self, other), (Dim::Expr(a), Dim::Expr(b)) if a == b)
    }

    fn zip(&self, other: &Dim, f: impl FnOnce(&DimExpr, &DimExpr) -> Option<DimExpr>) -> Dim {
        match (self, other) {
            (Dim::Expr(a), Dim::Expr(b)) => f(a, b).map_or(Dim::Unknown, Dim::Expr),
            _ => Dim::Unknown,
        }
    }

    /// `self + other` (unknown if either is, or where the sum overflows 64 bits).
    pub fn add(&self, other: &Dim) -> Dim {
        self.zip(other, DimExpr::add)
    }

    /// `self - other` (unknown if either is).
    pub fn sub(&self, other: &Dim) -> Dim {
        self.zip(other, DimExpr::sub)
    }

    /// `self * other` (unknown if either is).
    pub fn mul(&self, other: &Dim) -> Dim {
        self.zip(other, DimExpr::mul)
    }

    /// `floor(self / d)` for a constant `d > 0`; unknown otherwise.
    pub fn floor_div(&self, d: &Dim) -> Dim {
        match (self, d.as_known()) {
            (Dim::Expr(a), Some(d)) => a.floor_div(d).map_or(Dim::Unknown, Dim::Expr),
            _ => Dim::Unknown,
        }
    }

    /// `ceil(self / d)` for a constant `d > 0`; unknown otherwise.
    pub fn ceil_div(&self, d: &Dim) -> Dim {
        match (self, d.as_known()) {
            (Dim::Expr(a), Some(d)) => a.ceil_div(d).map_or(Dim::Unknown, Dim::Expr),
            _ => Dim::Unknown,
        }
    }

    /// Renders the dim (`?` when unknown) with symbol names from `name`.
    pub fn render(&self, name: &dyn Fn(Sym) -> String) -> String {
        match self {
            Dim::Unknown => "?".to_owned(),
            Dim::Expr(e) => e.render(name),
        }
    }
}

impl From<i64> for Dim {
    fn from(n: i64) -> Dim {
        Dim::known(n)
    }
}

/// Parses a dim expression such as `past_seq + seq`, `16*h_patches`, `(h // 16) * (w // 16) + 1`.
///
/// Identifiers are resolved through `sym`. Division must be by a positive integer constant (`/`
/// and `//` both mean floor division). Returns `None` when the text is not such an expression;
/// callers then treat the whole text as one symbol name.
pub fn parse_dim_expr(text: &str, sym: &mut dyn FnMut(&str) -> Sym) -> Option<DimExpr> {
    let tokens = lex(text)?;
    let mut p = ExprParser {
        tokens,
        pos: 0,
        sym,
    };
    let e = p.expr()?;
    (p.pos == p.tokens.len()).then_some(e)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Ident(String),
    Op(char),
}

fn lex(text: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_digit() {
            let mut end = i;
            while let Some(&(j, d)) = chars.peek() {
                if d.is_ascii_digit() {
                    end = j + 1;
                    chars.next();
                } else {
                    break;
                }
            }
            if chars
                .peek()
                .is_some_and(|&(_, d)| d.is_alphabetic() || d == '_')
            {
                return None;
            }
            out.push(Tok::Int(text[i..end].parse().ok()?));
        } else if c.is_alphabetic() || c == '_' {
            let mut end = i;
            while let Some(&(j, d)) = chars.peek() {
                if d.is_alphanumeric() || d == '_' {
                    end = j + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(Tok::Ident(text[i..end].to_owned()));
        } else if "+-*/()".contains(c) {
            chars.next();
            if c == '/' && chars.peek().is_some_and(|&(_, d)| d == '/') {
                chars.next();
            }
            out.push(Tok::Op(c));
        } else {
            return None;
        }
    }
    Some(out)
}

struct ExprParser<'a> {
    tokens: Vec<Tok>,
    pos: usize,
    sym: &'a mut dyn FnMut(&str) -> Sym,
}

impl ExprParser<'_> {
    fn peek_op(&self) -> Option<char> {
        match self.tokens.get(self.pos) {
            Some(Tok::Op(c)) => Some(*c),
            _ => None,
        }
    }

    fn expr(&mut self) -> Option<DimExpr> {
        let mut acc = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek_op() {
            self.pos += 1;
            let rhs = self.term()?;
            acc = if op == '+' {
                acc.add(&rhs)?
            } else {
                acc.sub(&rhs)?
            };
        }
        Some(acc)
    }

    fn term(&mut self) -> Option<DimExpr> {
        let mut acc = self.factor()?;
        while let Some(op @ ('*' | '/')) = self.peek_op() {
            self.pos += 1;
            let rhs = self.factor()?;
            acc = if op == '*' {
                acc.mul(&rhs)?
            } else {
                acc.floor_div(rhs.as_constant()?)?
            };
        }
        Some(acc)
    }

    fn factor(&mut self) -> Option<DimExpr> {
        let tok = self.tokens.get(self.pos)?.clone();
        self.pos += 1;
        match tok {
            Tok::Int(n) => Some(DimExpr::constant(n)),
            Tok::Ident(name) => {
                if self.peek_op() == Some('(') && name == "floor" {
                    return self.factor();
                }
                Some(DimExpr::sym((self.sym)(&name)))
            }
            Tok::Op('-') => self.factor()?.scale(-1),
            Tok::Op('(') => {
                let e = self.expr()?;
                (self.tokens.get(self.pos) == Some(&Tok::Op(')'))).then_some(())?;
                self.pos += 1;
                Some(e)
            }
            Tok::Op(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, names: &mut Vec<String>) -> Option<DimExpr> {
        parse_dim_expr(text, &mut |n| match names.iter().position(|x| x == n) {
            Some(i) => Sym::from_index(i),
            None => {
                names.push(n.to_owned());
                Sym::from_index(names.len() - 1)
            }
        })
    }

    fn show(e: &DimExpr, names: &[String]) -> String {
        e.render(&|s| names[s.index()].clone())
    }

    #[test]
    fn canonical_forms() {
        let mut n = Vec::new();
        let a = parse("past_seq + seq", &mut n).unwrap();
        let b = parse("seq+past_seq", &mut n).unwrap();
        assert_eq!(a, b);
        assert_eq!(show(&a, &n), "past_seq + seq");
        let c = parse("16*h_patches", &mut n).unwrap();
        assert_eq!(show(&c, &n), "16 * h_patches");
        assert_eq!(show(&c.floor_div(16).unwrap(), &n), "h_patches");
        let d = parse("(h // 16) * (w // 16) + 1", &mut n).unwrap();
        assert_eq!(show(&d, &n), "(h / 16) * (w / 16) + 1");
        assert_eq!(parse(&show(&d, &n), &mut n).unwrap(), d);
        let e = parse("seq - 1 + 2*seq", &mut n).unwrap();
        assert_eq!(show(&e, &n), "3 * seq - 1");
        let f = parse("(seq + 1) / 2", &mut n).unwrap();
        assert_eq!(show(&f, &n), "(seq + 1) / 2");
        assert_eq!(parse(&show(&f, &n), &mut n).unwrap(), f);
        assert!(parse("seq / batch", &mut n).is_none());
        assert!(parse("unk__0.x", &mut n).is_none());
        assert!(parse("3abc", &mut n).is_none());
        assert_eq!(
            parse("-seq", &mut n)
                .unwrap()
                .render(&|s| n[s.index()].clone()),
            "-seq"
        );
    }

    #[test]
    fn eval_and_div() {
        let mut n = Vec::new();
        let d = parse("(h / 16) * (w / 16) + 1", &mut n).unwrap();
        let v = d.eval(&|s| Some(if n[s.index()] == "h" { 224 } else { 160 }));
        assert_eq!(v, Some(14 * 10 + 1));
        let x = parse("x", &mut n).unwrap();
        assert_eq!(
            x.floor_div(2).unwrap().floor_div(3).unwrap(),
            x.floor_div(6).unwrap()
        );
    }
}
