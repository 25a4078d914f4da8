//! Rule sets. Each topic lives in one file and exposes `rules()`; see `README.md` (the
//! rulebook) for the conventions.
//!
//! Rules are directional and named (kebab-case, unique). A rule either rewrites pattern to
//! pattern ([`rw`]) or matches a pattern and builds the replacement in Rust ([`rule`]); both
//! record each firing. Conditions read the e-class analysis ([`ty`], [`consts`], [`op`]).
//! Rules never compute tensors: they build constant-expression ops that const-fold evaluates
//! after extraction.

use egg::{Applier, Id, Language, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};
use mmq_ir::{DType, Dim, Op, OpKind, Type};

use crate::egraph::RuleSet;
use crate::egraph::convert::EG;
use crate::egraph::facts::{Facts, Konst, literal};
use crate::egraph::lang::{TNode, kind_of};

mod activation;
mod attention;
mod fold_bn;
mod fuse_act;
mod fuse_quant;
mod norm;
mod rotary;
mod simplify;

/// A rewrite rule.
pub(crate) type Rw = Rewrite<TNode, Facts>;

/// The rules of `set`.
pub(crate) fn rule_set(set: RuleSet) -> Vec<Rw> {
    match set {
        RuleSet::Simplify => simplify::rules(),
        RuleSet::FoldBn => fold_bn::rules(),
        RuleSet::FuseAct => fuse_act::rules(),
        RuleSet::FuseQuant => fuse_quant::rules(),
        RuleSet::Transformer => {
            let mut r = norm::rules();
            r.extend(activation::rules());
            r.extend(attention::rules());
            r.extend(rotary::rules());
            r
        }
    }
}

/// A pattern variable.
pub(crate) fn var(s: &str) -> Var {
    s.parse()
        .unwrap_or_else(|_| panic!("bad pattern variable {s}"))
}

/// A pattern; panics on a syntax error (caught by the test that builds every rule set).
pub(crate) fn pat(s: &str) -> Pattern<TNode> {
    s.parse()
        .unwrap_or_else(|e| panic!("bad pattern {s}: {e:?}"))
}

type Cond = Box<dyn Fn(&EG, &Subst) -> bool + Send + Sync>;

/// Pattern-to-pattern rule with conditions.
pub(crate) fn rw(name: &str, lhs: &str, rhs: &str, conds: Vec<Cond>) -> Rw {
    let rhs = pat(rhs);
    rule(name, lhs, conds, move |eg, _, s| {
        let ast: &PatternAst<TNode> = &rhs.ast;
        Some(instantiate(eg, ast, s))
    })
}

