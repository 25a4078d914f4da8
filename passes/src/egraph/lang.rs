//! The e-graph language: IR ops with their operands as children and their attributes as a
//! leaf child.

use std::cmp::Ordering;
use std::fmt;

use egg::{FromOp, Id, Language, Symbol};
use mmq_ir::OpKind;

use crate::targets::OpName;

/// One e-node.
///
/// `Op` children are the operands in order (absent optional operands are a [`TNode::None`]
/// leaf) followed by one [`TNode::Attrs`] leaf holding the op's attributes, so a pattern binds
/// them as a variable (`(Conv ?x ?w ?a)`) and conditions read them. A node with more than one
/// result slot (`outs` is a bit mask of the slots it has) is a tuple whose results are
/// `(get.N tuple)`; a node whose only slot is result 0 is its result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TNode {
    /// An op application.
    Op {
        /// What op it applies.
        kind: Key,
        /// Bit mask of the result slots the node has.
        outs: u32,
        /// Operands, then the attributes leaf.
        args: Vec<Id>,
    },
    /// Result `N` of a multi-result node.
    Get(u32, [Id; 1]),
    /// A value the e-graph does not define: graph input, constant or outer-scope value
    /// (the index of its [`mmq_ir::Value`]).
    Value(u32),
    /// An attribute set (index into [`super::Facts`]'s op table).
    Attrs(u32),
    /// A small constant made by a rule (index into [`super::Facts`]'s literal table).
    Lit(u32),
    /// An absent optional operand.
    None,
    /// The graph outputs (and values that subgraphs read), tying the DAG to one root.
    Root(Vec<Id>),
}

/// What [`Language::matches`] compares.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Disc {
    Op(Key, u32, usize),
    Get(u32),
    Value(u32),
    Attrs(u32),
    Lit(u32),
    None,
    Root(usize),
}

impl TNode {
    fn rank(&self) -> u8 {
        match self {
            TNode::Op { .. } => 0,
            TNode::Get(..) => 1,
            TNode::Value(_) => 2,
            TNode::Attrs(_) => 3,
            TNode::Lit(_) => 4,
            TNode::None => 5,
            TNode::Root(_) => 6,
        }
    }
}

// Ordered by the op name's text, not the interned symbol's index, so that the order of nodes
// inside an e-class does not depend on what else the process interned first.
impl Ord for TNode {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (
                TNode::Op { kind, outs, args },
                TNode::Op {
                    kind: k2,
                    outs: o2,
                    args: a2,
                },
            ) => kind
                .cmp_text(k2)
                .then(outs.cmp(o2))
                .then_with(|| args.cmp(a2)),
            (TNode::Get(i, a), TNode::Get(j, b)) => i.cmp(j).then(a.cmp(b)),
            (TNode::Value(a), TNode::Value(b))
            | (TNode::Attrs(a), TNode::Attrs(b))
            | (TNode::Lit(a), TNode::Lit(b)) => a.cmp(b),
            (TNode::Root(a), TNode::Root(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for TNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Language for TNode {
    type Discriminant = Disc;

    fn discriminant(&self) -> Disc {
        match self {
            TNode::Op { kind, outs, args } => Disc::Op(*kind, *outs, args.len()),
            TNode::Get(i, _) => Disc::Get(*i),
            TNode::Value(v) => Disc::Value(*v),
            TNode::Attrs(a) => Disc::Attrs(*a),
            TNode::Lit(l) => Disc::Lit(*l),
            TNode::None => Disc::None,
            TNode::Root(c) => Disc::Root(c.len()),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        self.discriminant() == other.discriminant()
    }

    fn children(&self) -> &[Id] {
        match self {
            TNode::Op { args, .. } => args,
            TNode::Get(_, a) => a,
            TNode::Root(c) => c,
            _ => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            TNode::Op { args, .. } => args,
            TNode::Get(_, a) => a,
            TNode::Root(c) => c,
            _ => &mut [],
        }
    }
}

impl fmt::Display for TNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TNode::Op { kind, outs: 1, .. } => write!(f, "{kind}"),
            TNode::Op { kind, outs, .. } => write!(f, "{kind}/{outs}"),
            TNode::Get(i, _) => write!(f, "get.{i}"),
            TNode::Value(v) => write!(f, "value.{v}"),
            TNode::Attrs(a) => write!(f, "attrs.{a}"),
            TNode::Lit(l) => write!(f, "lit.{l}"),
            TNode::None => write!(f, "none"),
            TNode::Root(_) => write!(f, "root"),
        }
    }
}

/// A pattern operator the language does not know.
#[derive(Debug)]
pub(crate) struct BadOp(pub String);

impl fmt::Display for BadOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown pattern operator '{}'", self.0)
    }
}

