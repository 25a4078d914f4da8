//! `transformer` / attention: the scaled dot-product attention of transformer exports becomes
//! one fused op.
//!
//! The exports compute `Transpose(MatMul(Softmax(QKᵀ·c [+ bias]), V), [0, 2, 1, 3])` with `Q`,
//! `Kᵀ` and `V` split into heads (`[B, N, S, H]`, `[B, N, H, T]`, `[B, N, T, H]`). Small
//! normalizing rules move a scalar scale written elsewhere (a `Div` after `QKᵀ`, a `Mul` on `Q`
//! or on `K`, two scales in a row) to the one place the fusion reads it, so one pattern covers
//! them all. On ONNX Runtime the fused op is `com.microsoft.MultiHeadAttention` with the query
//! as `[B, S, N*H]`, key and value in the `[B, N, T, H]` form the graph computes (a
//! concatenated KV cache or grouped-query heads repeated by the graph stay as they are, so
//! the cache outputs do not change), the additive mask as `attention_bias` and the graph's
//! scale as `scale`. The generic target has no fused form here (standard `Attention` needs
//! opset 23).

use egg::{Id, Subst};
use mmq_ir::{DType, Dim, Op, OpKind, Type};

use super::*;
use crate::egraph::lang::TNode;

/// The value of class `id` when it is one number known at compile time: a one-element
/// constant, or `Mul`/`Div`/`Reciprocal`/`Sqrt` of such (the const-expressions the normalizing
/// rules build). Reads values, computes no tensor.
fn scalar_value(eg: &EG, id: Id, depth: u32) -> Option<f64> {
    let id = eg.find(id);
    if let Konst::Const { vals: Some(v) } = &eg[id].data.konst {
        return (v.len() == 1).then(|| v[0]);
    }
    if depth == 0 || !eg[id].data.konst.is_const() {
        return None;
    }
    eg[id].nodes.iter().find_map(|n| {
        let TNode::Op { kind, args, .. } = n else {
            return None;
        };
        let arg = |i: usize| scalar_value(eg, args[i], depth - 1);
        match (kind.kind(), args.len()) {
            (OpKind::Mul, 3) => Some(arg(0)? * arg(1)?),
            (OpKind::Div, 3) => Some(arg(0)? / arg(1)?),
            (OpKind::Reciprocal, 2) => Some(1.0 / arg(0)?),
            (OpKind::Sqrt, 2) => Some(arg(0)?.sqrt()),
            _ => None,
        }
    })
}

/// `v` is one non-zero finite number known at compile time whose rank (when known) is at
/// most 4, so multiplying a 4-D score tensor by it neither broadcasts nor changes the shape.
fn is_scale(eg: &EG, s: &Subst, v: &str) -> bool {
    let rank_ok = ty(eg, s, v)
        .and_then(Type::shape)
        .is_none_or(|d| d.len() <= 4 && d.iter().all(|x| x.as_known() == Some(1)));
    rank_ok && scalar_value(eg, at(s, v), 4).is_some_and(|x| x.is_finite() && x != 0.0)
}

/// Condition: `v` is a scalar scale ([`is_scale`]).
fn scale(v: &'static str) -> Cond {
    when(move |eg, s| is_scale(eg, s, v))
}

/// `Transpose(x, perm)`, composed with a `Transpose` that already defines `x` (and `x`'s own
/// source when the composition is the identity); typed `t`.
fn transpose_of(eg: &mut EG, x: Id, perm: &[i64], t: Type) -> Option<Id> {
    let inner = eg[eg.find(x)].nodes.iter().find_map(|n| match n {
        TNode::Op { kind, args, .. } if kind.is(OpKind::Transpose) && args.len() == 2 => {
            match attrs_op(eg, args[1]) {
                Some(Op::Transpose { perm: Some(p) }) if p.len() == perm.len() => {
                    Some((args[0], p.clone()))
                }
                _ => None,
            }
        }
        _ => None,
    });
    let (src, p) = match inner {
        Some((src, p1)) => {
            let composed: Option<Vec<i64>> = perm
                .iter()
                .map(|&j| p1.get(usize::try_from(j).ok()?).copied())
                .collect();
            (src, composed?)
        }
        None => (x, perm.to_vec()),
    };
    if p.iter().enumerate().all(|(i, &d)| d == i as i64) {
        return Some(src);
    }
    let id = add_op(eg, Op::Transpose { perm: Some(p) }, &[Some(src)], 1);
    set_ty(eg, id, t);
    Some(id)
}

/// The operand of a `Reshape` defining `x` when that operand has type `t` (fully known):
/// merging the heads of `x` back gives that operand itself.
fn reshaped_from(eg: &EG, x: Id, t: &Type) -> Option<Id> {
    if !fully_known(t) {
        return None;
    }
    eg[eg.find(x)].nodes.iter().find_map(|n| match n {
        TNode::Op { kind, args, .. } if kind.is(OpKind::Reshape) && args.len() == 3 => {
            (eg[args[0]].data.ty.as_ref() == Some(t)).then_some(args[0])
        }
        _ => None,
    })
}