/// A rule whose replacement is built by `build` (returning the new class, or `None` to
/// decline).
pub(crate) fn rule<F>(name: &str, lhs: &str, conds: Vec<Cond>, build: F) -> Rw
where
    F: Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync + 'static,
{
    let searcher = pat(lhs);
    let applier = Build { conds, build };
    Rewrite::new(name, searcher, applier).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// A rule matching any of several patterns (the operand orders and spellings of one
/// rewrite), each binding the variables its conditions and builder read.
pub(crate) fn rule_any<F>(name: &str, lhs: &[String], conds: Vec<Cond>, build: F) -> Rw
where
    F: Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync + 'static,
{
    let searcher = AnyOf(lhs.iter().map(String::as_str).map(pat).collect());
    let applier = Build { conds, build };
    Rewrite::new(name, searcher, applier).unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// The matches of several patterns, as one searcher.
struct AnyOf(Vec<Pattern<TNode>>);

impl egg::Searcher<TNode, Facts> for AnyOf {
    fn search_eclass_with_limit(
        &self,
        eg: &EG,
        eclass: Id,
        limit: usize,
    ) -> Option<egg::SearchMatches<'_, TNode>> {
        let mut substs = Vec::new();
        for p in &self.0 {
            if substs.len() >= limit {
                break;
            }
            if let Some(m) =
                egg::Searcher::search_eclass_with_limit(p, eg, eclass, limit - substs.len())
            {
                substs.extend(m.substs);
            }
        }
        (!substs.is_empty()).then_some(egg::SearchMatches {
            eclass,
            substs,
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        let mut v: Vec<Var> = self
            .0
            .iter()
            .flat_map(egg::Searcher::<TNode, Facts>::vars)
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The class bound to `v` in `s`, when the matched pattern binds it.
pub(crate) fn bound(s: &Subst, v: &str) -> Option<Id> {
    s.get(var(v)).copied()
}

struct Build<F> {
    conds: Vec<Cond>,
    build: F,
}

impl<F> Applier<TNode, Facts> for Build<F>
where
    F: Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync,
{
    fn apply_one(
        &self,
        eg: &mut EG,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<TNode>>,
        rule: Symbol,
    ) -> Vec<Id> {
        if !self.conds.iter().all(|c| c(eg, subst)) {
            return Vec::new();
        }
        let Some(new) = (self.build)(eg, eclass, subst) else {
            return Vec::new();
        };
        if eg.union(eclass, new) {
            eg.analysis.log.push((rule, eclass));
            vec![eclass]
        } else {
            Vec::new()
        }
    }
}

/// Adds the pattern `ast` under `subst`.
pub(crate) fn instantiate(eg: &mut EG, ast: &PatternAst<TNode>, subst: &Subst) -> Id {
    let mut ids: Vec<Id> = Vec::with_capacity(ast.as_ref().len());
    for node in ast.as_ref() {
        let id = match node {
            egg::ENodeOrVar::Var(v) => subst[*v],
            egg::ENodeOrVar::ENode(n) => {
                let n = n.clone().map_children(|c| ids[usize::from(c)]);
                eg.add(n)
            }
        };
        ids.push(id);
    }
    *ids.last().expect("non-empty pattern")
}

// ---- reading the analysis -------------------------------------------------------------

/// The class of `v` in `s`.
pub(crate) fn at(s: &Subst, v: &str) -> Id {
    s[var(v)]
}

/// The attributes bound to `v` (an attributes leaf).
pub(crate) fn op<'a>(eg: &'a EG, s: &Subst, v: &str) -> Option<&'a Op> {
    attrs_op(eg, at(s, v))
}

/// The attributes leaf class `attrs` as an op.
pub(crate) fn attrs_op(eg: &EG, attrs: Id) -> Option<&Op> {
    eg[eg.find(attrs)].nodes.iter().find_map(|n| match n {
        TNode::Attrs(k) => eg.analysis.ops.get(*k as usize),
        _ => None,
    })
}

/// The `kind` nodes of class `id`: their operand classes (absent ones as the `none` class) and
/// their attributes class.
pub(crate) fn nodes_of<'a>(
    eg: &'a EG,
    id: Id,
    kind: OpKind,
) -> impl Iterator<Item = (Vec<Id>, Id)> + 'a {
    eg[eg.find(id)].nodes.iter().filter_map(move |n| match n {
        TNode::Op { kind: k, args, .. } if k.is(kind) && !args.is_empty() => {
            let (ops, attrs) = args.split_at(args.len() - 1);
            Some((ops.iter().map(|&c| eg.find(c)).collect(), attrs[0]))
        }
        _ => None,
    })
}

/// The first `kind` node of class `id`: its operand classes and its attributes.
pub(crate) fn node_of(eg: &EG, id: Id, kind: OpKind) -> Option<(Vec<Id>, &Op)> {
    nodes_of(eg, id, kind).find_map(|(ops, a)| Some((ops, attrs_op(eg, a)?)))
}

/// The type of the class bound to `v`.
pub(crate) fn ty<'a>(eg: &'a EG, s: &Subst, v: &str) -> Option<&'a Type> {
    eg[at(s, v)].data.ty.as_ref()
}

/// The static shape of `v`'s tensor type, when every dim is known (`None` otherwise).
pub(crate) fn shape_of(eg: &EG, s: &Subst, v: &str) -> Option<Vec<Dim>> {
    ty(eg, s, v)?.shape().map(<[Dim]>::to_vec)
}

/// The dtype of `v`.
pub(crate) fn dtype_of(eg: &EG, s: &Subst, v: &str) -> Option<DType> {
    ty(eg, s, v)?.dtype()
}

/// The elements of `v` when it is a small constant.
pub(crate) fn consts<'a>(eg: &'a EG, s: &Subst, v: &str) -> Option<&'a [f64]> {
    match &eg[at(s, v)].data.konst {
        Konst::Const { vals: Some(v) } => Some(v),
        _ => None,
    }
}

/// The elements of class `id` when it is a small constant.
pub(crate) fn consts_of(eg: &EG, id: Id) -> Option<&[f64]> {
    match &eg[eg.find(id)].data.konst {
        Konst::Const { vals: Some(v) } => Some(v),
        _ => None,
    }
}

/// The smallest element of class `id` when it is a constant whose elements are known or
/// summarized ([`Facts::mins`]); `None` otherwise (or when an element is not finite).
pub(crate) fn min_of(eg: &EG, id: Id) -> Option<f64> {
    let id = eg.find(id);
    if let Konst::Const { vals: Some(v) } = &eg[id].data.konst {
        return v
            .iter()
            .try_fold(f64::INFINITY, |a, &e| e.is_finite().then(|| a.min(e)));
    }
    eg[id].nodes.iter().find_map(|n| match n {
        TNode::Value(v) => eg.analysis.mins.get(v).copied(),
        _ => None,
    })
}

/// Every element of `v` is a finite number above `bound`, as far as constants tell.
pub(crate) fn all_above(eg: &EG, s: &Subst, v: &str, bound: f64) -> bool {
    min_of(eg, at(s, v)).is_some_and(|m| m > bound)
}

