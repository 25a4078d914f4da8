//! What `--report` adds for people to look at: each compared layer with its modality and the
//! precision it ended up in, and the similarity error of alignment outputs (CLIP's similarity
//! logits and its image/text embeddings, a projector's features against the other modality).

use std::collections::HashMap;

use mmq_ir::modality::{self, Modality};
use mmq_ir::{GraphId, Module, Op, Value, ValueDef};
use mmq_kernels::Interpreter;
use mmq_passes::quant::calibrate::Sample;
use mmq_passes::quant::report::Report;
use serde::Serialize;

/// One compared layer, as the HTML report draws it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerView {
    /// The value's name.
    pub name: String,
    /// The original op.
    pub op: String,
    /// Its modality.
    pub modality: &'static str,
    /// The precision its node ended up in (`int8`, `int8 dynamic`, `int4`, `fp8`, `fp16`,
    /// `float`).
    pub precision: &'static str,
    /// SQNR, dB (`None`: identical).
    pub sqnr_db: Option<f64>,
    /// Cosine.
    pub cosine: f64,
}

fn named_values(m: &Module, graph: GraphId) -> HashMap<String, Value> {
    let tree = m.graph_tree(graph);
    m.values
        .iter()
        .filter_map(|(v, vd)| {
            let in_tree = match vd.def {
                ValueDef::Output { node, .. } => tree.contains(&m.nodes[node].graph),
                ValueDef::Input { graph: g, .. } => tree.contains(&g),
                ValueDef::Const(_) => false,
            };
            Some((vd.name.clone()?, v)).filter(|_| in_tree)
        })
        .collect()
}

/// The precision the node computing `v` runs in, read off the compiled graph.
fn precision_of(m: &Module, v: Value, depth: usize) -> &'static str {
    let Some(nd) = m.producer(v) else {
        return "float";
    };
    let from = |op: &str| {
        nd.inputs
            .iter()
            .flatten()
            .any(|&i| m.producer(i).is_some_and(|p| p.op.op_type() == op))
    };
    match &nd.op {
        Op::MatMulNBits { .. } | Op::MmqMatMulNBits { .. } => "int4",
        Op::Custom(c) if c.op_type.starts_with("MatMulIntegerToFloat") => "int8",
        Op::Custom(c) if c.op_type == "DynamicQuantizeMatMul" => "int8 dynamic",
        Op::QLinearConv { .. } | Op::QLinearMatMul { .. } => "int8",
        Op::Mul {} if depth < 3 => {
            let integer = nd.inputs.iter().flatten().any(|&i| {
                m.producer(i).is_some_and(|p| {
                    matches!(p.op, Op::Cast { .. })
                        && p.inputs.iter().flatten().any(|&x| {
                            m.producer(x)
                                .is_some_and(|q| matches!(q.op, Op::MatMulInteger {}))
                        })
                }) || precision_of(m, i, depth + 1) == "int8 dynamic"
            });
            if integer { "int8 dynamic" } else { "float" }
        }
        Op::DequantizeLinear { .. } if depth < 3 => {
            // The result DQ of a static unit: DQ(Q(op)).
            let q = nd
                .inputs
                .first()
                .copied()
                .flatten()
                .and_then(|x| m.producer(x));
            match q.and_then(|q| q.inputs.first().copied().flatten()) {
                Some(x) => precision_of(m, x, depth + 1),
                None => "float",
            }
        }
        Op::MatMul {} | Op::Gemm { .. } | Op::Conv { .. } | Op::ConvTranspose { .. } => {
            for &i in nd.inputs.iter().flatten() {
                if let Some(p) = m.producer(i) {
                    if let Op::DequantizeLinear { .. } = p.op {
                        let codes = p.inputs.first().copied().flatten();
                        let dtype = codes.and_then(|c| m.value_type(c).dtype());
                        return match dtype {
                            Some(mmq_ir::DType::F8E4M3FN | mmq_ir::DType::F8E5M2) => "fp8",
                            Some(mmq_ir::DType::I4 | mmq_ir::DType::U4) => "int4",
                            Some(_) => "int8",
                            None => "float",
                        };
                    }
                    if let Op::Cast { .. } = p.op {
                        let src = p.inputs.first().copied().flatten();
                        if src.and_then(|s| m.value_type(s).dtype()) == Some(mmq_ir::DType::F16) {
                            return "fp16";
                        }
                    }
                }
            }
            if from("MatMulInteger") {
                "int8 dynamic"
            } else {
                "float"
            }
        }
        _ => "float",
    }
}

/// The report's layers with their modality (in the original) and precision (in the compiled
/// module).
pub fn layer_views(
    original: &Module,
    compiled: &Module,
    report: &Report,
    overrides: &[(String, Modality)],
) -> Vec<LayerView> {
    let (Some(og), Some(cg)) = (original.entries.first(), compiled.entries.first()) else {
        return Vec::new();
    };
    let labels = modality::analyze(original, og.graph, overrides).ok();
    let orig = named_values(original, og.graph);
    let comp = named_values(compiled, cg.graph);
    report
        .layers
        .iter()
        .map(|l| LayerView {
            name: l.name.clone(),
            op: l.op.clone(),
            modality: match (&labels, orig.get(&l.name)) {
                (Some(lb), Some(&v)) => lb.value(v).name(),
                _ => Modality::Shared.name(),
            },
            precision: comp
                .get(&l.name)
                .map_or("float", |&v| precision_of(compiled, v, 0)),
            sqnr_db: l.sqnr_db,
            cosine: l.cosine,
        })
        .collect()
}