/// The `[B, T, width]` tensor that the 4-D `[B, N, T, H]` value `x` was split from, when the
/// graph computes `x` as `Transpose(Reshape(x3, [B, T, N, H]), [0, 2, 1, 3])`.
fn merged_heads(eg: &EG, x: Id, dtype: DType, width: i64) -> Option<Id> {
    let dims = eg[eg.find(x)].data.ty.as_ref()?.shape()?.to_vec();
    let [b, _, t, _] = <[Dim; 4]>::try_from(dims).ok()?;
    let split = eg[eg.find(x)].nodes.iter().find_map(|n| match n {
        TNode::Op { kind, args, .. } if kind.is(OpKind::Transpose) && args.len() == 2 => {
            match attrs_op(eg, args[1]) {
                Some(Op::Transpose { perm: Some(p) }) if p == &[0, 2, 1, 3] => Some(args[0]),
                _ => None,
            }
        }
        _ => None,
    })?;
    reshaped_from(
        eg,
        split,
        &Type::tensor(dtype, vec![b, t, Dim::known(width)]),
    )
}

/// The `[B, G, T, H]` tensor whose heads the 4-D `[B, N, T, H]` value `x` repeats, each
/// `N / G` times in a row, and `G`: the grouped-query form the exporters write for a model with
/// fewer key/value heads than query heads (`repeat_kv`):
/// `Reshape(Expand(Unsqueeze(kv, [2]), [B, G, N/G, T, H]), [B, N, T, H])`. Query head `i` then
/// reads head `i / (N/G)` of `kv`, which is how the standard `Attention` groups heads. Read from
/// the types: the unsqueezed `[B, G, 1, T, H]` (the inserted axis checked where its operand is
/// a constant), broadcast along that axis only, merged back in row-major order.
fn repeated_heads(eg: &EG, x: Id) -> Option<(Id, i64)> {
    let shape = |id: Id| {
        eg[eg.find(id)]
            .data
            .ty
            .as_ref()?
            .shape()
            .map(<[Dim]>::to_vec)
    };
    let [b, n, t, h] = <[Dim; 4]>::try_from(shape(x)?).ok()?;
    let (ops, _) = node_of(eg, x, OpKind::Reshape)?;
    let expanded = ops[0];
    let [b1, g, r, t1, h1] = <[Dim; 5]>::try_from(shape(expanded)?).ok()?;
    let (groups, rep) = (known(&g)?, known(&r)?);
    if rep < 2 || known(&n) != Some(groups * rep) {
        return None;
    }
    if !(same(&b, &b1) && same(&t, &t1) && same(&h, &h1)) {
        return None;
    }
    let (ops, _) = node_of(eg, expanded, OpKind::Expand)?;
    let one = ops[0];
    let [b2, g2, r2, t2, h2] = <[Dim; 5]>::try_from(shape(one)?).ok()?;
    if !(same(&b2, &b) && same(&g2, &g) && known(&r2) == Some(1) && same(&t2, &t) && same(&h2, &h))
    {
        return None;
    }
    let (ops, unsqueeze) = node_of(eg, one, OpKind::Unsqueeze)?;
    let axes = match (unsqueeze, ops.get(1)) {
        (Op::Unsqueeze { axes: Some(a) }, _) => Some(a.clone()),
        (_, Some(&c)) => consts_of(eg, c).map(|v| v.iter().map(|&a| a as i64).collect()),
        _ => None,
    };
    if axes.is_some_and(|a| a != [2] && a != [-3]) {
        return None;
    }
    let kv = ops[0];
    let [b3, g3, t3, h3] = <[Dim; 4]>::try_from(shape(kv)?).ok()?;
    (same(&b3, &b) && same(&g3, &g) && same(&t3, &t) && same(&h3, &h)).then_some((kv, groups))
}

/// `Where(IsNaN(y), 0, y)`: a fully masked row (every key -inf) is NaN in a fused attention
/// op; the graph's guard made its probabilities 0, so its output row 0.
fn nan_guard(eg: &mut EG, y: Id, dtype: DType) -> Option<Id> {
    let isn = add_typed(eg, Op::IsNaN {}, &[Some(y)]);
    let zero = lit(eg, dtype, vec![], &[0.0])?;
    Some(add_typed(
        eg,
        Op::Where {},
        &[Some(isn), Some(zero), Some(y)],
    ))
}