/// `v` is known at compile time (constant or computed from constants only).
pub(crate) fn is_const(eg: &EG, s: &Subst, v: &str) -> bool {
    eg[at(s, v)].data.konst.is_const()
}

/// `v` is a small constant whose every element equals `x`.
pub(crate) fn all_eq(eg: &EG, s: &Subst, v: &str, x: f64) -> bool {
    consts(eg, s, v).is_some_and(|c| !c.is_empty() && c.iter().all(|&e| e == x))
}

// ---- conditions -----------------------------------------------------------------------

/// Condition: `f` holds.
pub(crate) fn when<F>(f: F) -> Cond
where
    F: Fn(&EG, &Subst) -> bool + Send + Sync + 'static,
{
    Box::new(f)
}

/// Condition: every element of the small constant `v` equals `x`.
pub(crate) fn is_all(v: &'static str, x: f64) -> Cond {
    when(move |eg, s| all_eq(eg, s, v, x))
}

/// Condition: the target runs `com.microsoft` ops (the rule emits them).
pub(crate) fn for_ort() -> Cond {
    when(|eg, _| eg.analysis.target.runs_domain("com.microsoft"))
}

// ---- building -------------------------------------------------------------------------

/// Adds an op node: `op`'s attributes as a leaf, `inputs` (absent ones as `none`), and the
/// result slots `outs` (bit mask; 1 for a single result).
pub(crate) fn add_op(eg: &mut EG, op: Op, inputs: &[Option<Id>], outs: u32) -> Id {
    let kind = kind_of(&op);
    let k = eg.analysis.intern_op(op);
    let mut args: Vec<Id> = inputs
        .iter()
        .map(|i| match i {
            Some(i) => *i,
            None => eg.add(TNode::None),
        })
        .collect();
    args.push(eg.add(TNode::Attrs(k)));
    eg.add(TNode::Op { kind, outs, args })
}

/// [`add_op`] for a one-result node whose result the IR's inference types from the operands'
/// class types (and the contents of small integer constants), as it types an imported node; a
/// result it cannot type stays untyped.
pub(crate) fn add_typed(eg: &mut EG, op: Op, inputs: &[Option<Id>]) -> Id {
    let types: Vec<Type> = inputs
        .iter()
        .map(|i| {
            i.and_then(|i| eg[i].data.ty.clone())
                .unwrap_or(Type::Unknown)
        })
        .collect();
    let vals: Vec<Option<Vec<Dim>>> = inputs
        .iter()
        .zip(&types)
        .map(|(i, t)| {
            let integer = t
                .dtype()
                .is_some_and(|d| matches!(d, DType::I64 | DType::I32));
            match &eg[(*i)?].data.konst {
                Konst::Const { vals: Some(v) }
                    if integer && v.len() <= mmq_ir::infer::MAX_SHAPE_VALUE_LEN =>
                {
                    Some(v.iter().map(|&x| Dim::known(x as i64)).collect())
                }
                _ => None,
            }
        })
        .collect();
    // Stand-in operand handles: inference reads the operands from `types` and `vals` only.
    let node = mmq_ir::NodeData {
        op: op.clone(),
        inputs: inputs
            .iter()
            .enumerate()
            .map(|(k, i)| i.map(|_| mmq_ir::Value::from_index(k)))
            .collect(),
        outputs: vec![None],
        name: None,
        graph: mmq_ir::GraphId::from_index(0),
    };
    let operands = mmq_ir::infer::Operands {
        types: &types,
        vals: &vals,
    };
    let inferred = mmq_ir::infer::infer_node_types(
        &mmq_ir::Module::default(),
        &node,
        eg.analysis.opset,
        &operands,
    );
    let id = add_op(eg, op, inputs, 1);
    if let Some(t) = inferred
        .into_iter()
        .next()
        .filter(|t| !matches!(t, Type::Unknown))
    {
        set_ty(eg, id, t);
    }
    id
}

/// Result `i` of a multi-result node.
pub(crate) fn get(eg: &mut EG, tuple: Id, i: u32) -> Id {
    eg.add(TNode::Get(i, [tuple]))
}

/// Adds a literal constant (`None` when the dtype cannot hold the values).
pub(crate) fn lit(eg: &mut EG, dtype: DType, shape: Vec<i64>, vals: &[f64]) -> Option<Id> {
    let c = literal(dtype, shape, vals)?;
    let k = eg.analysis.intern_lit(c);
    Some(eg.add(TNode::Lit(k)))
}

/// Sets the type of a class (used for nodes rules build whose type they know).
pub(crate) fn set_ty(eg: &mut EG, id: Id, t: Type) {
    let id = eg.find(id);
    if eg[id].data.ty.is_none() {
        eg[id].data.ty = Some(t);
    }
}
