//! Contrib kernels: attention (`MultiHeadAttention` and `GroupQueryAttention`, as ONNX Runtime's
//! contrib op schemas define them).

use mmq_ir::{DType, Op};

use crate::error::KernelError;
use crate::ops::linalg::gemm;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

fn int_attr(op: &Op, name: &str) -> Option<i64> {
    op.get(name)
}

fn float_attr(op: &Op, name: &str) -> Option<f32> {
    op.get(name)
}

/// Key or value in the layout `[B, N, T, H]` (row-major), with its sequence length and head
/// size.
struct Heads {
    data: Vec<f64>,
    seq: usize,
    dim: usize,
}

/// `t` as `[B, N, T, H]`: 4-D input as it is, 3-D `[B, T, N*H]` split into heads.
fn heads(cx: &OpCtx<'_>, t: &Tensor, b: usize, n: usize, what: &str) -> Result<Heads, KernelError> {
    let v = t.to_f64()?;
    match *t.shape.as_slice() {
        [tb, tn, s, d] if tb == b && tn == n => Ok(Heads {
            data: v,
            seq: s,
            dim: d,
        }),
        [tb, s, hidden] if tb == b && hidden % n == 0 => {
            let d = hidden / n;
            let mut out = vec![0.0; v.len()];
            for bi in 0..b {
                for si in 0..s {
                    for hi in 0..n {
                        let src = (bi * s + si) * hidden + hi * d;
                        let dst = ((bi * n + hi) * s + si) * d;
                        out[dst..dst + d].copy_from_slice(&v[src..src + d]);
                    }
                }
            }
            Ok(Heads {
                data: out,
                seq: s,
                dim: d,
            })
        }
        ref s => Err(cx.invalid(format!(
            "{what} {s:?} must be [{b}, T, {n}*H] or [{b}, {n}, T, H]"
        ))),
    }
}