/// Builds `Transpose(Attention(Q, K, V[, bias]), [0, 2, 1, 3])` with the standard (opset-23)
/// `Attention` reading `K` and `V` with their `G` key/value heads unrepeated (see
/// [`repeated_heads`]): the `[B, S, N, Hv]` result the matched final transpose gives. `None`
/// unless the graph's opset is or may become 23.
fn build_grouped(
    eg: &mut EG,
    a: &Attn,
    q: Id,
    (k, v): (Id, Id),
    bias: Option<Id>,
    scale: f64,
    guard: bool,
) -> Option<Id> {
    if eg.analysis.max_opset < crate::egraph::OPSET_FORMS {
        return None;
    }
    let [b, n, sq, _] = a.q.clone();
    let att = Op::Attention {
        is_causal: None,
        kv_num_heads: None,
        left_window_size: None,
        q_num_heads: None,
        qk_matmul_output_mode: None,
        right_window_size: None,
        scale: Some(scale as f32),
        softcap: None,
        softmax_precision: None,
    };
    let inputs = [Some(q), Some(k), Some(v), bias];
    let used = if bias.is_some() { 4 } else { 3 };
    let mut y = add_op(eg, att, &inputs[..used], 1);
    let y_ty = Type::tensor(
        a.dtype,
        vec![b.clone(), n.clone(), sq.clone(), Dim::known(a.value_head)],
    );
    set_ty(eg, y, y_ty.clone());
    if guard {
        y = nan_guard(eg, y, a.dtype)?;
        set_ty(eg, y, y_ty);
    }
    let r = add_op(
        eg,
        Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        },
        &[Some(y)],
        1,
    );
    set_ty(
        eg,
        r,
        Type::tensor(a.dtype, vec![b, sq, n, Dim::known(a.value_head)]),
    );
    Some(r)
}

/// Every dim of `t` known (as a constant or a named expression) and its dtype known.
fn fully_known(t: &Type) -> bool {
    t.dtype().is_some()
        && t.shape()
            .is_some_and(|d| d.iter().all(|x| !matches!(x, Dim::Unknown)))
}

/// The class holds a `com.microsoft.MultiHeadAttention` node, or the NaN guard
/// `Where(IsNaN(y), 0, y)` of one.
fn is_mha(eg: &EG, x: Id) -> bool {
    const MHA_OP: OpKind = OpKind::MultiHeadAttention;
    nodes_of(eg, x, MHA_OP).next().is_some()
        || nodes_of(eg, x, OpKind::Where)
            .any(|(ops, _)| ops.len() == 3 && nodes_of(eg, ops[2], MHA_OP).next().is_some())
}

/// The operand classes and the attributes class of the first `kind` node in class `id`.
fn node_parts(eg: &EG, id: Id, kind: OpKind) -> Option<(Vec<Id>, Id)> {
    nodes_of(eg, id, kind).next()
}

/// Attention whose probabilities pass a NaN guard that [`softmax_never_nan`] cannot drop (a
/// `-inf` mask fill): `Transpose(MatMul(Where(IsNaN(p), 0, p), V))` with
/// `p = Softmax(QKᵀ[·c] + bias)` becomes the fused op with the guard moved to its output,
/// `Where(IsNaN(y), 0, y)`. Exact for finite Q, K, V: a row with an unmasked key has no NaN
/// either way; a fully masked row has probabilities 0 behind the guard, so output 0, and the
/// fused op gives NaN there (ONNX Runtime's and the reference kernel's softmax of `-inf`
/// only), which the moved guard turns into 0.
fn build_guarded(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    if !consts(eg, s, "?z").is_some_and(|z| z.iter().all(|&x| x == 0.0)) {
        return None;
    }
    let (sm, sm_attrs) = node_parts(eg, at(s, "?p"), OpKind::Softmax)?;
    let (add, _) = node_parts(eg, *sm.first()?, OpKind::Add)?;
    let (x, bias) = (*add.first()?, *add.get(1)?);
    let mut s2 = s.clone();
    // The scores: `MatMul(q, kt) · c` (any of the class's `Mul` spellings whose left operand
    // is the product and whose right one a scalar scale), else the bare product.
    // Several spellings may hold (the scale split over Q and Kᵀ, then merged); prefer one
    // whose Kᵀ is a plain transpose, which the fused op reads without a copy, and of those one
    // whose Q is not itself scaled (the whole scale merged after the product: the fused op's
    // `scale`, and the Q that decoder forms look behind, as a rotary embedding's result).
    // `Mul(a, c)` with `c` a scalar scale.
    let scaled = |mul: &[Id]| {
        let mut t = s2.clone();
        mul.len() == 2 && {
            t.insert(var("?c"), mul[1]);
            is_scale(eg, &t, "?c")
        }
    };
    let candidates: Vec<(Vec<Id>, Id)> = nodes_of(eg, x, OpKind::Mul)
        .filter(|(mul, _)| scaled(mul))
        .flat_map(|(mul, _)| {
            nodes_of(eg, mul[0], OpKind::MatMul)
                .filter(|(mm, _)| mm.len() == 2)
                .map(|(mm, _)| (mm, mul[1]))
                .collect::<Vec<_>>()
        })
        .collect();
    let plain_kt = |c: &(Vec<Id>, Id)| node_parts(eg, c.0[1], OpKind::Transpose).is_some();
    let unscaled_q =
        |c: &(Vec<Id>, Id)| !nodes_of(eg, c.0[0], OpKind::Mul).any(|(mul, _)| scaled(&mul));
    let scaled_form = candidates
        .iter()
        .find(|c| plain_kt(c) && unscaled_q(c))
        .or_else(|| candidates.iter().find(|c| plain_kt(c)))
        .or(candidates.first())
        .cloned();
    let scaled = match scaled_form {
        Some((mm, c)) => {
            s2.insert(var("?q"), mm[0]);
            s2.insert(var("?kt"), mm[1]);
            s2.insert(var("?c"), c);
            true
        }
        None => {
            let (mm, _) = node_parts(eg, x, OpKind::MatMul)?;
            s2.insert(var("?q"), mm[0]);
            s2.insert(var("?kt"), mm[1]);
            false
        }
    };
    s2.insert(var("?bias"), bias);
    s2.insert(var("?sm"), sm_attrs);
    build_mha(eg, &s2, true, scaled, true)
}

