//! Recurrent layers kept as custom default-domain ops: `RNN`, `GRU`, `LSTM` (ONNX gate orders
//! `z r h` and `i o f c`, optional bias, initial states, peepholes, sequence lengths, clip,
//! activations, both layouts, forward / reverse / bidirectional).

use mmq_ir::{Attr, CustomOp, OpKind};
use multiversion::multiversion;

use super::{Tail, attr, attr_i64, attr_str};
use crate::error::KernelError;
use crate::ops::linalg::gemm;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

/// `f(x, alpha, beta)`.
type ActFn = fn(f64, f64, f64) -> f64;

/// An activation function with its alpha and beta.
#[derive(Clone, Copy)]
struct Act {
    f: ActFn,
    alpha: f64,
    beta: f64,
}

impl Act {
    fn apply(self, x: f64) -> f64 {
        (self.f)(x, self.alpha, self.beta)
    }
}

/// The activation named `name` with ONNX's default alpha / beta.
fn activation(name: &str) -> Option<(ActFn, f64, f64)> {
    Some(match name.to_ascii_lowercase().as_str() {
        "sigmoid" => (|x, _, _| 1.0 / (1.0 + (-x).exp()), 0.0, 0.0),
        "tanh" => (|x, _, _| x.tanh(), 0.0, 0.0),
        "relu" => (|x, _, _| x.max(0.0), 0.0, 0.0),
        "affine" => (|x, a, b| a * x + b, 1.0, 0.0),
        "leakyrelu" => (|x, a, _| if x < 0.0 { a * x } else { x }, 0.01, 0.0),
        "thresholdedrelu" => (|x, a, _| if x > a { x } else { 0.0 }, 1.0, 0.0),
        "scaledtanh" => (|x, a, b| a * (b * x).tanh(), 1.0, 1.0),
        "hardsigmoid" => (|x, a, b| (a * x + b).clamp(0.0, 1.0), 0.2, 0.5),
        "elu" => (
            |x, a, _| if x < 0.0 { a * (x.exp() - 1.0) } else { x },
            1.0,
            0.0,
        ),
        "softsign" => (|x, _, _| x / (1.0 + x.abs()), 0.0, 0.0),
        "softplus" => (|x, _, _| (1.0 + x.exp()).ln(), 0.0, 0.0),
        _ => return None,
    })
}

/// Runs the op when it is `RNN`, `GRU` or `LSTM`.
pub(super) fn eval(t: Tail<'_, '_>) -> Option<OpResult> {
    let (cx, kind, c, inputs) = (t.cx, t.kind, t.c, t.inputs);
    let kind = match kind {
        OpKind::RNN => Kind::Rnn,
        OpKind::GRU => Kind::Gru,
        OpKind::LSTM => Kind::Lstm,
        _ => return None,
    };
    Some(recurrent(cx, c, inputs, kind))
}

