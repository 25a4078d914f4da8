//! Inference rules of the long-tail default-domain ops: recurrent layers, sequences, signal
//! processing, losses, vision and string ops. Each gives what the op determines from its
//! operands' types, shape values and attributes; dims that depend on the data (how many boxes
//! survive suppression, how many elements are unique) stay unknown.

use super::Cx;
use super::ops::{dims_unknown, dtype_code, norm_axis, same, scalar_dim, scale_dim, shape_of, t};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::types::Type;

/// `RNN`, `GRU`, `LSTM`: `Y` `[seq, dirs, batch, hidden]` (`layout` 1: `[batch, seq, dirs,
/// hidden]`), then `Y_h` (and `LSTM`'s `Y_c`) `[dirs, batch, hidden]` (`layout` 1: `[batch,
/// dirs, hidden]`). The hidden size is the attribute or `R`'s last dim.
pub(super) fn recurrent(
    cx: &Cx,
    direction: Option<&str>,
    hidden: Option<i64>,
    layout: Option<i64>,
    results: usize,
) -> Vec<Type> {
    let dirs = Dim::known(if direction == Some("bidirectional") {
        2
    } else {
        1
    });
    let hidden = hidden
        .map(Dim::known)
        .or_else(|| cx.shape(2).and_then(|r| r.get(2).cloned()))
        .unwrap_or(Dim::Unknown);
    let batch_first = layout.unwrap_or(0) == 1;
    let (seq, batch) = match cx.shape(0) {
        Some([a, b, _]) if batch_first => (b.clone(), a.clone()),
        Some([a, b, _]) => (a.clone(), b.clone()),
        _ => (Dim::Unknown, Dim::Unknown),
    };
    let dtype = cx.dtype(0);
    let (y, last) = if batch_first {
        (
            vec![batch.clone(), seq, dirs.clone(), hidden.clone()],
            vec![batch, dirs, hidden],
        )
    } else {
        (
            vec![seq, dirs.clone(), batch.clone(), hidden.clone()],
            vec![dirs, batch, hidden],
        )
    };
    let mut out = vec![t(dtype, Some(y))];
    out.extend((1..results).map(|_| t(dtype, Some(last.clone()))));
    out
}

/// The element type of the sequence operand `i`.
fn element(cx: &Cx, i: usize) -> Type {
    match cx.ty(i) {
        Some(Type::Sequence(e)) => (**e).clone(),
        _ => Type::Unknown,
    }
}

/// A tensor type of `dtype` whose shape is `shape` with dim `axis` unknown (inserted there
/// when `insert`), or of unknown shape.
fn with_axis_unknown(dtype: Option<DType>, shape: Option<&[Dim]>, axis: i64, insert: bool) -> Type {
    let shape = shape.and_then(|s| {
        let mut s = s.to_vec();
        let rank = s.len() + usize::from(insert);
        let a = norm_axis(axis, rank)?;
        if insert {
            s.insert(a, Dim::Unknown);
        } else {
            s[a] = Dim::Unknown;
        }
        Some(s)
    });
    t(dtype, shape)
}

/// The sequence and optional ops (`SequenceMap`'s results come from its body: none here).
pub(super) fn sequence(cx: &Cx) -> Vec<Type> {
    use crate::op::Op;
    let seq_of = |e: Type| Type::Sequence(Box::new(e));
    let scalar = |d: DType| Type::tensor(d, Vec::new());
    match &cx.node.op {
        Op::OptionalHasElement {} => vec![scalar(DType::Bool)],
        Op::OptionalGetElement {} => vec![match cx.ty(0) {
            Some(Type::Optional(e)) => (**e).clone(),
            Some(other) => other.clone(),
            None => Type::Unknown,
        }],
        Op::SequenceEmpty { dtype } => {
            vec![seq_of(t(dtype_code(*dtype).or(Some(DType::F32)), None))]
        }
        Op::SequenceConstruct {} => {
            let first = cx.ty(0).cloned().unwrap_or(Type::Unknown);
            let e = (1..cx.num_inputs()).fold(first, |acc, i| {
                super::ops::unify_types(&acc, cx.ty(i).unwrap_or(&Type::Unknown))
            });
            vec![seq_of(e)]
        }
        Op::SequenceLength {} => vec![scalar(DType::I64)],
        Op::SequenceAt {} => vec![element(cx, 0)],
        Op::SequenceInsert {} | Op::SequenceErase {} => {
            vec![cx.ty(0).cloned().unwrap_or(Type::Unknown)]
        }
        // One element per split; the split axis's length varies (or is dropped when no split
        // is given and `keepdims` is 0).
        Op::SplitToSequence { axis, keepdims, .. } => {
            let axis = axis.unwrap_or(0);
            let e = match cx.shape(0) {
                Some(s) if cx.input(1).is_none() && keepdims.unwrap_or(1) == 0 => {
                    let s = norm_axis(axis, s.len()).map(|a| {
                        let mut s = s.to_vec();
                        s.remove(a);
                        s
                    });
                    t(cx.dtype(0), s)
                }
                s => with_axis_unknown(cx.dtype(0), s, axis, false),
            };
            vec![seq_of(e)]
        }
        Op::ConcatFromSequence { axis, new_axis } => {
            let e = element(cx, 0);
            let tt = e.as_tensor();
            vec![with_axis_unknown(
                tt.and_then(|x| x.dtype),
                tt.and_then(|x| x.shape.as_deref()),
                axis.unwrap_or(0),
                new_axis.unwrap_or(0) != 0,
            )]
        }
        _ => Vec::new(),
    }
}