/// The 4-D shape of `v`.
fn shape4(eg: &EG, s: &Subst, v: &str) -> Option<[Dim; 4]> {
    let d = shape_of(eg, s, v)?;
    <[Dim; 4]>::try_from(d).ok()
}

/// A known dim.
fn known(d: &Dim) -> Option<i64> {
    d.as_known().filter(|&n| n > 0)
}

/// Two dims that are the same named or constant size (not unknown).
fn same(a: &Dim, b: &Dim) -> bool {
    !matches!(a, Dim::Unknown) && a == b
}

/// What the fusion reads from a match.
struct Attn {
    dtype: DType,
    /// `[B, N, S, H]` of the query.
    q: [Dim; 4],
    heads: i64,
    head: i64,
    value_head: i64,
}

/// Checks the shapes of a match: `Q [B, N, S, H]`, `Kᵀ [B, N, H, T]`, `V [B, N, T, Hv]` with
/// `N`, `H`, `Hv` known and no broadcasting between them; the optional bias `[B or 1, N or 1,
/// S, T]`; the softmax over the last axis; the final transpose `[0, 2, 1, 3]`.
fn read(eg: &EG, s: &Subst, bias: bool) -> Option<Attn> {
    let dtype = dtype_of(eg, s, "?q")?;
    if !matches!(dtype, DType::F32 | DType::F16) {
        return None;
    }
    let q = shape4(eg, s, "?q")?;
    let kt = shape4(eg, s, "?kt")?;
    let v = shape4(eg, s, "?v")?;
    let heads = known(&q[1])?;
    let head = known(&q[3])?;
    let value_head = known(&v[3])?;
    let fits = same(&q[0], &kt[0])
        && same(&q[0], &v[0])
        && known(&kt[1]) == Some(heads)
        && known(&v[1]) == Some(heads)
        && known(&kt[2]) == Some(head)
        && same(&kt[3], &v[2])
        && dtype_of(eg, s, "?kt") == Some(dtype)
        && dtype_of(eg, s, "?v") == Some(dtype);
    if !fits {
        return None;
    }
    if bias {
        let b = shape4(eg, s, "?bias")?;
        // A mask over keys only (`[B, 1, 1, T]`, a padding mask) is expanded over the query
        // rows: `attention_bias` has them.
        let ok = (known(&b[0]) == Some(1) || same(&b[0], &q[0]))
            && (known(&b[1]) == Some(1) || known(&b[1]) == Some(heads))
            && (same(&b[2], &q[2]) || known(&b[2]) == Some(1))
            && same(&b[3], &kt[3])
            && dtype_of(eg, s, "?bias") == Some(dtype);
        if !ok {
            return None;
        }
    }
    let last = match op(eg, s, "?sm")? {
        Op::Softmax { axis: Some(a) } => *a == -1 || *a == 3,
        Op::Softmax { axis: None } => eg.analysis.opset >= 13,
        _ => false,
    };
    let perm_ok =
        matches!(op(eg, s, "?tp")?, Op::Transpose { perm: Some(p) } if p == &[0, 2, 1, 3]);
    (last && perm_ok).then_some(Attn {
        dtype,
        q,
        heads,
        head,
        value_head,
    })
}

/// The additive mask `?bias` as `attention_bias` takes it, `[B or 1, N or 1, S, T]`: a mask
/// over keys only (`[B, 1, 1, T]`) expanded over the `S` query rows (`Expand` to the shape
/// `Shape(bias)[0:2] ++ S ++ Shape(bias)[3:4]`, `S` read from the mask where it equals `T`,
/// else from `Q`); the same values, so exact.
fn full_bias(eg: &mut EG, s: &Subst) -> Option<Id> {
    let b = at(s, "?bias");
    let (bd, qd) = (shape4(eg, s, "?bias")?, shape4(eg, s, "?q")?);
    if same(&bd[2], &qd[2]) {
        return Some(b);
    }
    let part = |eg: &mut EG, x: Id, lo: f64, hi: f64| -> Option<Id> {
        let shape = add_typed(
            eg,
            Op::Shape {
                start: None,
                end: None,
            },
            &[Some(x)],
        );
        let (st, en) = (
            lit(eg, DType::I64, vec![1], &[lo])?,
            lit(eg, DType::I64, vec![1], &[hi])?,
        );
        Some(add_typed(
            eg,
            Op::Slice {
                starts: None,
                ends: None,
                axes: None,
            },
            &[Some(shape), Some(st), Some(en)],
        ))
    };
    let lead = part(eg, b, 0.0, 2.0)?;
    let keys = part(eg, b, 3.0, 4.0)?;
    // Self-attention (as many query rows as keys): the rows from the mask's own shape, so
    // nothing keeps the transposed Q alive for its shape.
    let rows = if same(&qd[2], &shape4(eg, s, "?kt")?[3]) {
        keys
    } else {
        part(eg, at(s, "?q"), 2.0, 3.0)?
    };
    let full = add_typed(
        eg,
        Op::Concat { axis: Some(0) },
        &[Some(lead), Some(rows), Some(keys)],
    );
    Some(add_typed(eg, Op::Expand {}, &[Some(b), Some(full)]))
}

