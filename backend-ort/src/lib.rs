//! ONNX Runtime backend: writes one top-level graph of a [`mmq_ir::Module`] as an ONNX model.
//!
//! [`to_model_proto`] builds the protobuf message; [`write_model`] builds it and writes the
//! `.onnx` file (and, for large or already external weights, a `<name>.data` file beside it)
//! atomically.
//!
//! # What the exported model looks like
//! - `producer_name` is `mmq`; IR version, opsets, domain, model version, documentation and
//!   metadata come from the module's [`mmq_ir::ModelInfo`]. The IR version is raised when the
//!   opsets or element types need a newer one, and every operator domain used by a node is
//!   imported (version 1 when the source did not import it). Model-local functions are written
//!   back as the source had them.
//! - Nodes keep their order, names, op types, domains and attributes. Subgraphs (`If`, `Loop`,
//!   `Scan` bodies, custom-op graphs) are exported recursively.
//! - A value keeps its source name when no value exported before it took that name; every other
//!   value gets a generated name (`mmq_v0`, `mmq_v1`, ...) that collides with no source name in
//!   the module. Top-level inputs and outputs claim their names first. Omitted optional operands
//!   and results are `""`.
//! - Every constant used as an operand becomes an initializer of the innermost graph that holds
//!   all its uses: the top-level graph for a constant it reads, an `If` branch or `Loop` body
//!   for a weight only that subgraph reads (nested subgraphs see it as an outer-scope value).
//!   Subgraph initializers need IR 4. A graph input with a default gets an initializer of the
//!   same name in its own graph.
//! - Graph inputs and outputs always carry a type (`elem_type` 0 and no shape when unknown);
//!   intermediate values whose type is known are listed in `value_info`. Symbolic dims become
//!   `dim_param` strings (`past + seq`); unknown dims have neither `dim_value` nor `dim_param`.
//! - Tensor data is `raw_data` (exactly the IR's little-endian bytes) or `string_data`; an
//!   [`ExternalSink`] may store it in an external data file instead.

mod error;
mod export;
mod external;
mod write;

/// The ONNX protobuf messages this backend produces.
pub use mmq_onnx::proto::onnx as proto;

pub use error::ExportError;
pub use export::to_model_proto;
pub use external::{DataFileSink, ExternalLocation, ExternalSink, InlineSink};
pub use write::{
    AUTO_EXTERNAL_ABOVE, ExportOptions, ExternalData, MAX_SUBGRAPH_DEPTH, PROTOBUF_LIMIT,
    StemClash, WriteReport, check_distinct_stems, entry_stems, write_model,
};