/// `MultiHeadAttention` (com.microsoft): query `[B, S, N*H]`; key and value `[B, T, N*H]` or
/// `[B, N, T, H]`; optional `attention_bias` `[B or 1, N or 1, S, T]` added to the scaled
/// scores; `scale` (default `1/sqrt(H)`). Output `[B, S, N*Hv]`. The forms with a packed or
/// biased projection, a key padding mask, a past cache or `unidirectional` are not supported.
pub(super) fn multi_head_attention(
    cx: &OpCtx<'_>,
    op: &Op,
    inputs: &[Option<RtValue>],
) -> OpResult {
    let q = tensor(cx, inputs, 0)?;
    let k = tensor(cx, inputs, 1)?;
    let v = tensor(cx, inputs, 2)?;
    for (i, what) in [
        (3, "bias"),
        (4, "key_padding_mask"),
        (6, "past_key"),
        (7, "past_value"),
    ] {
        if opt_tensor(inputs, i).is_some() {
            return Err(cx.unsupported(format!("MultiHeadAttention with {what}")));
        }
    }
    if int_attr(op, "unidirectional").unwrap_or(0) != 0 {
        return Err(cx.unsupported("MultiHeadAttention with unidirectional = 1"));
    }
    if !matches!(q.dtype, DType::F32 | DType::F16 | DType::F64) {
        return Err(cx.unsupported(format!("MultiHeadAttention on {}", q.dtype)));
    }
    let n = int_attr(op, "num_heads")
        .filter(|&n| n > 0)
        .ok_or_else(|| cx.invalid("num_heads must be a positive integer"))? as usize;
    let &[b, s, hidden] = q.shape.as_slice() else {
        return Err(cx.invalid(format!("query {:?} must be 3-D [B, S, N*H]", q.shape)));
    };
    if hidden % n != 0 {
        return Err(cx.invalid(format!(
            "query hidden size {hidden} is not a multiple of {n} heads"
        )));
    }
    let d = hidden / n;
    let kh = heads(cx, k, b, n, "key")?;
    let vh = heads(cx, v, b, n, "value")?;
    if kh.dim != d || vh.seq != kh.seq {
        return Err(cx.invalid(format!(
            "query {:?}, key {:?} and value {:?} do not fit together",
            q.shape, k.shape, v.shape
        )));
    }
    let (t, dv) = (kh.seq, vh.dim);
    let bias = match opt_tensor(inputs, 5) {
        Some(a) => {
            let ok = a.rank() == 4
                && (a.shape[0] == b || a.shape[0] == 1)
                && (a.shape[1] == n || a.shape[1] == 1)
                && a.shape[2] == s
                && a.shape[3] == t;
            if !ok {
                return Err(cx.invalid(format!(
                    "attention_bias {:?} must be [{b} or 1, {n} or 1, {s}, {t}]",
                    a.shape
                )));
            }
            Some((a.to_f64()?, a.shape[0] != 1, a.shape[1] != 1))
        }
        None => None,
    };
    let scale = match float_attr(op, "scale") {
        Some(x) if x != 0.0 => f64::from(x),
        _ => 1.0 / (d as f64).sqrt(),
    };
    let qv = q.to_f64()?;
    let mut out = vec![0.0; b * s * n * dv];
    // Per batch and head: scores = scale · Q Kᵀ (+ bias), softmax along T, then P V, each
    // product one strided GEMM in f64.
    let mut scores = vec![0.0; s * t];
    for bi in (0..b).filter(|_| s > 0 && t > 0) {
        for hi in 0..n {
            let kbase = (bi * n + hi) * t;
            let qo = bi * s * hidden + hi * d;
            gemm(
                s,
                d,
                t,
                scale,
                &qv[qo..],
                (hidden, 1),
                &kh.data[kbase * d..],
                (1, d),
                0.0,
                &mut scores,
                (t, 1),
            );
            for (si, row) in scores.chunks_exact_mut(t).enumerate() {
                if let Some((a, per_b, per_h)) = &bias {
                    let ab = if *per_b { bi } else { 0 };
                    let ah = if *per_h { hi } else { 0 };
                    let hn = if *per_h { n } else { 1 };
                    let ao = ((ab * hn + ah) * s + si) * t;
                    for (r, x) in row.iter_mut().zip(&a[ao..ao + t]) {
                        *r += x;
                    }
                }
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for r in row.iter_mut() {
                    *r = (*r - max).exp();
                    sum += *r;
                }
                for r in row.iter_mut() {
                    *r /= sum;
                }
            }
            let oo = bi * s * n * dv + hi * dv;
            gemm(
                s,
                t,
                dv,
                1.0,
                &scores,
                (t, 1),
                &vh.data[kbase * dv..],
                (dv, 1),
                0.0,
                &mut out[oo..],
                (n * dv, 1),
            );
        }
    }
    let y = Tensor::from_f64_as(q.dtype, vec![b, s, n * dv], &out)?;
    Ok(vec![Some(y.into())])
}