/// Builds `Reshape(MultiHeadAttention(Reshape(Transpose(Q)), Transpose(Kᵀ), V, bias),
/// [0, 0, N, Hv])`: the `[B, S, N, Hv]` result the matched final transpose gives.
fn build_mha(eg: &mut EG, s: &Subst, bias: bool, scaled: bool, guard: bool) -> Option<Id> {
    let a = read(eg, s, bias)?;
    let scale = if scaled {
        scalar_value(eg, at(s, "?c"), 4)?
    } else {
        1.0
    };
    let [b, n, sq, h] = a.q.clone();
    let t = shape4(eg, s, "?kt")?[3].clone();
    let hidden = Dim::known(a.heads * a.head);
    let ty4 = |d: [Dim; 4]| Type::tensor(a.dtype, d.to_vec());
    let qt = transpose_of(
        eg,
        at(s, "?q"),
        &[0, 2, 1, 3],
        ty4([b.clone(), sq.clone(), n.clone(), h.clone()]),
    )?;
    let q3_ty = Type::tensor(a.dtype, vec![b.clone(), sq.clone(), hidden]);
    let q3 = match reshaped_from(eg, qt, &q3_ty) {
        Some(x) => x,
        None => {
            let flat = lit(eg, DType::I64, vec![3], &[0.0, 0.0, -1.0])?;
            let q3 = add_op(
                eg,
                Op::Reshape { allowzero: None },
                &[Some(qt), Some(flat)],
                1,
            );
            set_ty(eg, q3, q3_ty);
            q3
        }
    };
    let mut k = transpose_of(
        eg,
        at(s, "?kt"),
        &[0, 1, 3, 2],
        ty4([b.clone(), n.clone(), t, h]),
    )?;
    let mha = Op::MultiHeadAttention {
        num_heads: Some(a.heads),
        scale: Some(scale as f32),
        mask_filter_value: None,
        unidirectional: None,
    };
    let mut v = at(s, "?v");
    // Grouped-query heads repeated by the graph: the standard `Attention` reads the unrepeated
    // key and value (the repeat, a copy of the whole cache per step, goes away).
    if let (Some((kc, g)), Some((vc, gv))) = (repeated_heads(eg, k), repeated_heads(eg, v))
        && g == gv
    {
        let bias = bias.then(|| at(s, "?bias"));
        if let Some(r) = build_grouped(eg, &a, at(s, "?q"), (kc, vc), bias, scale, guard) {
            return Some(r);
        }
    }
    // Where the graph split K and V into heads itself (self-attention without a cache), give
    // ONNX Runtime the unsplit [B, T, N*H] tensors: it splits them inside the kernel, and the
    // graph's Reshape and Transpose of K and V go away.
    if let (Some(k3), Some(v3)) = (
        merged_heads(eg, k, a.dtype, a.heads * a.head),
        merged_heads(eg, v, a.dtype, a.heads * a.value_head),
    ) {
        k = k3;
        v = v3;
    }
    let mut inputs = vec![Some(q3), Some(k), Some(v)];
    if bias {
        let full = full_bias(eg, s)?;
        inputs.extend([None, None, Some(full)]);
    }
    let mut y = add_typed(eg, mha, &inputs);
    if guard {
        y = nan_guard(eg, y, a.dtype)?;
    }
    let split = lit(
        eg,
        DType::I64,
        vec![4],
        &[0.0, 0.0, a.heads as f64, a.value_head as f64],
    )?;
    Some(add_typed(
        eg,
        Op::Reshape { allowzero: None },
        &[Some(y), Some(split)],
    ))
}

/// The operand classes of the first `kind` node of class `id` whose attributes satisfy
/// `attrs_ok`.
fn operands_of(eg: &EG, id: Id, kind: OpKind, attrs_ok: impl Fn(&Op) -> bool) -> Option<Vec<Id>> {
    nodes_of(eg, id, kind)
        .find(|(_, a)| attrs_op(eg, *a).is_some_and(&attrs_ok))
        .map(|(ops, _)| ops)
}

