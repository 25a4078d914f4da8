//! Attention (opset 23/24) and RotaryEmbedding.

use mmq_ir::{DType, Op};
use rayon::prelude::*;

use super::{Real, by_real, gather_strided, gemm, is_float};
use crate::error::KernelError;
use crate::ops::util::{broadcast_shapes, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// `[B, S, H*D]` → `[B, H, S, D]` (contiguous).
fn split_heads<T: Real>(v: &[T], b: usize, s: usize, h: usize, d: usize) -> Vec<T> {
    gather_strided(v, &[b, h, s, d], &[s * h * d, d, h * d, 1])
}

/// Concatenates `[B, H, P, D]` and `[B, H, S, D]` along axis 2.
fn concat_seq<T: Real>(
    past: &[T],
    cur: &[T],
    b: usize,
    h: usize,
    p: usize,
    s: usize,
    d: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(b * h * (p + s) * d);
    for i in 0..b * h {
        out.extend_from_slice(&past[i * p * d..(i + 1) * p * d]);
        out.extend_from_slice(&cur[i * s * d..(i + 1) * s * d]);
    }
    out
}

struct Heads<T> {
    data: Vec<T>,
    heads: usize,
    seq: usize,
    dim: usize,
}

fn to_heads<T: Real>(
    cx: &OpCtx<'_>,
    t: &Tensor,
    heads: Option<i64>,
    what: &str,
) -> Result<Heads<T>, KernelError> {
    let v = T::load(t)?;
    match t.shape.as_slice() {
        &[_, h, s, d] => Ok(Heads {
            data: v.into_owned(),
            heads: h,
            seq: s,
            dim: d,
        }),
        &[b, s, hidden] => {
            let h = heads
                .filter(|&h| h > 0 && hidden % h as usize == 0)
                .ok_or_else(|| {
                    cx.invalid(format!(
                        "{what} {:?} needs a head count that divides {hidden}",
                        t.shape
                    ))
                })? as usize;
            let d = hidden / h;
            Ok(Heads {
                data: split_heads(&v, b, s, h, d),
                heads: h,
                seq: s,
                dim: d,
            })
        }
        s => Err(cx.invalid(format!("{what} {s:?} must be 3-D or 4-D"))),
    }
}

#[allow(clippy::too_many_lines, reason = "follows the spec step by step")]
fn attention_float<T: Real>(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
) -> Result<Vec<Option<RtValue>>, KernelError> {
    let Op::Attention {
        is_causal,
        kv_num_heads,
        left_window_size,
        q_num_heads,
        qk_matmul_output_mode,
        right_window_size,
        scale,
        softcap,
        ..
    } = &cx.node.op
    else {
        return Err(cx.invalid("not an Attention"));
    };
    let qt = tensor(cx, inputs, 0)?;
    let kt = tensor(cx, inputs, 1)?;
    let vt = tensor(cx, inputs, 2)?;
    let mask = opt_tensor(inputs, 3);
    let past_k = opt_tensor(inputs, 4);
    let past_v = opt_tensor(inputs, 5);
    let nonpad = if cx.opset >= 24 {
        opt_tensor(inputs, 6)
    } else {
        None
    };
    if qt.rank() != kt.rank() || qt.rank() != vt.rank() {
        return Err(cx.invalid("Q, K and V must have the same rank"));
    }
    if past_k.is_some() != past_v.is_some() {
        return Err(cx.invalid("past_key and past_value must be given together"));
    }
    let three_d = qt.rank() == 3;
    let b = qt.shape[0];
    let q = to_heads::<T>(cx, qt, *q_num_heads, "Q")?;
    let k = to_heads::<T>(cx, kt, *kv_num_heads, "K")?;
    let v = to_heads::<T>(cx, vt, *kv_num_heads, "V")?;
    if kt.shape[0] != b
        || vt.shape[0] != b
        || k.dim != q.dim
        || k.heads != v.heads
        || k.seq != v.seq
    {
        return Err(cx.invalid(format!(
            "Q {:?}, K {:?}, V {:?} do not fit together",
            qt.shape, kt.shape, vt.shape
        )));
    }
    let (hq, hkv, sq, d, dv) = (q.heads, k.heads, q.seq, q.dim, v.dim);
    if hkv == 0 || hq % hkv != 0 {
        return Err(cx.invalid(format!(
            "{hq} query heads are not a multiple of {hkv} kv heads"
        )));
    }
    let (kd, vd, past_len) = match (past_k, past_v) {
        (Some(pk), Some(pv)) => {
            let p = pk.shape.get(2).copied().unwrap_or(0);
            if pk.shape != [b, hkv, p, d] || pv.shape != [b, hkv, p, dv] {
                return Err(cx.invalid(format!(
                    "past_key {:?} / past_value {:?} do not fit K and V",
                    pk.shape, pv.shape
                )));
            }
            let pkv = T::load(pk)?;
            let pvv = T::load(pv)?;
            (
                concat_seq(&pkv, &k.data, b, hkv, p, k.seq, d),
                concat_seq(&pvv, &v.data, b, hkv, p, k.seq, dv),
                p,
            )
        }
        _ => (k.data, v.data, 0),
    };
    let skv = past_len + k.seq;
    // The additive bias as a 4-D broadcastable array with strides.
    let mut bias_shape = vec![1usize, 1, sq, skv];
    let mut bias: Vec<T> = vec![T::ZERO; sq * skv];
    if let Some(m) = mask {
        if m.rank() < 1 || m.rank() > 4 {
            return Err(cx.invalid(format!("attn_mask {:?} must be 1-D to 4-D", m.shape)));
        }
        let last = m.shape[m.rank() - 1];
        if last > skv {
            return Err(cx.invalid(format!("attn_mask {:?} is longer than {skv} keys", m.shape)));
        }
        let vals: Vec<T> = match &m.data {
            Data::Bool(bv) => bv
                .iter()
                .map(|&x| if x { T::ZERO } else { T::NEG_INF })
                .collect(),
            _ if m.dtype == DType::Bool => return Err(cx.invalid("bad bool mask")),
            _ => T::load(m)?.into_owned(),
        };
        let pad = T::NEG_INF;
        let rows = vals.len() / last.max(1);
        let mut padded = Vec::with_capacity(rows * skv);
        for r in 0..rows {
            padded.extend_from_slice(&vals[r * last..(r + 1) * last]);
            padded.extend(std::iter::repeat_n(pad, skv - last));
        }
        let mut ms = m.shape.clone();
        *ms.last_mut().unwrap_or(&mut 0) = skv;
        while ms.len() < 4 {
            ms.insert(0, 1);
        }
        if broadcast_shapes(&[&ms, &[b, hq, sq, skv]]).as_deref() != Some(&[b, hq, sq, skv][..]) {
            return Err(cx.invalid(format!(
                "attn_mask {:?} does not broadcast to [{b}, {hq}, {sq}, {skv}]",
                m.shape
            )));
        }
        bias_shape = ms;
        bias = padded;
    }
    let causal = is_causal.unwrap_or(0) != 0;
    let nonpad_len: Option<Vec<i64>> = nonpad.map(|t| t.to_i64()).transpose()?;
    if let Some(np) = &nonpad_len {
        if np.len() != b {
            return Err(cx.invalid(format!(
                "nonpad_kv_seqlen has {} entries, batch is {b}",
                np.len()
            )));
        }
        if past_len > 0 {
            return Err(cx.invalid("nonpad_kv_seqlen cannot be combined with past_key"));
        }
    }
    // Sliding window (opset 25): a query at absolute position p attends key j iff
    // p - left <= j <= p + right, for each bound that is not -1.
    let left = left_window_size.unwrap_or(-1);
    let right = right_window_size.unwrap_or(-1);
    if left < -1 || right < -1 {
        return Err(cx.invalid("left_window_size and right_window_size must be -1 or nonnegative"));
    }
    let window = left >= 0 || right >= 0;
    if causal || nonpad_len.is_some() || window {
        // Materialize a per-batch bias.
        let full = [b, bias_shape[1], sq, skv];
        let src = std::mem::take(&mut bias);
        let st = bstrides(&bias_shape);
        let mut nb = gather_strided(&src, &full, &st);
        for bi in 0..b {
            for h in 0..full[1] {
                for i in 0..sq {
                    for j in 0..skv {
                        let at = ((bi * full[1] + h) * sq + i) * skv + j;
                        let blocked_causal = causal && {
                            let off = match &nonpad_len {
                                Some(np) => np[bi] - sq as i64,
                                None => past_len as i64,
                            };
                            j as i64 > i as i64 + off
                        };
                        let blocked_pad = nonpad_len.as_ref().is_some_and(|np| j as i64 >= np[bi]);
                        let blocked_window = window && {
                            let off = match &nonpad_len {
                                Some(np) => np[bi] - sq as i64,
                                None => past_len as i64,
                            };
                            let diff = i as i64 + off - j as i64;
                            (left >= 0 && diff > left) || (right >= 0 && -diff > right)
                        };
                        if blocked_causal || blocked_pad || blocked_window {
                            nb[at] = T::NEG_INF;
                        }
                    }
                }
            }
        }
        bias = nb;
        bias_shape = full.to_vec();
    }
    let bst = bstrides(&bias_shape);
    let scale_v = match scale {
        Some(s) => f64::from(*s),
        None => 1.0 / (d as f64).sqrt(),
    };
    // f16/bf16 inputs: round every intermediate to the input type, as the reference does.
    let dtype = qt.dtype;
    let rd = move |x: T| -> T {
        match dtype {
            DType::F16 => T::from_f64(f64::from(half::f16::from_f64(x.to_f64()))),
            DType::BF16 => T::from_f64(f64::from(half::bf16::from_f64(x.to_f64()))),
            _ => x,
        }
    };
    let lowp = matches!(dtype, DType::F16 | DType::BF16);
    let (alpha, q_data, k_scaled) = if lowp {
        let sc = rd(T::from_f64(scale_v.sqrt()));
        let qs: Vec<T> = q.data.iter().map(|&x| rd(x * sc)).collect();
        let ks: Vec<T> = kd.iter().map(|&x| rd(x * sc)).collect();
        (T::ONE, qs, Some(ks))
    } else {
        (T::from_f64(scale_v), q.data, None)
    };
    let k_use: &[T] = k_scaled.as_deref().unwrap_or(&kd);
    if lowp {
        bias.iter_mut().for_each(|x| *x = rd(*x));
    }
    let cap = softcap.map(f64::from).filter(|&c| c > 0.0);
    let mode = qk_matmul_output_mode.unwrap_or(0);
    let want_qk = cx.node.outputs.get(3).is_some_and(Option::is_some);
    let rep = hq / hkv;
    let mut y = vec![T::ZERO; b * hq * sq * dv];
    let mut qk_out = vec![T::ZERO; if want_qk { b * hq * sq * skv } else { 0 }];
    let head = |bh: usize, yh: &mut [T], qh: &mut [T]| {
        let (bi, h) = (bh / hq, bh % hq);
        let kvh = bi * hkv + h / rep;
        let qs = &q_data[bh * sq * d..(bh + 1) * sq * d];
        let ks = &k_use[kvh * skv * d..(kvh + 1) * skv * d];
        let vs = &vd[kvh * skv * dv..(kvh + 1) * skv * dv];
        let mut s = vec![T::ZERO; sq * skv];
        gemm(
            sq,
            d,
            skv,
            alpha,
            qs,
            (d, 1),
            ks,
            (1, d),
            T::ZERO,
            &mut s,
            (skv, 1),
        );
        if lowp {
            s.iter_mut().for_each(|x| *x = rd(*x));
        }
        if let Some(c) = cap {
            let tc = rd(T::from_f64(c));
            s.iter_mut().for_each(|x| {
                let t = rd(T::from_f64(rd(*x / tc).to_f64().tanh()));
                *x = rd(t * tc);
            });
        }
        if want_qk && mode <= 1 {
            qh.copy_from_slice(&s);
        }
        let boff = bi * bst[0] + h * bst[1];
        for i in 0..sq {
            let row = &mut s[i * skv..(i + 1) * skv];
            let bo = boff + i * bst[2];
            for (j, x) in row.iter_mut().enumerate() {
                *x = rd(*x + bias[bo + j * bst[3]]);
            }
            if want_qk && mode == 2 {
                qh[i * skv..(i + 1) * skv].copy_from_slice(row);
            }
            let mut mx = T::NEG_INF;
            for &x in row.iter() {
                if x > mx {
                    mx = x;
                }
            }
            if mx == T::NEG_INF {
                row.fill(T::ZERO);
            } else {
                let mut sum = T::ZERO;
                for x in row.iter_mut() {
                    *x = rd(rd(*x - mx).exp());
                    // bf16 reductions round every partial sum (float16 ones accumulate wide).
                    sum = if dtype == DType::BF16 {
                        rd(sum + *x)
                    } else {
                        sum + *x
                    };
                }
                let sum = rd(sum);
                for x in row.iter_mut() {
                    *x = rd(*x / sum);
                }
            }
            if want_qk && mode >= 3 {
                qh[i * skv..(i + 1) * skv].copy_from_slice(row);
            }
        }
        gemm(
            sq,
            skv,
            dv,
            T::ONE,
            &s,
            (skv, 1),
            vs,
            (dv, 1),
            T::ZERO,
            yh,
            (dv, 1),
        );
    };
    let chunk_y = (sq * dv).max(1);
    let chunk_q = (sq * skv).max(1);
    if want_qk {
        y.chunks_mut(chunk_y)
            .zip(qk_out.chunks_mut(chunk_q))
            .enumerate()
            .for_each(|(i, (yh, qh))| head(i, yh, qh));
    } else if b * hq > 1 && b * hq * sq * skv * d >= 1 << 18 {
        y.par_chunks_mut(chunk_y)
            .enumerate()
            .for_each(|(i, yh)| head(i, yh, &mut []));
    } else {
        y.chunks_mut(chunk_y)
            .enumerate()
            .for_each(|(i, yh)| head(i, yh, &mut []));
    }
    let (y, yshape) = if three_d {
        (
            gather_strided(&y, &[b, sq, hq, dv], &[hq * sq * dv, dv, sq * dv, 1]),
            vec![b, sq, hq * dv],
        )
    } else {
        (y, vec![b, hq, sq, dv])
    };
    let mut outs = vec![Some(T::store(dtype, yshape, y)?.into())];
    outs.push(Some(T::store(kt.dtype, vec![b, hkv, skv, d], kd)?.into()));
    outs.push(Some(T::store(vt.dtype, vec![b, hkv, skv, dv], vd)?.into()));
    if want_qk {
        outs.push(Some(T::store(dtype, vec![b, hq, sq, skv], qk_out)?.into()));
    }
    Ok(outs)
}

/// Strides of a 4-D broadcastable shape (0 on size-1 dims).
fn bstrides(shape: &[usize]) -> Vec<usize> {
    let st = crate::ops::util::strides(shape);
    shape
        .iter()
        .zip(st)
        .map(|(&d, s)| if d == 1 { 0 } else { s })
        .collect()
}

/// Attention.
pub(super) fn attention_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let q = tensor(cx, inputs, 0)?;
    if !is_float(q.dtype) {
        return Err(cx.unsupported(format!("Attention on {}", q.dtype)));
    }
    by_real!(q.dtype, attention_float(cx, inputs))
}

