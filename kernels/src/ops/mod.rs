//! Kernels, one module per op family. Each family's `eval` returns `None` for ops it does not
//! handle; [`eval`] tries them in turn.

mod contrib;
mod control;
pub(crate) mod data;
mod elementwise;
mod linalg;
pub mod quant;
mod shape;
pub(crate) mod util;

use mmq_ir::{GraphId, NodeData};

use crate::error::KernelError;
use crate::interp::{Env, Interpreter};
use crate::tensor::RtValue;

/// The result of a kernel: one entry per node output (`None` for an omitted optional output).
pub type OpResult = Result<Vec<Option<RtValue>>, KernelError>;

/// What a kernel sees besides its operands.
pub struct OpCtx<'a> {
    /// The interpreter (constants, nested graphs).
    pub interp: &'a Interpreter<'a>,
    /// The node being run.
    pub node: &'a NodeData,
    /// The default-domain opset of the model (semantics differ between opsets).
    pub opset: i64,
    /// The scope of the running graph, for subgraphs.
    pub env: &'a Env<'a>,
}

impl OpCtx<'_> {
    /// `name (Op)` for messages.
    pub fn label(&self) -> String {
        match &self.node.name {
            Some(n) if !n.is_empty() => format!("node '{n}' ({})", self.node.op.op_type()),
            _ => format!("{} node", self.node.op.op_type()),
        }
    }

    /// An "unsupported" error at this node.
    pub fn unsupported(&self, message: impl Into<String>) -> KernelError {
        KernelError::Unsupported {
            node: self.label(),
            message: message.into(),
        }
    }

    /// An "invalid operands" error at this node.
    pub fn invalid(&self, message: impl Into<String>) -> KernelError {
        KernelError::Invalid {
            node: self.label(),
            message: message.into(),
        }
    }

    /// Runs a nested graph (a body of `If`, `Loop`, `Scan`) in the current scope.
    pub fn run_graph(
        &self,
        g: GraphId,
        inputs: Vec<Option<RtValue>>,
    ) -> Result<Vec<RtValue>, KernelError> {
        self.interp.run_graph(g, inputs, self.env)
    }

    /// Number of outputs the node declares (including omitted optional ones).
    pub fn num_outputs(&self) -> usize {
        self.node.outputs.len()
    }
}

/// Runs one node.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    type Family = fn(&OpCtx<'_>, &[Option<RtValue>]) -> Option<OpResult>;
    const FAMILIES: [Family; 6] = [
        contrib::eval,
        elementwise::eval,
        linalg::eval,
        shape::eval,
        quant::eval,
        control::eval,
    ];
    for family in FAMILIES {
        if let Some(result) = family(cx, inputs) {
            return result;
        }
    }
    let op = &cx.node.op;
    let name = match op.domain() {
        "" => op.op_type().to_owned(),
        d => format!("{d}.{}", op.op_type()),
    };
    Err(cx.unsupported(format!("op {name} is not implemented by the interpreter")))
}