fn recurrent(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>], kind: Kind) -> OpResult {
    let gates = match kind {
        Kind::Rnn => 1,
        Kind::Gru => 3,
        Kind::Lstm => 4,
    };
    let x = tensor(cx, inputs, 0)?;
    let w = tensor(cx, inputs, 1)?;
    let r = tensor(cx, inputs, 2)?;
    let layout = attr_i64(c, "layout", 0);
    let dirs_names: &[bool] = match attr_str(c, "direction").unwrap_or("forward") {
        "forward" => &[false],
        "reverse" => &[true],
        "bidirectional" => &[false, true],
        d => return Err(cx.invalid(format!("unknown direction '{d}'"))),
    };
    let nd = dirs_names.len();
    if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
        return Err(cx.invalid("X, W and R must be 3-d"));
    }
    let (seq, batch, isz) = if layout == 0 {
        (x.shape[0], x.shape[1], x.shape[2])
    } else {
        (x.shape[1], x.shape[0], x.shape[2])
    };
    let hs = match attr(c, "hidden_size") {
        Some(Attr::Int(h)) if *h > 0 => *h as usize,
        _ => r.shape[2],
    };
    if w.shape != [nd, gates * hs, isz] || r.shape != [nd, gates * hs, hs] {
        return Err(cx.invalid(format!(
            "W {:?} / R {:?} do not match {nd} directions, {gates} gates, hidden {hs}, input {isz}",
            w.shape, r.shape
        )));
    }
    let xv = x.to_f64()?;
    // An f32 W: X Wᵀ as one SGEMM (an f32 X over many steps) or over W's f32 rows
    // (`mat_rows`), with no f64 copy of W, which cost more than the products (a 2048 x 512 W:
    // 8 MB written and faulted in at every run); other types: one f64 GEMM.
    let w32 = match &w.data {
        Data::F32(v) => Some(v.as_slice()),
        _ => None,
    };
    let wv = if w32.is_some() {
        Vec::new()
    } else {
        w.to_f64()?
    };
    // R in f64 is only needed when it is not f32 (the products read its f32 rows) or for
    // GRU's reset product.
    let rv = if matches!(r.data, Data::F32(_)) && kind != Kind::Gru {
        Vec::new()
    } else {
        r.to_f64()?
    };
    let read = |i: usize, len: usize, what: &str| -> Result<Option<Vec<f64>>, KernelError> {
        match opt_tensor(inputs, i) {
            Some(t) if t.len() == len => Ok(Some(t.to_f64()?)),
            Some(t) => Err(cx.invalid(format!("{what} has shape {:?}", t.shape))),
            None => Ok(None),
        }
    };
    let bias = read(3, nd * 2 * gates * hs, "B")?;
    let lens: Vec<usize> = match opt_tensor(inputs, 4) {
        Some(t) => t
            .to_i64()?
            .iter()
            .map(|&l| l.clamp(0, seq as i64) as usize)
            .collect(),
        None => vec![seq; batch],
    };
    if lens.len() != batch {
        return Err(cx.invalid("sequence_lens needs one entry per batch"));
    }
    // Initial states in [dirs, batch, hidden] order whatever the layout.
    let state = |i: usize, what: &str| -> Result<Option<Vec<f64>>, KernelError> {
        let Some(v) = read(i, nd * batch * hs, what)? else {
            return Ok(None);
        };
        if layout == 0 {
            return Ok(Some(v));
        }
        let mut out = vec![0.0; v.len()];
        for b in 0..batch {
            for d in 0..nd {
                for h in 0..hs {
                    out[(d * batch + b) * hs + h] = v[(b * nd + d) * hs + h];
                }
            }
        }
        Ok(Some(out))
    };
    let h0 = state(5, "initial_h")?;
    let c0 = if kind == Kind::Lstm {
        state(6, "initial_c")?
    } else {
        None
    };
    let peep = if kind == Kind::Lstm {
        read(7, nd * 3 * hs, "P")?
    } else {
        None
    };
    let clip = match attr(c, "clip") {
        Some(Attr::Float(v)) => Some(f64::from(*v)),
        _ => None,
    };
    let nacts = match kind {
        Kind::Rnn => 1,
        Kind::Gru => 2,
        Kind::Lstm => 3,
    };
    let defaults: &[&str] = match kind {
        Kind::Rnn => &["Tanh"],
        Kind::Gru => &["Sigmoid", "Tanh"],
        Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
    };
    let names: Vec<String> = match attr(c, "activations") {
        Some(Attr::Strings(v)) => v.clone(),
        _ => (0..nd)
            .flat_map(|_| defaults.iter().map(|s| (*s).to_owned()))
            .collect(),
    };
    let alphas = match attr(c, "activation_alpha") {
        Some(Attr::Floats(v)) => v.clone(),
        _ => Vec::new(),
    };
    let betas = match attr(c, "activation_beta") {
        Some(Attr::Floats(v)) => v.clone(),
        _ => Vec::new(),
    };
    if names.len() != nacts * nd {
        return Err(cx.invalid(format!(
            "{} activations given, {} needed",
            names.len(),
            nacts * nd
        )));
    }
    let mut acts = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        let (f, a, b) = activation(n).ok_or_else(|| cx.unsupported(format!("activation '{n}'")))?;
        acts.push(Act {
            f,
            alpha: alphas.get(i).map_or(a, |&v| f64::from(v)),
            beta: betas.get(i).map_or(b, |&v| f64::from(v)),
        });
    }
    let linear_before_reset = attr_i64(c, "linear_before_reset", 0) != 0;
    let input_forget = attr_i64(c, "input_forget", 0) != 0;

    // Y in [seq, dirs, batch, hidden]; final states in [dirs, batch, hidden].
    let mut y = vec![0.0; seq * nd * batch * hs];
    let mut yh = vec![0.0; nd * batch * hs];
    let mut yc = vec![0.0; nd * batch * hs];
    // The row of X holding step t of batch entry b.
    let xat = |t: usize, b: usize| -> usize {
        if layout == 0 {
            t * batch + b
        } else {
            b * seq + t
        }
    };
    let gh = gates * hs;
    let mut xw = vec![0.0; gh];
    let mut hr = vec![0.0; gh];
    for (d, &reverse) in dirs_names.iter().enumerate() {
        let rd = rv.get(d * gh * hs..(d + 1) * gh * hs).unwrap_or(&[]);
        // X Wᵀ for every step at once, rows in X's own (layout) order.
        let mut xw_all = vec![0.0; seq * batch * gh];
        match w32 {
            // (An input or hidden size of 0 leaves no product to take.)
            Some(w32) if isz > 0 && gh > 0 => {
                let wd = &w32[d * gh * isz..(d + 1) * gh * isz];
                match &x.data {
                    // Many steps of an f32 X: one SGEMM, as MatMul computes X Wᵀ (f32 sums;
                    // the f64 dot products took as long as the recurrence on ddddocr).
                    Data::F32(x32) if seq * batch >= SGEMM_MIN_ROWS => {
                        let mut p = vec![0f32; seq * batch * gh];
                        gemm(
                            seq * batch,
                            isz,
                            gh,
                            1.0f32,
                            x32,
                            (isz, 1),
                            wd,
                            (1, isz),
                            0.0,
                            &mut p,
                            (gh, 1),
                        );
                        for (o, &v) in xw_all.iter_mut().zip(&p) {
                            *o = f64::from(v);
                        }
                    }
                    _ => mat_rows(wd, &xv, isz, &mut xw_all),
                }
            }
            Some(_) => {}
            None => gemm(
                seq * batch,
                isz,
                gh,
                1.0,
                &xv,
                (isz, 1),
                &wv[d * gh * isz..(d + 1) * gh * isz],
                (1, isz),
                0.0,
                &mut xw_all,
                (gh, 1),
            ),
        }
        // R's rows in f32 when R is f32: the products are the same in f64 and the per-step read
        // of R, the bound on this loop, halves.
        let r32 = match &r.data {
            Data::F32(v) => Some(&v[d * gh * hs..(d + 1) * gh * hs]),
            _ => None,
        };
        let (wb, rb) = match &bias {
            Some(bv) => (
                &bv[d * 2 * gh..d * 2 * gh + gh],
                &bv[d * 2 * gh + gh..(d + 1) * 2 * gh],
            ),
            None => (&[][..], &[][..]),
        };
        let pd = peep.as_ref().map(|p| &p[d * 3 * hs..(d + 1) * 3 * hs]);
        let act = &acts[d * nacts..(d + 1) * nacts];
        let cl = |v: f64| clip.map_or(v, |c| v.clamp(-c, c));
        for (b, &len) in lens.iter().enumerate() {
            let off = (d * batch + b) * hs;
            let mut h: Vec<f64> = h0
                .as_ref()
                .map_or(vec![0.0; hs], |v| v[off..off + hs].to_vec());
            let mut cst: Vec<f64> = c0
                .as_ref()
                .map_or(vec![0.0; hs], |v| v[off..off + hs].to_vec());
            for step in 0..len {
                let t = if reverse { len - 1 - step } else { step };
                let row = xat(t, b);
                for ((o, &v), bias) in xw
                    .iter_mut()
                    .zip(&xw_all[row * gh..(row + 1) * gh])
                    .zip(wb.iter().chain(std::iter::repeat(&0.0)))
                {
                    *o = v + bias;
                }
                match r32 {
                    Some(m) => mat_vec(m, &h, rb, &mut hr),
                    None => mat_vec(rd, &h, rb, &mut hr),
                }
                match kind {
                    Kind::Rnn => {
                        for k in 0..hs {
                            h[k] = act[0].apply(cl(xw[k] + hr[k]));
                        }
                    }
                    Kind::Gru => {
                        let mut hn = vec![0.0; hs];
                        // r ⊙ H, for the reset applied before the recurrent product.
                        let rh: Vec<f64> = (0..hs)
                            .map(|j| act[0].apply(cl(xw[hs + j] + hr[hs + j])) * h[j])
                            .collect();
                        for k in 0..hs {
                            let z = act[0].apply(cl(xw[k] + hr[k]));
                            let rg = act[0].apply(cl(xw[hs + k] + hr[hs + k]));
                            let pre = if linear_before_reset {
                                xw[2 * hs + k] + rg * hr[2 * hs + k]
                            } else {
                                // (r ⊙ H) Rh^T + Rbh.
                                let rrow = &rd[(2 * hs + k) * hs..(2 * hs + k + 1) * hs];
                                let s: f64 = rrow.iter().zip(&rh).map(|(a, b)| a * b).sum();
                                xw[2 * hs + k] + s + rb.get(2 * hs + k).copied().unwrap_or(0.0)
                            };
                            let hh = act[1].apply(cl(pre));
                            hn[k] = (1.0 - z) * hh + z * h[k];
                        }
                        h = hn;
                    }
                    Kind::Lstm => {
                        for k in 0..hs {
                            let (pi, po, pf) =
                                pd.map_or((0.0, 0.0, 0.0), |p| (p[k], p[hs + k], p[2 * hs + k]));
                            let i = act[0].apply(cl(xw[k] + hr[k] + pi * cst[k]));
                            let f = if input_forget {
                                1.0 - i
                            } else {
                                act[0].apply(cl(xw[2 * hs + k] + hr[2 * hs + k] + pf * cst[k]))
                            };
                            let cc = act[1].apply(cl(xw[3 * hs + k] + hr[3 * hs + k]));
                            cst[k] = f * cst[k] + i * cc;
                            let o = act[0].apply(cl(xw[hs + k] + hr[hs + k] + po * cst[k]));
                            h[k] = o * act[2].apply(cst[k]);
                        }
                    }
                }
                let yo = ((t * nd + d) * batch + b) * hs;
                y[yo..yo + hs].copy_from_slice(&h);
            }
            yh[off..off + hs].copy_from_slice(&h);
            yc[off..off + hs].copy_from_slice(&cst);
        }
    }
    let dtype = x.dtype;
    let (y_shape, y, yh_shape, yh, yc) = if layout == 0 {
        (vec![seq, nd, batch, hs], y, vec![nd, batch, hs], yh, yc)
    } else {
        let mut y2 = vec![0.0; y.len()];
        for t in 0..seq {
            for d in 0..nd {
                for b in 0..batch {
                    let src = ((t * nd + d) * batch + b) * hs;
                    let dst = ((b * seq + t) * nd + d) * hs;
                    y2[dst..dst + hs].copy_from_slice(&y[src..src + hs]);
                }
            }
        }
        let swap = |v: &[f64]| {
            let mut o = vec![0.0; v.len()];
            for d in 0..nd {
                for b in 0..batch {
                    let src = (d * batch + b) * hs;
                    let dst = (b * nd + d) * hs;
                    o[dst..dst + hs].copy_from_slice(&v[src..src + hs]);
                }
            }
            o
        };
        (
            vec![batch, seq, nd, hs],
            y2,
            vec![batch, nd, hs],
            swap(&yh),
            swap(&yc),
        )
    };
    let mut outs = vec![
        Some(Tensor::from_f64_as(dtype, y_shape, &y)?.into()),
        Some(Tensor::from_f64_as(dtype, yh_shape.clone(), &yh)?.into()),
    ];
    if kind == Kind::Lstm {
        outs.push(Some(Tensor::from_f64_as(dtype, yh_shape, &yc)?.into()));
    }
    Ok(outs)
}