/// Every element of class `id` is a finite number whatever the graph inputs (as far as
/// constants tell): a constant whose elements are all finite, an integer or boolean cast, a
/// `Where` choosing between finite values, or data movement of such. Masks built as
/// `Where(keep, 0, finfo.min)` and `(1 - mask) * finfo.min` pass; `-inf` fills do not.
fn finite(eg: &EG, id: Id, depth: u32) -> bool {
    let id = eg.find(id);
    if let Konst::Const { vals: Some(v) } = &eg[id].data.konst {
        return v.iter().all(|x| x.is_finite());
    }
    // Recorded only for constants whose every element is finite.
    if min_of(eg, id).is_some() {
        return true;
    }
    if depth == 0 {
        return false;
    }
    let int_like = |c: Id| {
        eg[eg.find(c)]
            .data
            .ty
            .as_ref()
            .and_then(Type::dtype)
            .is_some_and(|d| !d.is_float() && d != DType::String)
    };
    eg[id].nodes.iter().any(|n| {
        let TNode::Op { kind, args, .. } = n else {
            return false;
        };
        let ops = &args[..args.len().saturating_sub(1)];
        let fin = |i: usize| {
            ops.get(i)
                .is_some_and(|&c| finite(eg, c, depth - 1) || int_like(c))
        };
        match kind.kind() {
            OpKind::Where => fin(1) && fin(2),
            OpKind::Expand
            | OpKind::Reshape
            | OpKind::Unsqueeze
            | OpKind::Squeeze
            | OpKind::Transpose
            | OpKind::Slice
            | OpKind::Gather
            | OpKind::Flatten
            | OpKind::Identity
            | OpKind::Neg
            | OpKind::Cast => fin(0),
            // A product of two finite factors can overflow only past the dtype's range; the
            // masks multiply 0/1 by finfo.min, which stays finite.
            OpKind::Sub | OpKind::Mul => {
                fin(0) && fin(1) && (all_unit(eg, ops[0]) || all_unit(eg, ops[1]))
            }
            _ => false,
        }
    })
}

/// Every element of class `id` lies in [0, 1]: a constant, a cast of a boolean tensor, or
/// `1 - y` of such a `y` (the `1 - mask` of additive masks). Multiplying a finite value by it
/// stays finite.
fn all_unit(eg: &EG, id: Id) -> bool {
    let id = eg.find(id);
    if let Konst::Const { vals: Some(v) } = &eg[id].data.konst {
        return v.iter().all(|x| (0.0..=1.0).contains(x));
    }
    let boolish =
        |c: Id| eg[eg.find(c)].data.ty.as_ref().and_then(Type::dtype) == Some(DType::Bool);
    eg[id].nodes.iter().any(|n| match n {
        TNode::Op { kind, args, .. } => match kind.kind() {
            OpKind::Cast => boolish(args[0]),
            OpKind::Sub if args.len() == 3 => {
                consts_of(eg, args[0]).is_some_and(|v| v.iter().all(|&x| x == 1.0))
                    && all_unit(eg, args[1])
            }
            _ => false,
        },
        _ => false,
    })
}

/// Class `id` holds attention scores that are finite for finite inputs: a product
/// (`MatMul`, `FusedMatMul`), such scores scaled by (`Mul`, `Div`) or added to (`Add`, either
/// side) a value [`finite`] proves finite.
fn finite_scores(eg: &EG, id: Id, depth: u32) -> bool {
    if depth == 0 {
        return false;
    }
    let scores = |c: Id| finite_scores(eg, c, depth - 1);
    let fin = |c: Id| finite(eg, c, 6);
    eg[eg.find(id)].nodes.iter().any(|n| match n {
        TNode::Op { kind, args, .. } => match (kind.kind(), args.len()) {
            (OpKind::MatMul | OpKind::FusedMatMul, _) => true,
            (OpKind::Mul | OpKind::Div, 3) => scores(args[0]) && fin(args[1]),
            (OpKind::Add, 3) => {
                (scores(args[0]) && fin(args[1])) || (fin(args[0]) && scores(args[1]))
            }
            _ => false,
        },
        _ => false,
    })
}

/// The softmax bound to `?p` never produces NaN for finite inputs: its input is
/// [`finite_scores`] (a `-inf` anywhere in it, under a scale or behind a second bias, fails).
fn softmax_never_nan(eg: &EG, s: &Subst) -> bool {
    nodes_of(eg, at(s, "?p"), OpKind::Softmax)
        .next()
        .and_then(|(ops, _)| ops.first().copied())
        .is_some_and(|x| finite_scores(eg, x, 4))
}

