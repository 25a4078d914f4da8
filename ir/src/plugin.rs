//! The TensorRT plugins mmq emits for what TensorRT's own layers cannot express: their names,
//! version, namespace, fields, inputs and outputs. One table serves the `trt` target's lowering
//! (which nodes become plugins), the reference interpreter (which runs them on the CPU, so a
//! plugin network runs under `mmq run`), the package manifest and the linter; the C++ creators in
//! `backend-trt/plugins/` declare the same fields, which the plugin harness checks.
//!
//! A plugin node is an ONNX node of domain [`DOMAIN`] whose `op_type` is the plugin's name, with
//! the attributes `plugin_namespace` ([`NAMESPACE`]) and `plugin_version` ([`VERSION`]) that
//! TensorRT's ONNX parser uses to find the creator, and one attribute per field (the parser passes
//! the other attributes to the creator as plugin fields).

/// The ONNX domain of plugin nodes.
pub const DOMAIN: &str = "mmq.trt";
/// The plugin namespace (`plugin_namespace` attribute, `getPluginNamespace()`).
pub const NAMESPACE: &str = "mmq";
/// The plugin version (`plugin_version` attribute, `getPluginVersion()`).
pub const VERSION: &str = "1";

/// One field of a plugin (an ONNX `INT` attribute; TensorRT passes it as `kINT32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The attribute's name.
    pub name: &'static str,
    /// The value when the node does not set it.
    pub default: i64,
    /// What it sets.
    pub what: &'static str,
}

/// A plugin: what it computes and its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schema {
    /// The plugin's name (the node's `op_type`).
    pub name: &'static str,
    /// What it computes.
    pub what: &'static str,
    /// Why TensorRT's own layers cannot do it.
    pub why: &'static str,
    /// Its fields, in order.
    pub fields: &'static [Field],
    /// Inputs in order, as `name: types`.
    pub inputs: &'static [&'static str],
    /// Outputs in order, as `name: types`.
    pub outputs: &'static [&'static str],
}

const AXIS: Field = Field {
    name: "axis",
    default: 1,
    what: "the quantization axis of per-axis and blocked scales",
};
const BLOCK: Field = Field {
    name: "block_size",
    default: 0,
    what: "elements per scale along the axis (0: per tensor or per axis); blocks only along the last axis",
};

const QDQ_WHY: &str = "TensorRT's Q/DQ layers are symmetric (zero points 0) and take activation scales per tensor only";

/// Every plugin mmq emits.
pub const PLUGINS: [Schema; 4] = [
    Schema {
        name: "MmqQuantize",
        what: "QuantizeLinear to int8 with zero points (asymmetric), per tensor, per axis or in blocks; round half to even, saturating",
        why: QDQ_WHY,
        fields: &[AXIS, BLOCK],
        inputs: &[
            "x: float32|float16",
            "scale: float32",
            "zero_point: int8 (optional)",
        ],
        outputs: &["y: int8"],
    },
    Schema {
        name: "MmqDequantize",
        what: "DequantizeLinear of int8 with zero points (asymmetric): (q - zero_point) * scale, per tensor, per axis or in blocks (per row after MmqDynamicQuantize)",
        why: QDQ_WHY,
        fields: &[AXIS, BLOCK],
        inputs: &["q: int8", "scale: float32", "zero_point: int8 (optional)"],
        outputs: &["y: float32"],
    },
    Schema {
        name: "MmqDynamicQuantize",
        what: "run-time int8 quantization in blocks along the last axis, each with its symmetric scale absmax / 127 (a block of zeros gets scale 1): per-token activations (one block per row) and KV-cache writes (blocks of 512 codes)",
        why: "TensorRT quantizes activations per tensor with constant scales; per-token and per-block scales are computed at run time",
        fields: &[Field {
            name: "block_size",
            default: 0,
            what: "elements per scale along the last axis (0: the whole row)",
        }],
        inputs: &["x: float32|float16"],
        outputs: &[
            "q: int8",
            "scale: float32 (the input's shape with the last dim ceil(last / block_size), 1 per row)",
        ],
    },
    Schema {
        name: "MmqMatMulNBits",
        what: "A · dequant(B)ᵀ (+ bias) with B 4-bit in blocks along K with binary16 scales and zero points (ONNX Runtime's MatMulNBits layout)",
        why: "TensorRT's blockwise INT4 DequantizeLinear takes no zero points",
        fields: &[
            Field {
                name: "K",
                default: 0,
                what: "the inner dimension",
            },
            Field {
                name: "N",
                default: 0,
                what: "the output features",
            },
            Field {
                name: "bits",
                default: 4,
                what: "bits per code (4)",
            },
            Field {
                name: "block_size",
                default: 0,
                what: "codes per scale along K (16..=256, a power of two dividing K)",
            },
        ],
        inputs: &[
            "A: float16 [..., K]",
            "B: uint8 [N, K / block_size, block_size / 2]",
            "scales: float16 [N, K / block_size] (or flat)",
            "zero_points: uint8 [N, ceil(K / block_size / 2)]",
            "bias: float16 [N] (optional)",
        ],
        outputs: &["Y: float16 [..., N]"],
    },
];

/// The plugin named `op_type`.
pub fn schema(op_type: &str) -> Option<&'static Schema> {
    PLUGINS.iter().find(|s| s.name == op_type)
}

#[cfg(test)]
mod tests {
    use crate::{Attr, Op};

    use super::{DOMAIN, PLUGINS};

    /// The IR's op table types every plugin node with the plugin's fields after the two
    /// attributes TensorRT's parser reads, and agrees with each default it gives.
    #[test]
    fn the_op_table_models_every_plugin_with_its_fields() {
        for s in &PLUGINS {
            let names = Op::attr_names(DOMAIN, s.name).unwrap_or_else(|| panic!("{}", s.name));
            let mut want = vec!["plugin_namespace", "plugin_version"];
            want.extend(s.fields.iter().map(|f| f.name));
            assert_eq!(names, want, "{}", s.name);
            for f in s.fields {
                if let Some(d) = Op::attr_default(DOMAIN, s.name, f.name) {
                    assert_eq!(d, Attr::Int(f.default), "{}.{}", s.name, f.name);
                }
            }
        }
    }
}