fn rotary_float<T: Real>(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
) -> Result<Tensor, KernelError> {
    let Op::RotaryEmbedding {
        interleaved,
        num_heads,
        rotary_embedding_dim,
    } = &cx.node.op
    else {
        return Err(cx.invalid("not a RotaryEmbedding"));
    };
    let x = tensor(cx, inputs, 0)?;
    let cos = tensor(cx, inputs, 1)?;
    let sin = tensor(cx, inputs, 2)?;
    let pos = opt_tensor(inputs, 3);
    let xv = T::load(x)?;
    let cv = T::load(cos)?;
    let sv = T::load(sin)?;
    // Logical layout [B, S, H, D] with strides into x.
    let (b, s, h, d, st) = match x.shape.as_slice() {
        &[b, h, s, d] => (b, s, h, d, [h * s * d, d, s * d]),
        &[b, s, hidden] => {
            let h = num_heads
                .filter(|&n| n > 0 && hidden % n as usize == 0)
                .ok_or_else(|| {
                    cx.invalid(format!("num_heads must divide {hidden} for 3-D input"))
                })? as usize;
            let d = hidden / h;
            (b, s, h, d, [s * hidden, hidden, d])
        }
        sh => return Err(cx.invalid(format!("input {sh:?} must be 3-D or 4-D"))),
    };
    let rd = match rotary_embedding_dim {
        Some(r) if *r > 0 => *r as usize,
        _ => d,
    };
    if rd > d || rd % 2 != 0 {
        return Err(cx.invalid(format!(
            "rotary_embedding_dim {rd} does not fit head size {d}"
        )));
    }
    let half = rd / 2;
    if cos.shape.last() != Some(&half) || sin.shape != cos.shape {
        return Err(cx.invalid(format!(
            "cos/sin caches {:?} / {:?} must end in {half}",
            cos.shape, sin.shape
        )));
    }
    let pids: Option<Vec<i64>> = pos.map(|p| p.to_i64()).transpose()?;
    // Row of the caches for (batch, position).
    let cache_row = |bi: usize, si: usize| -> Result<usize, KernelError> {
        match &pids {
            Some(p) => {
                let idx = match p.len() {
                    1 => p[0] + si as i64,
                    _ if p.len() == b * s => p[bi * s + si],
                    _ if p.len() == s => p[si],
                    n => return Err(cx.invalid(format!("position_ids has {n} entries"))),
                };
                let rows = cos.len() / half.max(1);
                if idx < 0 || idx as usize >= rows {
                    return Err(cx.invalid(format!(
                        "position id {idx} is outside the {rows} cache rows"
                    )));
                }
                Ok(idx as usize)
            }
            None => match cos.shape.as_slice() {
                &[cb, cs, _] if (cb == b || cb == 1) && cs == s => {
                    Ok(if cb == 1 { si } else { bi * s + si })
                }
                &[cs, _] if cs == s => Ok(si),
                sh => Err(cx.invalid(format!("cos_cache {sh:?} does not fit [{b}, {s}, {half}]"))),
            },
        }
    };
    let mut y = xv.to_vec();
    let inter = interleaved.unwrap_or(0) != 0;
    for bi in 0..b {
        for si in 0..s {
            let r = cache_row(bi, si)?;
            let c = &cv[r * half..(r + 1) * half];
            let sn = &sv[r * half..(r + 1) * half];
            for hi in 0..h {
                let o = bi * st[0] + si * st[1] + hi * st[2];
                let xr = &xv[o..o + d];
                let yr = &mut y[o..o + d];
                for i in 0..half {
                    let (i1, i2) = if inter {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let (x1, x2) = (xr[i1], xr[i2]);
                    yr[i1] = c[i] * x1 - sn[i] * x2;
                    yr[i2] = sn[i] * x1 + c[i] * x2;
                }
            }
        }
    }
    T::store(x.dtype, x.shape.clone(), y)
}

/// RotaryEmbedding.
pub(super) fn rotary_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if !is_float(x.dtype) {
        return Err(cx.unsupported(format!("RotaryEmbedding on {}", x.dtype)));
    }
    let y = by_real!(x.dtype, rotary_float(cx, inputs))?;
    Ok(vec![Some(y.into())])
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, f32t, out, run_op};
    use crate::tensor::{Data, Tensor};
    use mmq_ir::{DType, Op};

    fn attn(causal: Option<i64>, heads: Option<(i64, i64)>) -> Op {
        Op::Attention {
            is_causal: causal,
            kv_num_heads: heads.map(|h| h.1),
            left_window_size: None,
            q_num_heads: heads.map(|h| h.0),
            qk_matmul_output_mode: None,
            right_window_size: None,
            scale: Some(1.0),
            softcap: None,
            softmax_precision: None,
        }
    }

    #[test]
    fn attention_causal_and_mask() {
        // One head, 2 queries, 2 keys, dim 1.
        let q = [1.0f32, 1.0];
        let k = [0.0f32, 2f32.ln()];
        let v = [1.0f32, 4.0];
        let r = run_op(
            attn(None, None),
            vec![
                f32t(&[1, 1, 2, 1], &q),
                f32t(&[1, 1, 2, 1], &k),
                f32t(&[1, 1, 2, 1], &v),
            ],
            1,
            23,
        )
        .expect("run");
        // weights 1/3, 2/3 → 3.
        close(&out(&r, 0).1, &[3.0, 3.0], 1e-5);
        let r = run_op(
            attn(Some(1), None),
            vec![
                f32t(&[1, 1, 2, 1], &q),
                f32t(&[1, 1, 2, 1], &k),
                f32t(&[1, 1, 2, 1], &v),
            ],
            1,
            23,
        )
        .expect("run");
        close(&out(&r, 0).1, &[1.0, 3.0], 1e-5);
        // Bool mask hiding key 0, 3-D inputs with GQA (2 q heads, 1 kv head).
        let mask = Tensor::new(
            DType::Bool,
            vec![2, 2],
            Data::Bool(vec![false, true, false, true]),
        )
        .expect("t");
        let r = run_op(
            attn(None, Some((2, 1))),
            vec![
                f32t(&[1, 2, 2], &[1.0, 1.0, 1.0, 1.0]),
                f32t(&[1, 2, 1], &k),
                f32t(&[1, 2, 1], &v),
                Some(mask),
            ],
            1,
            23,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![1, 2, 2], vec![4.0; 4]));
    }

    #[test]
    fn attention_past_kv() {
        let r = run_op(
            attn(Some(1), None),
            vec![
                f32t(&[1, 1, 1, 1], &[1.0]),
                f32t(&[1, 1, 1, 1], &[2f32.ln()]),
                f32t(&[1, 1, 1, 1], &[4.0]),
                None,
                f32t(&[1, 1, 1, 1], &[0.0]),
                f32t(&[1, 1, 1, 1], &[1.0]),
            ],
            3,
            23,
        )
        .expect("run");
        close(&out(&r, 0).1, &[3.0], 1e-5);
        assert_eq!(out(&r, 2), (vec![1, 1, 2, 1], vec![1.0, 4.0]));
    }

    #[test]
    fn rotary_basic() {
        // 4-D [1,1,1,4], half = 2, cos = [0, 1], sin = [1, 0] (90° on pair 0, identity on 1).
        let op = |inter: i64| Op::RotaryEmbedding {
            interleaved: Some(inter),
            num_heads: None,
            rotary_embedding_dim: None,
        };
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let ins = || {
            vec![
                f32t(&[1, 1, 1, 4], &x),
                f32t(&[1, 1, 2], &[0.0, 1.0]),
                f32t(&[1, 1, 2], &[1.0, 0.0]),
            ]
        };
        let r = run_op(op(0), ins(), 1, 23).expect("run");
        // pairs (x0,x2), (x1,x3): pair0 → (-3, 1)
        assert_eq!(out(&r, 0).1, vec![-3.0, 2.0, 1.0, 4.0]);
        let r = run_op(op(1), ins(), 1, 23).expect("run");
        // pairs (x0,x1) → (-2, 1); (x2,x3) identity
        assert_eq!(out(&r, 0).1, vec![-2.0, 1.0, 3.0, 4.0]);
    }
}