/// `GroupQueryAttention` (com.microsoft), as ONNX Runtime's CPU kernel computes it: query
/// `[B, S, N*H]` (or Q, K and V packed in it when key and value are absent), key and value
/// `[B, S, Nkv*H]`, past key and value `[B, Nkv, P, H]`, `seqlens_k` `[B]` (valid keys per row,
/// less one) and `total_sequence_length`. Row `b` holds `seqlens_k[b] + 1` keys: its past is the
/// first `seqlens_k[b] + 1 - S` positions of the past cache (none on the first run, when there
/// is no past), and its new keys follow. Query token `i` attends causally to the keys up to its
/// own position, within `local_window_size` when given. Outputs: `[B, S, N*H]`, and the present
/// key and value `[B, Nkv, T, H]` with `T` the longer of `P` and `total_sequence_length` (a past
/// as long as the present is the shared buffer onnxruntime-genai binds). Also the rotary
/// embedding inside (`do_rotary`, [`Rotary`]) and INT8 caches with static scales
/// ([`CacheCodes`]); not `softcap`, `qk_output`, `smooth_softmax` or 4-bit caches.
pub(super) fn group_query_attention(
    cx: &OpCtx<'_>,
    op: &Op,
    inputs: &[Option<RtValue>],
) -> OpResult {
    for (name, on) in [
        (
            "softcap",
            float_attr(op, "softcap").is_some_and(|x| x != 0.0),
        ),
        ("qk_output", int_attr(op, "qk_output").unwrap_or(0) != 0),
        (
            "smooth_softmax",
            int_attr(op, "smooth_softmax").unwrap_or(-1) == 1,
        ),
    ] {
        if on {
            return Err(cx.unsupported(format!("GroupQueryAttention with {name}")));
        }
    }
    let q = tensor(cx, inputs, 0)?;
    if !matches!(q.dtype, DType::F32 | DType::F16 | DType::F64) {
        return Err(cx.unsupported(format!("GroupQueryAttention on {}", q.dtype)));
    }
    let positive = |name: &str| {
        int_attr(op, name)
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| cx.invalid(format!("{name} must be a positive integer")))
    };
    let (n, nkv) = (positive("num_heads")?, positive("kv_num_heads")?);
    if n % nkv != 0 {
        return Err(cx.invalid(format!(
            "num_heads {n} is not a multiple of kv_num_heads {nkv}"
        )));
    }
    let &[b, s, width] = q.shape.as_slice() else {
        return Err(cx.invalid(format!("query {:?} must be 3-D [B, S, N*H]", q.shape)));
    };
    let qv = q.to_f64()?;
    // Q, K and V as [B, S, heads * H] rows, unpacked when packed.
    let (mut qrows, mut krows, vrows, d) = match (opt_tensor(inputs, 1), opt_tensor(inputs, 2)) {
        (Some(k), Some(v)) => {
            let d = width / n;
            if width % n != 0 || k.shape != [b, s, nkv * d] || v.shape != k.shape {
                return Err(cx.invalid(format!(
                    "query {:?}, key {:?} and value {:?} do not fit {n} and {nkv} heads",
                    q.shape, k.shape, v.shape
                )));
            }
            (qv, k.to_f64()?, v.to_f64()?, d)
        }
        (None, None) => {
            let d = width / (n + 2 * nkv);
            if width % (n + 2 * nkv) != 0 {
                return Err(cx.invalid(format!(
                    "packed query {:?} does not split into {n} + 2 x {nkv} heads",
                    q.shape
                )));
            }
            let (qw, kw) = (n * d, nkv * d);
            let mut parts = (Vec::new(), Vec::new(), Vec::new());
            for row in qv.chunks_exact(width) {
                parts.0.extend_from_slice(&row[..qw]);
                parts.1.extend_from_slice(&row[qw..qw + kw]);
                parts.2.extend_from_slice(&row[qw + kw..]);
            }
            (parts.0, parts.1, parts.2, d)
        }
        _ => return Err(cx.invalid("key and value are given together or not at all")),
    };
    let past = match (opt_tensor(inputs, 3), opt_tensor(inputs, 4)) {
        (Some(pk), Some(pv)) => {
            let p = pk.shape.get(2).copied().unwrap_or(0);
            if pk.shape != [b, nkv, p, d] || pv.shape != pk.shape {
                return Err(cx.invalid(format!(
                    "past key {:?} and value {:?} must be [{b}, {nkv}, P, {d}]",
                    pk.shape, pv.shape
                )));
            }
            Some((pk, pv, p))
        }
        (None, None) => None,
        _ => return Err(cx.invalid("past key and value are given together or not at all")),
    };
    let seqlens = tensor(cx, inputs, 5)?.to_i64()?;
    let total = tensor(cx, inputs, 6)?.to_i64()?;
    let (&[total], true) = (total.as_slice(), seqlens.len() == b) else {
        return Err(cx.invalid(format!(
            "seqlens_k must hold {b} lengths and total_sequence_length one, got {} and {}",
            seqlens.len(),
            total.len()
        )));
    };
    let p = past.as_ref().map_or(0, |x| x.2);
    let t = p.max(usize::try_from(total).unwrap_or(0));
    let first_run = p == 0;
    // Each row's past keys: its keys (`seqlens_k + 1`) less the new ones, none on a first run.
    let past_lens: Vec<usize> = seqlens
        .iter()
        .map(|&len| {
            let keys = usize::try_from(len + 1).unwrap_or(0);
            if first_run { 0 } else { keys.saturating_sub(s) }
        })
        .collect();
    if int_attr(op, "do_rotary").unwrap_or(0) != 0 {
        let rotary = Rotary::of(cx, op, inputs, b, s, d)?;
        for (bi, &past_len) in past_lens.iter().enumerate() {
            for si in 0..s {
                let (cos, sin) = rotary.at(cx, bi, si, past_len, first_run)?;
                for (rows, heads) in [(&mut qrows, n), (&mut krows, nkv)] {
                    let row = (bi * s + si) * heads * d;
                    for x in rows[row..row + heads * d].chunks_exact_mut(d) {
                        rotate(x, cos, sin, rotary.interleaved);
                    }
                }
            }
        }
    }
    // The caches as values: codes times their scales where the cache is quantized.
    let kq = CacheCodes::of(cx, op, inputs, "k_quant_type", 12, nkv, d)?;
    let vq = CacheCodes::of(cx, op, inputs, "v_quant_type", 13, nkv, d)?;
    let past = match past {
        Some((pk, pv, p)) => Some((kq.read(cx, pk)?, vq.read(cx, pv)?, p)),
        None => None,
    };
    let (krows, vrows) = (kq.round_rows(krows), vq.round_rows(vrows));
    let window = int_attr(op, "local_window_size").unwrap_or(-1);
    let scale = match float_attr(op, "scale") {
        Some(x) if x != 0.0 => f64::from(x),
        _ => 1.0 / (d as f64).sqrt(),
    };
    let mut present_k = vec![0.0; b * nkv * t * d];
    let mut present_v = vec![0.0; b * nkv * t * d];
    let mut out = vec![0.0; b * s * n * d];
    for (bi, &past_len) in past_lens.iter().enumerate() {
        if past_len + s > t {
            return Err(cx.invalid(format!(
                "row {bi}: {past_len} past and {s} new keys do not fit {t} positions"
            )));
        }
        if past_len > p {
            return Err(cx.invalid(format!(
                "row {bi}: seqlens_k gives {past_len} past keys, the past holds {p}"
            )));
        }
        for h in 0..nkv {
            let dst = (bi * nkv + h) * t * d;
            if let Some((pk, pv, _)) = &past {
                let src = (bi * nkv + h) * p * d;
                present_k[dst..dst + past_len * d].copy_from_slice(&pk[src..src + past_len * d]);
                present_v[dst..dst + past_len * d].copy_from_slice(&pv[src..src + past_len * d]);
            }
            for si in 0..s {
                let src = (bi * s + si) * nkv * d + h * d;
                let at = dst + (past_len + si) * d;
                present_k[at..at + d].copy_from_slice(&krows[src..src + d]);
                present_v[at..at + d].copy_from_slice(&vrows[src..src + d]);
            }
        }
        for hi in 0..n {
            let kv = hi / (n / nkv);
            let base = (bi * nkv + kv) * t * d;
            for si in 0..s {
                // Keys up to this token's own position, within the local window.
                let end = (past_len + si + 1).min(t);
                let start = if window > 0 {
                    end.saturating_sub(window as usize)
                } else {
                    0
                };
                let qo = (bi * s + si) * n * d + hi * d;
                let qrow = &qrows[qo..qo + d];
                let mut scores: Vec<f64> = (start..end)
                    .map(|j| {
                        let krow = &present_k[base + j * d..base + (j + 1) * d];
                        scale * qrow.iter().zip(krow).map(|(a, c)| a * c).sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for x in &mut scores {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                let o = &mut out[qo..qo + d];
                for (j, w) in (start..end).zip(&scores) {
                    let vrow = &present_v[base + j * d..base + (j + 1) * d];
                    for (y, x) in o.iter_mut().zip(vrow) {
                        *y += w / sum * x;
                    }
                }
            }
        }
    }
    let y = Tensor::from_f64_as(q.dtype, vec![b, s, n * d], &out)?;
    let pk = kq.write(q.dtype, vec![b, nkv, t, d], &present_k)?;
    let pv = vq.write(q.dtype, vec![b, nkv, t, d], &present_v)?;
    Ok(vec![Some(y.into()), Some(pk.into()), Some(pv.into())])
}

/// `GroupQueryAttention`'s own rotary embedding (`do_rotary`): `cos_cache` and `sin_cache`
/// (inputs 7 and 8, `[positions, rotary_dim / 2]`) at each token's position, which is
/// `position_ids` (input 9) where given (on a first run, its first element and the tokens after
/// it), else the token's place after the past.
struct Rotary {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    positions: Option<Vec<i64>>,
    /// Tokens a row (`position_ids` is `[B, tokens]`).
    tokens: usize,
    interleaved: bool,
}

impl Rotary {
    fn of(
        cx: &OpCtx<'_>,
        op: &Op,
        inputs: &[Option<RtValue>],
        b: usize,
        s: usize,
        d: usize,
    ) -> Result<Rotary, KernelError> {
        let (cos, sin) = (tensor(cx, inputs, 7)?, tensor(cx, inputs, 8)?);
        let (&[_, half], true) = (cos.shape.as_slice(), sin.shape == cos.shape) else {
            return Err(cx.invalid(format!(
                "do_rotary needs cos_cache and sin_cache of one shape [positions, rotary_dim / 2], \
                 got {:?} and {:?}",
                cos.shape, sin.shape
            )));
        };
        if half == 0 || 2 * half > d {
            return Err(cx.invalid(format!(
                "cos_cache {:?}: rotary_dim {} does not fit head size {d}",
                cos.shape,
                2 * half
            )));
        }
        let positions = match opt_tensor(inputs, 9) {
            Some(p) if p.shape == [b, s] => Some(p.to_i64()?),
            Some(p) => {
                return Err(cx.invalid(format!("position_ids {:?} must be [{b}, {s}]", p.shape)));
            }
            None => None,
        };
        Ok(Rotary {
            cos: cos.to_f32()?,
            sin: sin.to_f32()?,
            half,
            positions,
            tokens: s,
            interleaved: int_attr(op, "rotary_interleaved").unwrap_or(0) != 0,
        })
    }

    /// The cos and sin rows of token `si` of row `bi`.
    fn at(
        &self,
        cx: &OpCtx<'_>,
        bi: usize,
        si: usize,
        past_len: usize,
        first_run: bool,
    ) -> Result<(&[f32], &[f32]), KernelError> {
        let pos = match &self.positions {
            Some(p) if first_run => p[bi * self.tokens] + si as i64,
            Some(p) => p[bi * self.tokens + si],
            None => (past_len + si) as i64,
        };
        let rows = self.cos.len() / self.half;
        let pos = usize::try_from(pos)
            .ok()
            .filter(|&p| p < rows)
            .ok_or_else(|| {
                cx.invalid(format!("position {pos} is outside cos_cache's {rows} rows"))
            })?;
        let range = pos * self.half..(pos + 1) * self.half;
        Ok((&self.cos[range.clone()], &self.sin[range]))
    }
}

/// Rotates the pairs of `x` (halves, or neighbours when `interleaved`) by the angles whose
/// cosines and sines are `cos` and `sin`, in f32 as ONNX Runtime does; channels past
/// `2 * cos.len()` stay.
fn rotate(x: &mut [f64], cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x1, x2) = (x[a] as f32, x[b] as f32);
        x[a] = f64::from(x1 * cos[i] - x2 * sin[i]);
        x[b] = f64::from(x2 * cos[i] + x1 * sin[i]);
    }
}