/// `out = m · v + bias` for `m` of `out.len()` rows of `v.len()` (`bias` empty for none).
#[multiversion(targets = "simd")]
fn mat_vec<M: Copy + Into<f64>>(m: &[M], v: &[f64], bias: &[f64], out: &mut [f64]) {
    let k = v.len();
    for (g, o) in out.iter_mut().enumerate() {
        *o = dot(&m[g * k..(g + 1) * k], v) + bias.get(g).copied().unwrap_or(0.0);
    }
}

/// Steps × batch from which an f32 X Wᵀ is one SGEMM: below it, packing W for the GEMM costs
/// more than the few dot products per row of W that [`mat_rows`] takes.
const SGEMM_MIN_ROWS: usize = 16;

/// Rows of X a pass over `m` serves in [`mat_rows`].
const ROWS_PER_PASS: usize = 8;

/// `out[r] = m · xs[r]` for every row `r` (`k` wide) of `xs`, as [`mat_vec`] computes each
/// (`out` holds `m`'s row count per row of `xs`); each row of `m` serves
/// [`ROWS_PER_PASS`] rows of `xs` while it is in cache.
#[multiversion(targets = "simd")]
fn mat_rows(m: &[f32], xs: &[f64], k: usize, out: &mut [f64]) {
    let g_n = m.len() / k;
    for (xb, ob) in xs
        .chunks(ROWS_PER_PASS * k)
        .zip(out.chunks_mut(ROWS_PER_PASS * g_n))
    {
        for (g, row) in m.chunks_exact(k).enumerate() {
            for (r, x) in xb.chunks_exact(k).enumerate() {
                ob[r * g_n + g] = dot(row, x) + 0.0;
            }
        }
    }
}