/// The similarity error of one alignment output, quantized minus float, over held-back samples.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alignment {
    /// What is compared: an output (`logits_per_image`) or `cos(image_embeds, text_embeds)`.
    pub what: String,
    /// Samples.
    pub samples: usize,
    /// Similarities compared (all samples).
    pub values: usize,
    /// Mean of Δs = s_quant − s_fp.
    pub mean_delta: f64,
    /// Mean of |Δs|.
    pub mean_abs_delta: f64,
    /// Largest |Δs|.
    pub max_abs_delta: f64,
    /// Mean |s_fp|, for scale.
    pub mean_abs_fp: f64,
}

/// Cosine similarities of the rows of `a` `[n, d]` against the rows of `b` `[k, d]`.
fn cos_matrix(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let norm = |r: &[f64]| r.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-30);
    let mut out = Vec::new();
    for x in a.chunks(d) {
        for y in b.chunks(d) {
            out.push(x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>() / (norm(x) * norm(y)));
        }
    }
    out
}

/// Δs of the alignment outputs of the first entry graph: outputs named like `logits_per_*` or
/// `*similarity*`, and each pair of a vision-only and a text-only `[batch, d]` output (their
/// cosine similarities).
pub fn alignment(
    original: &Module,
    compiled: &Module,
    held_back: &[Sample],
    overrides: &[(String, Modality)],
) -> Result<Vec<Alignment>, String> {
    let (Some(og), Some(cg)) = (original.entries.first(), compiled.entries.first()) else {
        return Ok(Vec::new());
    };
    let outs = &original.graphs[og.graph].outputs;
    let labels = modality::analyze(original, og.graph, overrides).map_err(|e| e.to_string())?;
    let name = |v: Value| original.values[v].name.clone().unwrap_or_default();
    let direct: Vec<String> = outs
        .iter()
        .map(|&v| name(v))
        .filter(|n| n.contains("logits_per") || n.to_ascii_lowercase().contains("similarity"))
        .collect();
    let embed = |md: Modality| -> Vec<(String, usize)> {
        outs.iter()
            .filter(|&&v| labels.value(v) == md)
            .filter_map(|&v| {
                let s = original.value_type(v).shape()?;
                (s.len() == 2).then(|| Some((name(v), s[1].as_known()? as usize)))?
            })
            .collect()
    };
    let mut pairs = Vec::new();
    for (img, d1) in embed(Modality::Vision) {
        for (txt, d2) in embed(Modality::Text) {
            if d1 == d2 {
                pairs.push((img.clone(), txt, d1));
            }
        }
    }
    if direct.is_empty() && pairs.is_empty() {
        return Ok(Vec::new());
    }
    let run = |m: &Module, g: GraphId, s: &Sample| -> Result<HashMap<String, Vec<f64>>, String> {
        let out = Interpreter::new(m).run(g, s).map_err(|e| e.to_string())?;
        Ok(out
            .into_iter()
            .filter_map(|(n, v)| Some((n, v.as_tensor()?.to_f64().ok()?)))
            .collect())
    };
    let mut acc: Vec<(String, Vec<f64>, Vec<f64>)> = direct
        .iter()
        .map(|n| (n.clone(), Vec::new(), Vec::new()))
        .chain(
            pairs
                .iter()
                .map(|(a, b, _)| (format!("cos({a}, {b})"), Vec::new(), Vec::new())),
        )
        .collect();
    for s in held_back {
        let (fo, qo) = (run(original, og.graph, s)?, run(compiled, cg.graph, s)?);
        for (i, n) in direct.iter().enumerate() {
            if let (Some(f), Some(q)) = (fo.get(n), qo.get(n))
                && f.len() == q.len()
            {
                acc[i].1.extend(f);
                acc[i].2.extend(q);
            }
        }
        for (j, (a, b, d)) in pairs.iter().enumerate() {
            let get = |o: &HashMap<String, Vec<f64>>| Some(cos_matrix(o.get(a)?, o.get(b)?, *d));
            if let (Some(f), Some(q)) = (get(&fo), get(&qo)) {
                acc[direct.len() + j].1.extend(f);
                acc[direct.len() + j].2.extend(q);
            }
        }
    }
    Ok(acc
        .into_iter()
        .filter(|(_, f, _)| !f.is_empty())
        .map(|(what, f, q)| {
            let n = f.len() as f64;
            let deltas: Vec<f64> = q.iter().zip(&f).map(|(q, f)| q - f).collect();
            Alignment {
                what,
                samples: held_back.len(),
                values: f.len(),
                mean_delta: deltas.iter().sum::<f64>() / n,
                mean_abs_delta: deltas.iter().map(|d| d.abs()).sum::<f64>() / n,
                max_abs_delta: deltas.iter().fold(0.0, |m, d| m.max(d.abs())),
                mean_abs_fp: f.iter().map(|x| x.abs()).sum::<f64>() / n,
            }
        })
        .collect())
}