/// How one cache of `GroupQueryAttention` is held: float, or INT8 codes with static scales
/// (`PER_TENSOR`: one; `PER_CHANNEL`: one per KV head and channel, `[1, kvN, 1, H]`), as ONNX
/// Runtime's CPU kernel holds them: a code is `x / scale` rounded half to even and saturated,
/// and attention reads every key and value (the new ones too) through its code.
enum CacheCodes {
    Float,
    /// The scale of each KV head's channel (`kvN * H`; a per-tensor scale repeated).
    Int8 {
        scales: Vec<f32>,
        head_dim: usize,
    },
}

impl CacheCodes {
    fn of(
        cx: &OpCtx<'_>,
        op: &Op,
        inputs: &[Option<RtValue>],
        attr: &str,
        scale_input: usize,
        nkv: usize,
        d: usize,
    ) -> Result<CacheCodes, KernelError> {
        let kind = op.get::<String>(attr).unwrap_or_else(|| "NONE".to_owned());
        let per_channel = match kind.as_str() {
            "NONE" => return Ok(CacheCodes::Float),
            "PER_TENSOR" => false,
            "PER_CHANNEL" => true,
            other => {
                return Err(cx.invalid(format!(
                    "{attr} {other:?} is none of NONE, PER_TENSOR, PER_CHANNEL"
                )));
            }
        };
        let bits = int_attr(op, "kv_cache_bit_width").unwrap_or(0);
        if bits != 8 {
            return Err(cx.unsupported(format!(
                "GroupQueryAttention with a {bits}-bit quantized cache (8 bits are supported)"
            )));
        }
        let Some(scale) = opt_tensor(inputs, scale_input) else {
            return Err(cx.invalid(format!(
                "{attr} {kind} needs its scale (input {scale_input})"
            )));
        };
        let scales = scale.to_f32()?;
        let want = if per_channel { nkv * d } else { 1 };
        if scales.len() != want || scales.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
            return Err(cx.invalid(format!(
                "{attr} {kind}: the scale (input {scale_input}, shape {:?}) must hold {want} \
                 positive finite value(s)",
                scale.shape
            )));
        }
        Ok(CacheCodes::Int8 {
            scales: scales.repeat(nkv * d / want),
            head_dim: d,
        })
    }

    /// The scale of element `i` of a `[B, kvN, T, H]` cache of `tokens` positions.
    fn cache_scale(scales: &[f32], head_dim: usize, tokens: usize, i: usize) -> f32 {
        let head = (i / (tokens * head_dim)) % (scales.len() / head_dim);
        scales[head * head_dim + i % head_dim]
    }

    /// A past cache as values.
    fn read(&self, cx: &OpCtx<'_>, t: &Tensor) -> Result<Vec<f64>, KernelError> {
        let CacheCodes::Int8 { scales, head_dim } = self else {
            return t.to_f64();
        };
        if t.dtype != DType::I8 {
            return Err(cx.invalid(format!(
                "a quantized cache holds int8 codes, the past is {}",
                t.dtype
            )));
        }
        let tokens = t.shape[2];
        Ok(t.to_f64()?
            .iter()
            .enumerate()
            .map(|(i, &c)| f64::from(c as f32 * Self::cache_scale(scales, *head_dim, tokens, i)))
            .collect())
    }

    /// New `[B, S, kvN * H]` rows as attention reads them: through their codes when quantized.
    fn round_rows(&self, rows: Vec<f64>) -> Vec<f64> {
        let CacheCodes::Int8 { scales, .. } = self else {
            return rows;
        };
        rows.iter()
            .zip(scales.iter().cycle())
            .map(|(&x, &s)| f64::from(code(x as f32, s) as f32 * s))
            .collect()
    }

    /// The present cache: values, or their codes.
    fn write(
        &self,
        dtype: DType,
        shape: Vec<usize>,
        values: &[f64],
    ) -> Result<Tensor, KernelError> {
        let CacheCodes::Int8 { scales, head_dim } = self else {
            return Tensor::from_f64_as(dtype, shape, values);
        };
        let tokens = shape[2];
        let codes: Vec<f64> = values
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                f64::from(code(
                    x as f32,
                    Self::cache_scale(scales, *head_dim, tokens, i),
                ))
            })
            .collect();
        Tensor::from_f64_as(DType::I8, shape, &codes)
    }
}