/// `row · v` in f64 over eight partial sums (vectorized), then the remainder in order.
#[inline(always)]
fn dot<M: Copy + Into<f64>>(row: &[M], v: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (rc, vc) = (row.chunks_exact(8), v.chunks_exact(8));
    let (rr, vr) = (rc.remainder(), vc.remainder());
    for (a, b) in rc.zip(vc) {
        for i in 0..8 {
            acc[i] += a[i].into() * b[i];
        }
    }
    let mut sum = acc.iter().sum::<f64>();
    for (a, b) in rr.iter().zip(vr) {
        sum += (*a).into() * b;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::{ROWS_PER_PASS, mat_rows, mat_vec};

    /// Every row of `mat_rows` is bit for bit `mat_vec`'s, also for a last pass of fewer rows
    /// and widths that leave a remainder after the eight partial sums.
    #[test]
    fn mat_rows_is_mat_vec_per_row() {
        let (k, g) = (13usize, 5usize);
        let rows = 2 * ROWS_PER_PASS + 3;
        let m: Vec<f32> = (0..g * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let xs: Vec<f64> = (0..rows * k)
            .map(|i| ((i * 53 % 97) as f64 - 48.0) / 3.0)
            .collect();
        let mut out = vec![f64::NAN; rows * g];
        mat_rows(&m, &xs, k, &mut out);
        for (x, o) in xs.chunks_exact(k).zip(out.chunks_exact(g)) {
            let mut want = vec![0.0; g];
            mat_vec(&m, x, &[], &mut want);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(o), bits(&want));
        }
    }
}