/// `Reshape(Transpose(Reshape(k, [B*N, T, H]), [0, 2, 1]), [B, N, H, T])` (how the dynamo
/// exporter transposes K for SDPA): `Transpose(k, [0, 1, 3, 2])` when the types say so —
/// `k` is `[B, N, T, H]`, the transposed value `[X, H, T]` and the result `[B, N, H, T]`.
/// Exact: the leading dims are merged and split back in the same row-major order.
fn kt_from_reshapes(eg: &mut EG, root: Id, s: &Subst) -> Option<Id> {
    let out = eg[root].data.ty.clone()?;
    let tdims = eg[eg.find(at(s, "?t"))].data.ty.as_ref()?.shape()?.to_vec();
    let inner = operands_of(
        eg,
        at(s, "?t"),
        OpKind::Transpose,
        |o| matches!(o, Op::Transpose { perm: Some(p) } if p == &[0, 2, 1]),
    )?;
    let k = operands_of(eg, inner[0], OpKind::Reshape, |_| true)?[0];
    let kty = eg[k].data.ty.clone()?;
    let (kd, od) = (kty.shape()?, out.shape()?);
    let fits = kd.len() == 4
        && od.len() == 4
        && tdims.len() == 3
        && kty.dtype() == out.dtype()
        && same(&kd[0], &od[0])
        && same(&kd[1], &od[1])
        && same(&kd[2], &od[3])
        && same(&kd[3], &od[2])
        && same(&tdims[1], &kd[3])
        && same(&tdims[2], &kd[2]);
    if !fits {
        return None;
    }
    transpose_of(eg, k, &[0, 1, 3, 2], out)
}

/// Builds `Mul(MatMul(x, y), c)` (the scale moved after the product), typed as the root.
fn scale_after(
    x: &'static str,
    y: &'static str,
    c: &'static str,
    m: &'static str,
    mm: &'static str,
) -> impl Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync {
    move |eg, root, s| {
        let t = eg[root].data.ty.clone()?;
        let p = add_op(
            eg,
            op(eg, s, mm)?.clone(),
            &[Some(at(s, x)), Some(at(s, y))],
            1,
        );
        set_ty(eg, p, t.clone());
        let r = add_op(eg, op(eg, s, m)?.clone(), &[Some(p), Some(at(s, c))], 1);
        set_ty(eg, r, t);
        Some(r)
    }
}

const MHA: &str =
    "(Transpose (MatMul (Softmax (Mul (MatMul ?q ?kt ?mm1) ?c ?mul) ?sm) ?v ?mm2) ?tp)";