/// `x / scale` rounded half to even and saturated to INT8.
fn code(x: f32, scale: f32) -> i8 {
    (x / scale).round_ties_even().clamp(-128.0, 127.0) as i8
}

/// `com.microsoft.RotaryEmbedding(input, position_ids, cos_cache, sin_cache)`: the default
/// domain's `RotaryEmbedding` with the position ids last (a single id is the position of the
/// first token, as there).
pub(super) fn rotary_embedding(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let Op::MsRotaryEmbedding {
        interleaved,
        is_packed_batching,
        num_heads,
        rotary_embedding_dim,
        scale,
    } = op
    else {
        return Err(cx.invalid("not a com.microsoft.RotaryEmbedding"));
    };
    if is_packed_batching.unwrap_or(0) != 0 {
        return Err(cx.unsupported("RotaryEmbedding with is_packed_batching"));
    }
    if scale.is_some_and(|s| s != 1.0) {
        return Err(cx.unsupported(format!(
            "RotaryEmbedding with scale {}",
            scale.unwrap_or(1.0)
        )));
    }
    if inputs.len() != 4 {
        return Err(cx.invalid(format!(
            "RotaryEmbedding takes 4 inputs (input, position_ids, cos_cache, sin_cache), not {}",
            inputs.len()
        )));
    }
    let node = mmq_ir::NodeData {
        op: Op::RotaryEmbedding {
            interleaved: *interleaved,
            num_heads: *num_heads,
            rotary_embedding_dim: rotary_embedding_dim.filter(|&d| d > 0),
        },
        inputs: [0, 2, 3, 1]
            .iter()
            .map(|&i| cx.node.inputs.get(i).copied().flatten())
            .collect(),
        outputs: cx.node.outputs.clone(),
        name: cx.node.name.clone(),
        graph: cx.node.graph,
    };
    let inner = OpCtx {
        interp: cx.interp,
        node: &node,
        opset: cx.opset.max(23),
        env: cx.env,
    };
    let reordered: Vec<Option<RtValue>> = [0, 2, 3, 1].iter().map(|&i| inputs[i].clone()).collect();
    crate::ops::eval(&inner, &reordered)
}