/// `Compress`: the flattened selection (no axis), or the input with `axis` shortened.
pub(super) fn compress(cx: &Cx, axis: Option<i64>) -> Type {
    match axis {
        Some(a) => with_axis_unknown(cx.dtype(0), cx.shape(0), a, false),
        None => t(cx.dtype(0), Some(vec![Dim::Unknown])),
    }
}

/// `Det`: the input less its last two axes.
pub(super) fn det(cx: &Cx) -> Type {
    let shape = cx
        .shape(0)
        .and_then(|s| s.len().checked_sub(2).map(|r| s[..r].to_vec()));
    t(cx.dtype(0), shape)
}

/// The windows: `[size]` of `output_datatype` (default float).
pub(super) fn window(cx: &Cx, output_datatype: Option<i64>) -> Type {
    t(
        dtype_code(Some(output_datatype.unwrap_or(1))),
        Some(vec![scalar_dim(cx, 0)]),
    )
}

/// `StringSplit`: the substrings `[..., max count]` and the counts `[...]`.
pub(super) fn string_split(cx: &Cx) -> Vec<Type> {
    let parts = shape_of(cx, 0).map(|mut s| {
        s.push(Dim::Unknown);
        s
    });
    vec![
        t(Some(DType::String), parts),
        t(Some(DType::I64), shape_of(cx, 0)),
    ]
}

/// `StringNormalizer`: stop words may remove elements along the last axis.
pub(super) fn string_normalizer(cx: &Cx) -> Type {
    let shape = shape_of(cx, 0).map(|mut s| {
        if let Some(l) = s.last_mut() {
            *l = Dim::Unknown;
        }
        s
    });
    t(Some(DType::String), shape)
}

/// `Unique`: the unique elements (flattened, or slices along `axis`), their first indices,
/// the inverse indices and the counts (i64, 1-D).
pub(super) fn unique(cx: &Cx, axis: Option<i64>) -> Vec<Type> {
    let y = match axis {
        Some(a) => with_axis_unknown(cx.dtype(0), cx.shape(0), a, false),
        None => t(cx.dtype(0), Some(vec![Dim::Unknown])),
    };
    let idx = || t(Some(DType::I64), Some(vec![Dim::Unknown]));
    vec![y, idx(), idx(), idx()]
}

/// `CenterCropPad`: the input with the `axes` (default all) set to the shape input.
pub(super) fn center_crop_pad(cx: &Cx, axes: Option<&[i64]>) -> Type {
    let Some(mut s) = shape_of(cx, 0) else {
        return t(cx.dtype(0), None);
    };
    let rank = s.len();
    let axes: Vec<i64> = axes.map_or_else(|| (0..rank as i64).collect(), <[i64]>::to_vec);
    let vals = cx.vals(1);
    for (k, a) in axes.iter().enumerate() {
        let Some(a) = norm_axis(*a, rank) else {
            return t(cx.dtype(0), None);
        };
        s[a] = vals.and_then(|v| v.get(k).cloned()).unwrap_or(Dim::Unknown);
    }
    t(cx.dtype(0), Some(s))
}

/// `Col2Im`: `[N, C * prod(block), L]` to `[N, C, *image_shape]`.
pub(super) fn col2im(cx: &Cx) -> Type {
    let (n, cb) = match cx.shape(0) {
        Some([n, cb, _]) => (n.clone(), cb.clone()),
        _ => (Dim::Unknown, Dim::Unknown),
    };
    let block: Option<i64> = cx.ints(2).map(|b| b.iter().product());
    let c = match block {
        Some(b) if b > 0 => cb.floor_div(&Dim::known(b)),
        _ => Dim::Unknown,
    };
    let image = cx
        .vals(1)
        .map(<[Dim]>::to_vec)
        .or_else(|| Some(dims_unknown(cx.shape(1)?.first()?.as_known()? as usize)));
    let shape = image.map(|img| {
        let mut s = vec![n, c];
        s.extend(img);
        s
    });
    t(cx.dtype(0), shape)
}

