//! ONNX Runtime's CPU provider: the standard ops plus the `com.microsoft` contrib ops it runs,
//! with costs and rates measured on it.

pub mod decode_forms;
pub mod gqa;
pub mod load_forms;

use std::collections::{HashMap, HashSet};

use mmq_ir::{Attr, Module, Op, OpKind, Value};

use super::{Int4Rates, OpName, PlaceRates, QdqRules, Target, standard_cost};
use crate::quant::fp16::Fp16Form;

/// The ONNX Runtime target.
#[derive(Clone, Copy, Debug)]
pub struct Ort;

/// ONNX Runtime's CPU provider on one x86-64 core without VNNI, fitted to single-product
/// timings (`tools/place_rates.py`: float `MatMul` against `Q → MatMulIntegerToFloat` for M×K×N
/// from 17×32×32 to 512×768×768, the fixed costs from the smallest, the rates from the slopes):
/// integer products win from about 64×64×256 up and lose at 64×64×64 and below.
pub const CPU_RATES: PlaceRates = PlaceRates {
    kernel: 1.5,
    int_kernel: 3.5,
    q_kernel: 2.5,
    float_mac: 1.0 / 60_000.0,
    int_mac: 1.0 / 150_000.0,
    element: 1.0 / 2_000.0,
    absorbed: 0.05,
};

/// `MatMul` against `MatMulNBits` (4 bits, symmetric blocks of 32, `accuracy_level` 4) on the CPU
/// provider, one thread (`tools/place_rates.py`, onnxruntime 1.32, 2-core x86-64 with AVX-512):
/// INT4 reads a weight nine times faster and multiplies 1.7 times slower, so it wins up to
/// about 17 rows (a decode step: 0.26x to 0.29x of float) and loses from there (an encoder's 257
/// tokens: 1.6x).
pub const CPU_INT4_RATES: Int4Rates = Int4Rates {
    float_kernel: 5.36,
    float_weight: 1.0 / 7_171.0,
    float_mac: 1.0 / 98_089.0,
    nbits_kernel: 9.49,
    nbits_weight: 1.0 / 67_062.0,
    nbits_mac: 1.0 / 58_266.0,
};

/// How many operands read each value of `m` (in every graph), and the values that are graph
/// outputs.
fn readers(m: &Module) -> (HashMap<Value, usize>, HashSet<Value>) {
    let mut readers: HashMap<Value, usize> = HashMap::new();
    let mut outputs: HashSet<Value> = HashSet::new();
    for (_, g) in m.graphs.iter() {
        outputs.extend(g.outputs.iter().copied());
        for &n in g.nodes() {
            for &v in m.nodes[n].inputs.iter().flatten() {
                *readers.entry(v).or_default() += 1;
            }
        }
    }
    (readers, outputs)
}

/// A `com.microsoft` op.
fn contrib(op_type: &str, attrs: Vec<(&str, Attr)>) -> Op {
    Op::from_parts(
        "com.microsoft",
        op_type,
        attrs.into_iter().map(|(k, a)| (k.into(), a)).collect(),
    )
}

fn contrib_cost(op: OpKind) -> f64 {
    use OpKind as K;
    match op {
        K::FusedConv | K::FusedMatMul | K::FusedGemm => 20.0,
        // Measured slower than the `Add` (+ bias `Add`) and norm they replace on ONNX Runtime's
        // CPU provider when the sum feeds the next block, as in every residual stream (which
        // ONNX Runtime's own fusion leaves alone): SkipLayerNormalization 1.06x at 17 x 32,
        // 5x at 197 x 768, 4.5x at 512 x 4096; SkipSimplifiedLayerNormalization 0.95x to 1.56x
        // (`tools/norm_rates.py`). SkipLayerNormalization is never extracted: costed above
        // `Add + Add + norm`, extraction still picked it where the sum is shared (a ViT's
        // blocks: 1.024x the original's latency with it, 0.979x without). Its simplified form,
        // faster at small sizes, is costed above the ops it replaces.
        K::SkipLayerNormalization => f64::INFINITY,
        K::SkipSimplifiedLayerNormalization => 14.0,
        K::MsGelu | K::FastGelu | K::BiasGelu | K::QuickGelu => 4.0,
        K::MsRotaryEmbedding => 4.0,
        K::MultiHeadAttention | K::GroupQueryAttention => 20.0, // two products and a softmax, costed as one product
        K::MsAttention => 36.0,
        _ => 10.0,
    }
}