#[cfg(test)]
mod tests {
    use mmq_ir::Op;

    use crate::ops::linalg::tests::{close, f32t, out, run_op};

    fn mha(heads: i64, scale: f32) -> Op {
        Op::MultiHeadAttention {
            num_heads: Some(heads),
            scale: Some(scale),
            mask_filter_value: None,
            unidirectional: None,
        }
    }

    #[test]
    fn scale_and_bias() {
        // One head, one query, two keys: scores [0, ln 3] give weights [1/4, 3/4].
        let ln3 = 3f32.ln();
        let q = f32t(&[1, 1, 1], &[1.0]);
        let k = f32t(&[1, 1, 2, 1], &[0.0, 1.0]);
        let v = f32t(&[1, 1, 2, 1], &[10.0, 20.0]);
        let r = run_op(mha(1, ln3), vec![q.clone(), k.clone(), v.clone()], 1, 17).expect("runs");
        let (shape, y) = out(&r, 0);
        assert_eq!(shape, [1, 1, 1]);
        close(&y, &[17.5], 1e-6);
        // A bias [ln 3, 0] evens the scores out.
        let bias = f32t(&[1, 1, 1, 2], &[ln3, 0.0]);
        let r = run_op(mha(1, ln3), vec![q, k, v, None, None, bias], 1, 17).expect("runs");
        close(&out(&r, 0).1, &[15.0], 1e-6);
    }