/// `DFT`: the input with the transformed axis resized (half plus one when one-sided) and a
/// last axis of 2 (real, imaginary); a one-sided inverse gives real samples (last axis 1). The axis is an input from opset 20 (default -2), an
/// attribute before (default 1); `dft_length` is input 1.
pub(super) fn dft(cx: &Cx, axis_attr: Option<i64>, onesided: bool, inverse: bool) -> Type {
    let Some(mut s) = shape_of(cx, 0) else {
        return t(cx.dtype(0), None);
    };
    let axis = if cx.opset >= 20 {
        if cx.input(2).is_some() {
            cx.int(2)
        } else {
            Some(-2)
        }
    } else {
        Some(axis_attr.unwrap_or(1))
    };
    let rank = s.len();
    if let Some(a) = axis.and_then(|a| norm_axis(a, rank)) {
        let length = cx.input(1).is_some().then(|| scalar_dim(cx, 1));
        s[a] = match (onesided, inverse, length) {
            // The inverse of a one-sided spectrum of `n` bins is `2 (n - 1)` real samples.
            (true, true, None) => s[a].sub(&Dim::known(1)).mul(&Dim::known(2)),
            (true, false, n) => n
                .unwrap_or_else(|| s[a].clone())
                .floor_div(&Dim::known(2))
                .add(&Dim::known(1)),
            (_, _, n) => n.unwrap_or_else(|| s[a].clone()),
        };
    } else {
        s = dims_unknown(rank);
    }
    if let Some(l) = s.last_mut() {
        *l = Dim::known(if onesided && inverse { 1 } else { 2 });
    }
    t(cx.dtype(0), Some(s))
}

/// `STFT`: `[batch, frames, bins, 2]` with `frames = (len - frame_length) / frame_step + 1`
/// and `bins = frame_length / 2 + 1` when one-sided.
pub(super) fn stft(cx: &Cx, onesided: bool) -> Type {
    let (batch, len) = match cx.shape(0) {
        Some([b, l, _]) => (b.clone(), l.clone()),
        _ => (Dim::Unknown, Dim::Unknown),
    };
    let frame = if cx.input(3).is_some() {
        scalar_dim(cx, 3)
    } else {
        cx.shape(2)
            .and_then(|w| w.first().cloned())
            .unwrap_or(Dim::Unknown)
    };
    let frames = match (
        scalar_dim(cx, 1).as_known(),
        frame.as_known(),
        len.as_known(),
    ) {
        (Some(step), Some(f), Some(l)) if step > 0 && l >= f => Dim::known((l - f) / step + 1),
        _ => Dim::Unknown,
    };
    let bins = if onesided {
        frame.floor_div(&Dim::known(2)).add(&Dim::known(1))
    } else {
        frame
    };
    t(cx.dtype(0), Some(vec![batch, frames, bins, Dim::known(2)]))
}

/// `GridSample`: `[N, C, *grid's spatial dims]`.
pub(super) fn grid_sample(cx: &Cx) -> Type {
    let shape = match (cx.shape(0), cx.shape(1)) {
        (Some(x), Some(g)) if x.len() >= 2 && g.len() == x.len() => {
            let mut s = x[..2].to_vec();
            s.extend_from_slice(&g[1..g.len() - 1]);
            Some(s)
        }
        (Some(x), _) => Some(dims_unknown(x.len())),
        _ => None,
    };
    t(cx.dtype(0), shape)
}

/// `MaxUnpool`: the `output_shape` input, else `(in - 1) * stride + kernel - pads` per
/// spatial axis.
pub(super) fn max_unpool(
    cx: &Cx,
    kernel: Option<&[i64]>,
    pads: Option<&[i64]>,
    strides: Option<&[i64]>,
) -> Type {
    if cx.input(2).is_some() {
        return t(cx.dtype(0), cx.vals(2).map(<[Dim]>::to_vec));
    }
    let shape = match (cx.shape(0), kernel) {
        (Some(x), Some(k)) if x.len() == k.len() + 2 => {
            let sp = k.len();
            let mut s = x[..2].to_vec();
            for (i, &kk) in k.iter().enumerate() {
                let stride = strides.and_then(|v| v.get(i)).copied().unwrap_or(1);
                let pad = pads.map_or(0, |p| {
                    p.get(i).copied().unwrap_or(0) + p.get(i + sp).copied().unwrap_or(0)
                });
                s.push(
                    x[i + 2]
                        .sub(&Dim::known(1))
                        .mul(&Dim::known(stride))
                        .add(&Dim::known(kk - pad)),
                );
            }
            Some(s)
        }
        _ => None,
    };
    t(cx.dtype(0), shape)
}