impl FromOp for TNode {
    type Error = BadOp;

    /// `none`, `get.N`, `root`, `Kind` (one result) and `Kind/MASK` (result slots as a bit mask).
    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, BadOp> {
        if op == "none" && children.is_empty() {
            return Ok(TNode::None);
        }
        if op == "root" {
            return Ok(TNode::Root(children));
        }
        if let Some(i) = op.strip_prefix("get.") {
            let i = i.parse().map_err(|_| BadOp(op.into()))?;
            let [c] = <[Id; 1]>::try_from(children).map_err(|_| BadOp(op.into()))?;
            return Ok(TNode::Get(i, [c]));
        }
        if children.is_empty() || op.is_empty() {
            // Every op node has at least its attributes leaf.
            return Err(BadOp(op.into()));
        }
        let (kind, outs) = match op.split_once('/') {
            Some((k, m)) => (k, m.parse().map_err(|_| BadOp(op.into()))?),
            None => (op, 1),
        };
        Ok(TNode::Op {
            kind: Key::parse(kind),
            outs,
            args: children,
        })
    }
}

/// What an op e-node applies: a kind of the op table, or an op the table does not model (by its
/// `domain.op_type`, or `op_type` in the default domain). Patterns and the printed e-graph
/// spell a kind the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// A modeled op.
    Kind(OpKind),
    /// Any other op.
    Custom(Symbol),
}

impl Key {
    /// The key of `op_type` in `domain`.
    pub(crate) fn of(domain: &str, op_type: &str) -> Key {
        match OpKind::of(domain, op_type) {
            OpKind::Custom => Key::Custom(Symbol::from(match domain {
                "" | "ai.onnx" => op_type.to_owned(),
                d => format!("{d}.{op_type}"),
            })),
            k => Key::Kind(k),
        }
    }

    /// The key a pattern spells `text` (`op_type`, or `domain.op_type`).
    pub(crate) fn parse(text: &str) -> Key {
        match text.rsplit_once('.') {
            Some((domain, op_type)) => Key::of(domain, op_type),
            None => Key::of("", text),
        }
    }

    /// The op table's kind ([`OpKind::Custom`] for an op it does not model).
    pub(crate) fn kind(self) -> OpKind {
        match self {
            Key::Kind(k) => k,
            Key::Custom(_) => OpKind::Custom,
        }
    }

    /// Whether the key is `kind`.
    pub(crate) fn is(self, kind: OpKind) -> bool {
        self == Key::Kind(kind)
    }

    /// The op as a target prices it.
    pub(crate) fn name(&self) -> OpName<'_> {
        match self {
            Key::Kind(k) => OpName::of(*k),
            Key::Custom(s) => {
                let (domain, op_type) = s.as_str().rsplit_once('.').unwrap_or(("", s.as_str()));
                OpName {
                    kind: OpKind::Custom,
                    domain,
                    op_type,
                }
            }
        }
    }

    /// The text, in pieces: `[domain, ".", op_type]`, or the custom op's text.
    fn parts(&self) -> [&str; 3] {
        match self {
            Key::Kind(k) if k.domain().is_empty() => ["", "", k.op_type()],
            Key::Kind(k) => [k.domain(), ".", k.op_type()],
            Key::Custom(s) => [s.as_str(), "", ""],
        }
    }

    /// Orders by the text, so that the order of nodes inside an e-class does not depend on
    /// the op table's order or on what the process interned first.
    fn cmp_text(&self, other: &Key) -> Ordering {
        if self == other {
            return Ordering::Equal;
        }
        let (a, b) = (self.parts(), other.parts());
        a.into_iter()
            .flat_map(str::bytes)
            .cmp(b.into_iter().flat_map(str::bytes))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.parts().iter().try_for_each(|p| f.write_str(p))
    }
}

/// The e-graph key of an op.
pub(crate) fn kind_of(op: &mmq_ir::Op) -> Key {
    Key::of(op.domain(), op.op_type())
}
