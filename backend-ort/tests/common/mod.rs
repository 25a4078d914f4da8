//! Helpers shared by the export tests: small modules built with the IR API.

#![allow(dead_code, reason = "each test file uses a different subset")]

use bytes::Bytes;
use mmq_backend_ort::proto;
use mmq_ir::{
    ConstData, DType, Dim, Entry, GraphId, ModelInfo, Module, Node, Op, Storage, Type, Value,
};
use prost::Message;

/// A module with one top-level graph named `name` and model facts for opset 21.
pub fn module(name: &str) -> (Module, GraphId) {
    let mut m = Module::new();
    let g = m.add_graph(name, None);
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo {
            ir_version: 10,
            opsets: vec![(String::new(), 21)],
            producer_name: "source-tool".to_owned(),
            producer_version: "9.9".to_owned(),
            domain: "ai.example".to_owned(),
            model_version: 3,
            doc: "model doc".to_owned(),
            metadata: vec![("author".to_owned(), "someone".to_owned())],
            ..Default::default()
        },
    });
    (m, g)
}

/// Little-endian bytes of `values`.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An f32 constant with inline data.
pub fn f32_const(name: Option<&str>, shape: Vec<i64>, values: &[f32]) -> ConstData {
    ConstData::new(
        name.map(str::to_owned),
        DType::F32,
        shape,
        Storage::Inline(Bytes::from(f32_bytes(values))),
    )
}

/// An f32 tensor type with the given dims.
pub fn f32_ty(dims: Vec<Dim>) -> Type {
    Type::tensor(DType::F32, dims)
}

/// Adds a one-result node and returns its result.
pub fn unary(
    m: &mut Module,
    g: GraphId,
    op: Op,
    inputs: Vec<Value>,
    out: Option<&str>,
    ty: Type,
) -> Value {
    let n = m.add_node(
        g,
        op,
        inputs.into_iter().map(Some).collect(),
        vec![Some((out.map(str::to_owned), ty))],
        None,
    );
    m.nodes[n].outputs[0].expect("one result")
}

/// An `If` node in `g` on `cond` with one result (`result` named, typed `ty`) and two empty
/// branch graphs whose parent it is; returns the node, the result and the branches.
pub fn if_node(
    m: &mut Module,
    g: GraphId,
    cond: Value,
    result: &str,
    ty: Type,
    name: Option<&str>,
) -> (Node, Value, GraphId, GraphId) {
    let then_g = m.add_graph("then", None);
    let else_g = m.add_graph("else", None);
    let n = m.add_node(
        g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(cond)],
        vec![Some((Some(result.into()), ty))],
        name.map(Into::into),
    );
    m.graphs[then_g].parent = Some(n);
    m.graphs[else_g].parent = Some(n);
    let y = m.nodes[n].outputs[0].expect("If result");
    (n, y, then_g, else_g)
}

/// Decodes a model file.
pub fn read_model(path: &std::path::Path) -> proto::ModelProto {
    let bytes = std::fs::read(path).expect("model file is readable");
    proto::ModelProto::decode(bytes.as_slice()).expect("model file decodes")
}

/// The names of the entries of `dir`, sorted.
pub fn dir_entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("directory is readable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