/// `TfIdfVectorizer`: `[max(ngram_indexes) + 1]`, batched for a 2-D input; float.
pub(super) fn tfidf(cx: &Cx, ngram_indexes: Option<&[i64]>) -> Type {
    let k = ngram_indexes
        .and_then(|v| v.iter().max())
        .map_or(Dim::Unknown, |m| Dim::known(m + 1));
    let shape = match cx.shape(0) {
        Some([_]) => Some(vec![k]),
        Some([n, _]) => Some(vec![n.clone(), k]),
        _ => None,
    };
    t(Some(DType::F32), shape)
}

/// `MelWeightMatrix`: `[dft_length / 2 + 1, num_mel_bins]` of `output_datatype`.
pub(super) fn mel_weight_matrix(cx: &Cx, output_datatype: Option<i64>) -> Type {
    let bins = scalar_dim(cx, 1)
        .floor_div(&Dim::known(2))
        .add(&Dim::known(1));
    t(
        dtype_code(Some(output_datatype.unwrap_or(1))),
        Some(vec![bins, scalar_dim(cx, 0)]),
    )
}

/// `RoiAlign`: `[num_rois, C, output_height, output_width]`.
pub(super) fn roi_align(cx: &Cx, height: Option<i64>, width: Option<i64>) -> Type {
    let rois = cx
        .shape(1)
        .and_then(|r| r.first().cloned())
        .unwrap_or(Dim::Unknown);
    let c = cx
        .shape(0)
        .and_then(|x| x.get(1).cloned())
        .unwrap_or(Dim::Unknown);
    t(
        cx.dtype(0),
        Some(vec![
            rois,
            c,
            Dim::known(height.unwrap_or(1)),
            Dim::known(width.unwrap_or(1)),
        ]),
    )
}

/// `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss`: the loss per target element
/// (`reduction` none) or a scalar, then (the latter) the log-probabilities.
pub(super) fn loss(cx: &Cx, reduction: Option<&str>, log_prob: bool) -> Vec<Type> {
    let shape = if reduction == Some("none") {
        shape_of(cx, 1)
    } else {
        Some(Vec::new())
    };
    let mut out = vec![t(cx.dtype(0), shape)];
    if log_prob {
        out.push(same(cx, 0));
    }
    out
}

/// `BitCast`: the input's shape where the widths agree; otherwise the last axis changes.
pub(super) fn bit_cast(cx: &Cx, to: Option<i64>) -> Type {
    let to = dtype_code(to);
    let shape = match (cx.dtype(0), to) {
        (Some(a), Some(b)) if a.bits() == b.bits() => shape_of(cx, 0),
        _ => None,
    };
    t(to, shape)
}

/// `AffineGrid`: `[N, H, W, 2]` for size `[N, C, H, W]`, `[N, D, H, W, 3]` for
/// `[N, C, D, H, W]`.
pub(super) fn affine_grid(cx: &Cx) -> Type {
    let size = cx.vals(1).map(<[Dim]>::to_vec).or_else(|| {
        let k = cx.shape(1)?.first()?.as_known()?;
        Some(dims_unknown(usize::try_from(k).ok()?.min(5)))
    });
    let shape = size.filter(|s| s.len() >= 3).map(|s| {
        let spatial = s.len() - 2;
        let mut out = vec![s[0].clone()];
        out.extend_from_slice(&s[2..]);
        out.push(Dim::known(spatial as i64));
        out
    });
    t(cx.dtype(0), shape)
}

/// `Upsample`: each dim times its scale (the input from opset 9, the attribute before).
pub(super) fn upsample(cx: &Cx, scales_attr: Option<&[f32]>) -> Type {
    let scales: Option<Vec<f64>> = if cx.input(1).is_some() {
        cx.floats(1)
    } else {
        scales_attr.map(|s| s.iter().map(|&x| f64::from(x)).collect())
    };
    let shape = match (cx.shape(0), scales) {
        (Some(x), Some(sc)) if sc.len() == x.len() => {
            Some(x.iter().zip(&sc).map(|(d, &s)| scale_dim(d, s)).collect())
        }
        (Some(x), _) => Some(dims_unknown(x.len())),
        _ => None,
    };
    t(cx.dtype(0), shape)
}

/// `EyeLike`: the input's shape, of `dtype` (default the input's).
pub(super) fn eye_like(cx: &Cx, dtype: Option<i64>) -> Type {
    t(dtype_code(dtype).or(cx.dtype(0)), shape_of(cx, 0))
}