const MHA_BIAS: &str = "(Transpose (MatMul (Softmax (Add (Mul (MatMul ?q ?kt ?mm1) ?c ?mul) ?bias ?add) ?sm) ?v ?mm2) ?tp)";
const MHA_1: &str = "(Transpose (MatMul (Softmax (MatMul ?q ?kt ?mm1) ?sm) ?v ?mm2) ?tp)";
const MHA_1_BIAS: &str =
    "(Transpose (MatMul (Softmax (Add (MatMul ?q ?kt ?mm1) ?bias ?add) ?sm) ?v ?mm2) ?tp)";

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    vec![
        // ---- normalizing the scale -------------------------------------------------------
        // `MatMul(Q, K) / c` → `MatMul(Q, K) · (1/c)` for a scalar constant `c ≠ 0` (1/c is a
        // const-expression). Exact up to one rounding (exact when `c` is a power of two).
        rule("attn-scale-div", "(Div (MatMul ?q ?k ?mm) ?c ?d)", vec![for_ort(), scale("?c")],
             |eg, root, s| {
                 let t = eg[root].data.ty.clone()?;
                 let one = lit(eg, dtype_of(eg, s, "?c")?, vec![], &[1.0])?;
                 let inv = add_op(eg, Op::Div {}, &[Some(one), Some(at(s, "?c"))], 1);
                 let mm = add_op(eg, op(eg, s, "?mm")?.clone(), &[Some(at(s, "?q")), Some(at(s, "?k"))], 1);
                 let r = add_op(eg, Op::Mul {}, &[Some(mm), Some(inv)], 1);
                 set_ty(eg, r, t);
                 Some(r)
             }),
        // `MatMul(Q · a, K)` → `MatMul(Q, K) · a` for a scalar constant `a`. Exact up to
        // rounding (exact when `a` is a power of two).
        rule("attn-scale-q", "(MatMul (Mul ?q ?a ?m) ?k ?mm)", vec![for_ort(), scale("?a")],
             scale_after("?q", "?k", "?a", "?m", "?mm")),
        // `MatMul(Q, K · a)` → `MatMul(Q, K) · a` for a scalar constant `a`. Exact up to
        // rounding (exact when `a` is a power of two).
        rule("attn-scale-k", "(MatMul ?q (Mul ?k ?a ?m) ?mm)", vec![for_ort(), scale("?a")],
             scale_after("?q", "?k", "?a", "?m", "?mm")),
        // `MatMul(Q, K) · a · b` → `MatMul(Q, K) · (a·b)` for scalar constants `a`, `b` (a·b is
        // a const-expression). Exact up to one rounding.
        rule("attn-scale-merge", "(Mul (Mul (MatMul ?q ?k ?mm) ?a ?m1) ?b ?m2)",
             vec![for_ort(), scale("?a"), scale("?b")],
             |eg, root, s| {
                 let t = eg[root].data.ty.clone()?;
                 let ab = add_op(eg, op(eg, s, "?m1")?.clone(), &[Some(at(s, "?a")), Some(at(s, "?b"))], 1);
                 let p = add_op(eg, op(eg, s, "?mm")?.clone(), &[Some(at(s, "?q")), Some(at(s, "?k"))], 1);
                 set_ty(eg, p, t.clone());
                 let r = add_op(eg, op(eg, s, "?m2")?.clone(), &[Some(p), Some(ab)], 1);
                 set_ty(eg, r, t);
                 Some(r)
             }),
        // ---- normalizing the export form ---------------------------------------------------
        // `Where(IsNaN(p), z, p)` → `p` for `p = Softmax(x)` that cannot be NaN: SDPA
        // decompositions guard fully masked rows, which only a `-inf` fill produces. Exact when
        // the inputs are finite and the mask fill is proven finite ([`softmax_never_nan`]).
        rule("attn-nan-guard", "(Where (IsNaN ?p ?ai) ?z ?p ?aw)",
             vec![for_ort(), when(softmax_never_nan)],
             |_, _, s| Some(at(s, "?p"))),
        // Kᵀ written as reshape → 3-D transpose → reshape back → `Transpose(k, [0, 1, 3, 2])`.
        rule("attn-kt-reshape", "(Reshape ?t ?shape ?ar)", vec![for_ort()], kt_from_reshapes),
        // ---- cleaning up around the fused op ----------------------------------------------
        // `Reshape(Reshape(y, s1), s2)` → `y` when `y` is a fused attention result and the
        // outer result has exactly `y`'s type (the heads split by the fusion merged back):
        // exact, reshapes keep the element order.
        rule("attn-reshape-roundtrip", "(Reshape (Reshape ?y ?s1 ?a1) ?s2 ?a2)",
             vec![for_ort(), when(|eg, s| is_mha(eg, at(s, "?y")))],
             |eg, root, s| {
                 let t = eg[root].data.ty.as_ref()?;
                 (fully_known(t) && ty(eg, s, "?y") == Some(t)).then(|| at(s, "?y"))
             }),
        // ---- fusion (ONNX Runtime) -------------------------------------------------------
        // Scaled attention without mask → `MultiHeadAttention` (`scale` = the graph's `c`).
        // Exact up to the fused kernel's rounding. Conditions: see [`read`]; `c` one number.
        rule("attn-mha", MHA, vec![for_ort(), scale("?c")],
             |eg, _, s| build_mha(eg, s, false, true, false)),
        // Scaled attention with an additive mask → `MultiHeadAttention` with the mask as
        // `attention_bias` (`[B or 1, N or 1, S, T]`). Exact up to the kernel's rounding.
        rule("attn-mha-bias", MHA_BIAS, vec![for_ort(), scale("?c")],
             |eg, _, s| build_mha(eg, s, true, true, false)),
        // Masked attention behind a NaN guard that stays (a `-inf` fill): the fused op with
        // the guard on its output. Exact for finite inputs; see [`build_guarded`].
        rule("attn-mha-guarded", "(Transpose (MatMul (Where (IsNaN ?p ?ai) ?z ?p ?aw) ?v ?mm2) ?tp)",
             vec![for_ort()], build_guarded),
        // Attention whose scale is folded into the weights (`scale` = 1). Exact up to the
        // kernel's rounding.
        rule("attn-mha-unscaled", MHA_1, vec![for_ort()],
             |eg, _, s| build_mha(eg, s, false, false, false)),
        // Masked attention whose scale is folded into the weights (`scale` = 1). Exact up to
        // the kernel's rounding.
        rule("attn-mha-unscaled-bias", MHA_1_BIAS, vec![for_ort()],
             |eg, _, s| build_mha(eg, s, true, false, false)),
        // Grouped-query heads repeated by the graph before a standard (opset-23) `Attention`
        // on 4-D tensors, as the dynamo exporter writes it at opset 23: the `Attention` reads
        // the unrepeated key and value, whose heads it groups itself (query head `i` reads
        // key/value head `i / (N/G)`, the order the repeat made). Exact; the repeat, a copy of
        // the whole cache per step, goes away.
        rule_any("attn-unrepeat-kv", &[
                "(Attention ?q ?k ?v ?att)".into(),
                "(Attention ?q ?k ?v ?mask ?att)".into(),
            ],
            vec![for_ort()],
            |eg, root, s| {
                let (kc, g) = repeated_heads(eg, at(s, "?k"))?;
                let (vc, gv) = repeated_heads(eg, at(s, "?v"))?;
                let o = op(eg, s, "?att")?.clone();
                if g != gv
                    || !matches!(o, Op::Attention { q_num_heads: None, kv_num_heads: None, .. })
                {
                    return None;
                }
                let t = eg[root].data.ty.clone()?;
                let inputs = [Some(at(s, "?q")), Some(kc), Some(vc), bound(s, "?mask")];
                let n = if inputs[3].is_some() { 4 } else { 3 };
                let y = add_op(eg, o, &inputs[..n], 1);
                set_ty(eg, y, t);
                Some(y)
            }),
    ]
}