    #[test]
    fn key_3d_and_4d_agree_and_bias_broadcasts() {
        // B 1, S 2, T 3, two heads of size 2.
        let q: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
        let k4: Vec<f32> = (0..12).map(|i| (i as f32 * 0.53).cos()).collect();
        let v4: Vec<f32> = (0..12).map(|i| i as f32 * 0.1 - 0.4).collect();
        // [B, N, T, H] → [B, T, N*H]
        let to3 = |x: &[f32]| -> Vec<f32> {
            let mut o = vec![0.0; 12];
            for n in 0..2 {
                for t in 0..3 {
                    for h in 0..2 {
                        o[t * 4 + n * 2 + h] = x[(n * 3 + t) * 2 + h];
                    }
                }
            }
            o
        };
        let bias: Vec<f32> = (0..6).map(|i| -(i as f32) * 0.3).collect();
        let b1 = f32t(&[1, 1, 2, 3], &bias);
        let mut both = bias.clone();
        both.extend(&bias);
        let b2 = f32t(&[1, 2, 2, 3], &both);
        let run = |k: Vec<f32>, kshape: &[usize], b| {
            let r = run_op(
                mha(2, 0.5),
                vec![
                    f32t(&[1, 2, 4], &q),
                    f32t(kshape, &k),
                    f32t(
                        kshape,
                        &if kshape.len() == 4 {
                            v4.clone()
                        } else {
                            to3(&v4)
                        },
                    ),
                    None,
                    None,
                    b,
                ],
                1,
                17,
            )
            .expect("runs");
            out(&r, 0)
        };
        let (s4, y4) = run(k4.clone(), &[1, 2, 3, 2], b1.clone());
        let (s3, y3) = run(to3(&k4), &[1, 3, 4], b1);
        let (_, yb) = run(k4.clone(), &[1, 2, 3, 2], b2);
        assert_eq!(s4, [1, 2, 4]);
        assert_eq!(s3, s4);
        close(&y3, &y4, 1e-6);
        close(&yb, &y4, 1e-6);
    }

    #[test]
    fn past_inputs_are_refused() {
        let q = f32t(&[1, 1, 2], &[1.0, 2.0]);
        let k = f32t(&[1, 1, 1, 2], &[1.0, 0.0]);
        let past = f32t(&[1, 1, 1, 2], &[0.0, 1.0]);
        let inputs = vec![q, k.clone(), k, None, None, None, past.clone(), past];
        let err = run_op(mha(1, 1.0), inputs, 1, 17).expect_err("past not supported");
        assert!(err.to_string().contains("past_key"), "{err}");
    }
}
