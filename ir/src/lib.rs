//! The mmq intermediate representation.
//!
//! A [`Module`] holds dimension symbols, interned types, constants, and one or more graphs. Every
//! entity is a typed `u32` handle into an append-only arena ([`Value`], [`Node`], [`Const`],
//! [`GraphId`], [`Sym`], [`Ty`]); analyses keep their results in side tables
//! ([`arena::SecondaryMap`]) keyed by those handles, never in the IR.
//!
//! # Invariants of a valid module (checked by [`verify`])
//! - A graph lists its nodes in topological order: every operand of a node is a graph input, a
//!   constant, a result of an earlier node in the same graph, or a value visible in an enclosing
//!   graph (ONNX outer-scope references from `If`/`Loop`/`Scan` bodies).
//! - Every value has exactly one definition ([`ValueDef`]) and that definition agrees with the
//!   graph input list or node result list that holds the value.
//! - Names of values are unique within a top-level graph and its subgraphs where they are set.
//! - Subgraphs are referenced from exactly one node attribute, and their `parent` is that node.
//!
//! # Dims
//! A [`Dim`] is unknown or a canonical [`DimExpr`] (see [`dim`]). Two dims are provably equal
//! only when their canonical forms are equal; `==` is that structural comparison and never
//! runs a simplifier.
//!
//! # Ops
//! [`Op`] is a closed enum named after ONNX operators with typed optional attributes; ONNX
//! semantics at the module's default-domain opset apply. [`Op::Custom`] keeps everything else.

pub mod alloc;
pub mod arena;
pub mod attr;
pub mod constant;
pub mod diag;
pub mod dim;
pub mod dtype;
pub mod edit;
pub mod einsum;
pub mod fsio;
pub mod infer;
pub mod modality;
pub mod module;
pub mod op;
pub mod plugin;
pub mod text;
pub mod types;
pub mod verify;
pub mod view;

pub use arena::{Arena, EntityRef, SecondaryMap};
pub use attr::{Attr, AttrValue};
pub use constant::{Const, ConstData, ExternalFile, Storage};
pub use diag::{Entity, IrError, Severity, UnknownName};
pub use dim::{Dim, DimExpr, Sym, SymbolData};
pub use dtype::DType;
pub use fsio::{check_output_file, check_regular_file};
pub use module::{
    At, Entry, GraphData, GraphId, Link, ModelInfo, Module, Node, NodeData, Value, ValueData,
    ValueDef,
};
pub use op::{Arity, CustomOp, Op, OpKind, OpProperty};
pub use types::{TensorType, Ty, Type, TypeTable};
