//! The plugin library of a package: which of mmq's plugins ([`mmq_ir::plugin`]) the models
//! use and on which nodes, and the sources written to `plugins/` (the IPluginV3 classes, their
//! launchers, the CUDA kernels of `kernels/cuda` they launch, `build.sh` and `CMakeLists.txt`)
//! from which `build.sh` makes `libmmq_plugins.so` with nvcc.

use std::collections::BTreeMap;

use mmq_ir::Module;
use mmq_ir::plugin::{self, DOMAIN};

/// The sources of the plugin library, as written to `plugins/`: (file name, text, executable).
pub const SOURCES: [(&str, &str, bool); 9] = [
    (
        "mmq_plugins.cpp",
        include_str!("../plugins/mmq_plugins.cpp"),
        false,
    ),
    (
        "mmq_launch.h",
        include_str!("../plugins/mmq_launch.h"),
        false,
    ),
    (
        "mmq_launch.cu",
        include_str!("../plugins/mmq_launch.cu"),
        false,
    ),
    ("build.sh", include_str!("../plugins/build.sh"), true),
    (
        "CMakeLists.txt",
        include_str!("../plugins/CMakeLists.txt"),
        false,
    ),
    (
        "quantize.cu",
        include_str!("../../kernels/cuda/quantize.cu"),
        false,
    ),
    (
        "nbits.cu",
        include_str!("../../kernels/cuda/nbits.cu"),
        false,
    ),
    (
        "mmq_blocks.cuh",
        include_str!("../../kernels/cuda/mmq_blocks.cuh"),
        false,
    ),
    (
        "mmq_quant.cuh",
        include_str!("../../kernels/cuda/mmq_quant.cuh"),
        false,
    ),
];

/// The library `build.sh` writes, relative to the package.
pub const LIBRARY: &str = "plugins/libmmq_plugins.so";

/// The SM versions `build.sh` compiles SASS for by default (PTX for the last).
pub const SMS: [u32; 3] = [80, 89, 90];

/// The nodes of each plugin the module's entry graphs (and their subgraphs) use, by plugin name.
pub fn uses(m: &Module) -> BTreeMap<&'static str, Vec<String>> {
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for e in &m.entries {
        for g in m.graph_tree(e.graph) {
            for &n in m.graphs[g].nodes() {
                let op = &m.nodes[n].op;
                if op.domain() != DOMAIN {
                    continue;
                }
                if let Some(s) = plugin::schema(op.op_type()) {
                    out.entry(s.name).or_default().push(
                        m.nodes[n]
                            .name
                            .clone()
                            .unwrap_or_else(|| format!("<unnamed {}>", s.name)),
                    );
                }
            }
        }
    }
    out
}

/// The manifest's `plugins` list: per plugin used, its schema, why TensorRT needs it and the
/// nodes that use it.
pub fn manifest(uses: &BTreeMap<&'static str, Vec<String>>) -> serde_json::Value {
    uses.iter()
        .filter_map(|(name, nodes)| {
            let s = plugin::schema(name)?;
            Some(serde_json::json!({
                "name": s.name,
                "namespace": plugin::NAMESPACE,
                "version": plugin::VERSION,
                "onnx_domain": DOMAIN,
                "interface": "IPluginV3 (IPluginV3OneCore, IPluginV3OneBuild, IPluginV3OneRuntime)",
                "what": s.what,
                "why": s.why,
                "fields": s.fields.iter().map(|f| serde_json::json!({
                    "name": f.name,
                    "type": "int32",
                    "default": f.default,
                    "what": f.what,
                })).collect::<Vec<_>>(),
                "inputs": s.inputs,
                "outputs": s.outputs,
                "nodes": nodes,
                "library": LIBRARY,
            }))
        })
        .collect()
}