/// ONNX Runtime's QDQ forms: asymmetric u8 activations, 7-bit weights (see
/// `Int8Pass::reduce_range`), int32 Conv bias for `QLinearConv`, cost-model placement, dynamic
/// quantization and `MatMulNBits`.
pub const QDQ: QdqRules = QdqRules {
    symmetric_activations: false,
    reduce_range: true,
    int32_conv_bias: true,
    quantize_all: false,
    dynamic_activations: true,
    int4_matmul_nbits: true,
    cache_io: true,
    plugins: false,
};

impl Target for Ort {
    fn name(&self) -> &'static str {
        "ort"
    }

    fn runs_domain(&self, domain: &str) -> bool {
        matches!(domain, "" | "ai.onnx" | "com.microsoft")
    }

    fn op_cost(&self, op: OpName<'_>) -> f64 {
        match op.domain {
            "com.microsoft" => contrib_cost(op.kind),
            _ if op.is_standard() => standard_cost(op.kind),
            _ => f64::INFINITY,
        }
    }

    /// `com.microsoft.Gelu` / `FastGelu` at any opset (ONNX Runtime fuses them itself).
    fn gelu(&self, approximate: bool, _opset: i64) -> Option<Op> {
        Some(contrib(
            if approximate { "FastGelu" } else { "Gelu" },
            vec![],
        ))
    }

    /// `SimplifiedLayerNormalization`, which ONNX Runtime registers in the default domain.
    fn rms_norm(&self, epsilon: f32, _opset: i64) -> Option<Op> {
        Some(Op::SimplifiedLayerNormalization {
            axis: Some(-1),
            epsilon: Some(epsilon),
            stash_type: Some(1),
        })
    }

    fn place_rates(&self) -> &'static PlaceRates {
        &CPU_RATES
    }

    fn int4_rates(&self) -> Option<&'static Int4Rates> {
        Some(&CPU_INT4_RATES)
    }

    /// A residual `Add` read by a `LayerNormalization` alone becomes a `Sum`, so that ONNX
    /// Runtime does not fuse the pair into its slower `SkipLayerNormalization`
    /// ([`load_forms`]).
    fn load_forms(&self) -> Option<Box<dyn crate::pass::Pass>> {
        Some(Box::new(load_forms::ResidualSum))
    }

    /// Residual `Add` + `SimplifiedLayerNormalization` pairs fused into
    /// `SkipSimplifiedLayerNormalization` in graphs that read a KV cache ([`decode_forms`]).
    fn decode_forms(&self) -> Option<Box<dyn crate::pass::Pass>> {
        Some(Box::new(decode_forms::SkipNorms))
    }

    /// The CPU provider has few float16 kernels: float16 weights widened by a `Cast` it folds
    /// at load.
    fn qdq_rules(&self) -> &'static QdqRules {
        &QDQ
    }

    fn fp16_form(&self) -> Fp16Form {
        Fp16Form::WeightStorage
    }

    /// 4: the CPU provider's int8 kernels for `MatMulNBits` (activations quantized per block
    /// to int8, VNNI / AVX2 / NEON dot products); a CPU without them computes in f32. On a
    /// 4-layer LLaMA-style decode step (`tools/decode_bench.py`, docs/benchmarks.md) it turns
    /// INT4 from 0.55x to 0.47x of float32's latency at block 32 for a cosine change in the
    /// fifth digit.
    fn int4_accuracy_level(&self) -> Option<i64> {
        Some(4)
    }
}
