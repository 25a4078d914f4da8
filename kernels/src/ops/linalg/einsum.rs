//! Einsum: diagonals and reductions by strided gathers, contractions pairwise by batched GEMM.

use std::collections::HashMap;

use super::{Real, batched_matmul, by_real, gather_strided, is_float, is_int};
use crate::error::KernelError;
use crate::ops::util::strides;
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// Label of ellipsis dim `i` (counted from the left of the broadcast ellipsis).
const ELL: u32 = 1 << 20;

/// A tensor whose axes are named by labels.
struct Labeled<T> {
    labels: Vec<u32>,
    shape: Vec<usize>,
    data: Vec<T>,
}

/// Parsed equation ([`mmq_ir::einsum::parse`]): per-input labels (ellipsis expanded) and
/// output labels.
fn parse(eq: &str, ranks: &[usize]) -> Result<(Vec<Vec<u32>>, Vec<u32>), String> {
    let eq = mmq_ir::einsum::parse(eq, ranks.len()).map_err(|e| e.0)?;
    let mut ell_rank = 0usize;
    for (t, &rank) in eq.inputs.iter().zip(ranks) {
        let named = t.pre.len() + t.post.len();
        if named > rank || (!t.ellipsis && named != rank) {
            let text: String = t.pre.iter().chain(&t.post).collect();
            return Err(format!("term '{text}' does not fit rank {rank}"));
        }
        ell_rank = ell_rank.max(rank - named);
    }
    // Labels of a term, its ellipsis taking the last `e` of the `ell_rank` broadcast dims.
    let expand = |t: &mmq_ir::einsum::Term, e: usize| -> Vec<u32> {
        let mut l: Vec<u32> = t.pre.iter().map(|&c| c as u32).collect();
        if t.ellipsis {
            l.extend((ell_rank - e..ell_rank).map(|i| ELL + i as u32));
        }
        l.extend(t.post.iter().map(|&c| c as u32));
        l
    };
    let out: Vec<Vec<u32>> = eq
        .inputs
        .iter()
        .zip(ranks)
        .map(|(t, &rank)| expand(t, rank - t.pre.len() - t.post.len()))
        .collect();
    let output = match &eq.output {
        Some(t) => expand(t, ell_rank),
        None => {
            let mut count: HashMap<u32, usize> = HashMap::new();
            for l in &out {
                for &c in l {
                    if c < ELL {
                        *count.entry(c).or_default() += 1;
                    }
                }
            }
            let mut once: Vec<u32> = count
                .into_iter()
                .filter(|&(_, n)| n == 1)
                .map(|(c, _)| c)
                .collect();
            once.sort_unstable();
            let mut l: Vec<u32> = if eq.inputs.iter().any(|t| t.ellipsis) {
                (0..ell_rank).map(|i| ELL + i as u32).collect()
            } else {
                Vec::new()
            };
            l.extend(once);
            l
        }
    };
    Ok((out, output))
}

/// Takes diagonals of repeated labels.
fn undup<T: Real>(labels: &[u32], shape: &[usize], data: &[T]) -> Result<Labeled<T>, String> {
    let st = strides(shape);
    let mut ul: Vec<u32> = Vec::new();
    let mut us: Vec<usize> = Vec::new();
    let mut ust: Vec<usize> = Vec::new();
    for (i, &l) in labels.iter().enumerate() {
        match ul.iter().position(|&x| x == l) {
            Some(p) => {
                if us[p] != shape[i] {
                    return Err(format!(
                        "repeated label has sizes {} and {}",
                        us[p], shape[i]
                    ));
                }
                ust[p] += st[i];
            }
            None => {
                ul.push(l);
                us.push(shape[i]);
                ust.push(st[i]);
            }
        }
    }
    let data = if ul.len() == labels.len() {
        data.to_vec()
    } else {
        gather_strided(data, &us, &ust)
    };
    Ok(Labeled {
        labels: ul,
        shape: us,
        data,
    })
}

/// Permutes (and broadcasts, via `sizes`) `t` to the label order `order`; labels of `t` not in
/// `order` must have been reduced already.
fn arrange<T: Real>(t: &Labeled<T>, order: &[u32], sizes: &HashMap<u32, usize>) -> Vec<T> {
    let st = strides(&t.shape);
    let mut shape = Vec::with_capacity(order.len());
    let mut sts = Vec::with_capacity(order.len());
    for l in order {
        let full = sizes.get(l).copied().unwrap_or(1);
        shape.push(full);
        match t.labels.iter().position(|x| x == l) {
            Some(p) if t.shape[p] == full => sts.push(st[p]),
            _ => sts.push(0),
        }
    }
    gather_strided(&t.data, &shape, &sts)
}

/// Sums out every label not in `keep`.
fn reduce<T: Real>(t: Labeled<T>, keep: &[u32]) -> Labeled<T> {
    let (kept, gone): (Vec<usize>, Vec<usize>) =
        (0..t.labels.len()).partition(|&i| keep.contains(&t.labels[i]));
    if gone.is_empty() {
        return t;
    }
    let order: Vec<u32> = kept.iter().chain(&gone).map(|&i| t.labels[i]).collect();
    let sizes: HashMap<u32, usize> = t
        .labels
        .iter()
        .copied()
        .zip(t.shape.iter().copied())
        .collect();
    let data = arrange(&t, &order, &sizes);
    let inner: usize = gone.iter().map(|&i| t.shape[i]).product();
    let outer: usize = kept.iter().map(|&i| t.shape[i]).product();
    let mut out = vec![T::ZERO; outer];
    if inner > 0 {
        for (o, chunk) in out.iter_mut().zip(data.chunks(inner)) {
            let mut s = 0f64;
            for &v in chunk {
                s += v.to_f64();
            }
            *o = T::from_f64(s);
        }
    }
    Labeled {
        labels: kept.iter().map(|&i| t.labels[i]).collect(),
        shape: kept.iter().map(|&i| t.shape[i]).collect(),
        data: out,
    }
}

/// Contracts `a` and `b`, keeping the labels in `keep`.
fn contract<T: Real>(
    a: Labeled<T>,
    b: Labeled<T>,
    keep: &[u32],
    sizes: &HashMap<u32, usize>,
) -> Labeled<T> {
    let (la, lb) = (a.labels.clone(), b.labels.clone());
    let ka: Vec<u32> = la
        .iter()
        .copied()
        .filter(|l| keep.contains(l) || lb.contains(l))
        .collect();
    let kb: Vec<u32> = lb
        .iter()
        .copied()
        .filter(|l| keep.contains(l) || la.contains(l))
        .collect();
    let a = reduce(a, &ka);
    let b = reduce(b, &kb);
    let in_b = |l: &u32| b.labels.contains(l);
    let batch: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && keep.contains(l))
        .collect();
    let contr: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && !keep.contains(l))
        .collect();
    let m: Vec<u32> = a.labels.iter().copied().filter(|l| !in_b(l)).collect();
    let n: Vec<u32> = b
        .labels
        .iter()
        .copied()
        .filter(|l| !a.labels.contains(l))
        .collect();
    let size = |ls: &[u32]| -> usize {
        ls.iter()
            .map(|l| sizes.get(l).copied().unwrap_or(1))
            .product()
    };
    let (bs, ms, ks, ns) = (size(&batch), size(&m), size(&contr), size(&n));
    let ao: Vec<u32> = batch.iter().chain(&m).chain(&contr).copied().collect();
    let bo: Vec<u32> = batch.iter().chain(&contr).chain(&n).copied().collect();
    let ad = arrange(&a, &ao, sizes);
    let bd = arrange(&b, &bo, sizes);
    let (_, data) =
        batched_matmul(&ad, &[bs, ms, ks], &bd, &[bs, ks, ns]).unwrap_or((vec![], vec![]));
    let labels: Vec<u32> = batch.iter().chain(&m).chain(&n).copied().collect();
    let shape = labels
        .iter()
        .map(|l| sizes.get(l).copied().unwrap_or(1))
        .collect();
    Labeled {
        labels,
        shape,
        data,
    }
}

fn einsum_float<T: Real>(cx: &OpCtx<'_>, ops: &[&Tensor], eq: &str) -> Result<Tensor, KernelError> {
    let ranks: Vec<usize> = ops.iter().map(|t| t.rank()).collect();
    let (terms, output) =
        parse(eq, &ranks).map_err(|e| cx.invalid(format!("equation '{eq}': {e}")))?;
    let mut sizes: HashMap<u32, usize> = HashMap::new();
    let mut items = Vec::new();
    for (t, labels) in ops.iter().zip(&terms) {
        for (&l, &d) in labels.iter().zip(&t.shape) {
            let e = sizes.entry(l).or_insert(d);
            if *e == 1 {
                *e = d;
            } else if d != 1 && d != *e {
                return Err(cx.invalid(format!("label sizes {} and {d} differ in '{eq}'", *e)));
            }
        }
        let v = T::load(t)?;
        items.push(undup(labels, &t.shape, &v).map_err(|e| cx.invalid(e))?);
    }
    for l in &output {
        if !sizes.contains_key(l) {
            return Err(cx.invalid(format!("output label of '{eq}' appears in no operand")));
        }
    }
    let mut iter = items.into_iter().enumerate();
    let Some((_, mut acc)) = iter.next() else {
        return Err(cx.invalid("Einsum needs at least one operand"));
    };
    for (i, next) in iter {
        let mut keep = output.clone();
        for later in &terms[i + 1..] {
            keep.extend(later);
        }
        acc = contract(acc, next, &keep, &sizes);
    }
    let acc = reduce(acc, &output);
    let data = arrange(&acc, &output, &sizes);
    let shape = output.iter().map(|l| sizes[l]).collect();
    T::store(ops[0].dtype, shape, data)
}

/// Einsum.
pub(super) fn einsum_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], eq: Option<&str>) -> OpResult {
    let eq = eq.ok_or_else(|| cx.invalid("equation is required"))?;
    let mut ops = Vec::new();
    for i in 0..inputs.len() {
        ops.push(&**crate::ops::util::tensor(cx, inputs, i)?);
    }
    let Some(first) = ops.first() else {
        return Err(cx.invalid("Einsum needs at least one operand"));
    };
    let dtype = first.dtype;
    if !(is_float(dtype) || is_int(dtype)) || ops.iter().any(|t| t.dtype != dtype) {
        return Err(cx.unsupported(format!("Einsum on {dtype}")));
    }
    let y = by_real!(dtype, einsum_float(cx, &ops, eq))?;
    Ok(vec![Some(y.into())])
}

#[cfg(test)]
mod tests {
    use super::super::tests::{f32t, out, run_op};
    use mmq_ir::Op;

    fn es(eq: &str) -> Op {
        Op::Einsum {
            equation: Some(eq.to_owned()),
        }
    }

    #[test]
    fn einsum_cases() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [5.0f32, 6.0, 7.0, 8.0];
        let r = run_op(
            es("ij,jk->ik"),
            vec![f32t(&[2, 2], &a), f32t(&[2, 2], &b)],
            1,
            12,
        )
        .expect("run");
        assert_eq!(out(&r, 0).1, vec![19.0, 22.0, 43.0, 50.0]);
        // Implicit: transpose.
        let r = run_op(es("ji"), vec![f32t(&[2, 2], &a)], 1, 12).expect("run");
        assert_eq!(out(&r, 0).1, vec![1.0, 3.0, 2.0, 4.0]);
        // Trace and diagonal.
        let r = run_op(es("ii"), vec![f32t(&[2, 2], &a)], 1, 12).expect("run");
        assert_eq!(out(&r, 0), (vec![], vec![5.0]));
        let r = run_op(es("ii->i"), vec![f32t(&[2, 2], &a)], 1, 12).expect("run");
        assert_eq!(out(&r, 0).1, vec![1.0, 4.0]);
        // Sum, outer product, batch with ellipsis.
        let r = run_op(es("ij->"), vec![f32t(&[2, 2], &a)], 1, 12).expect("run");
        // A repeated output label, a label no input has: errors, not a panic.
        for (eq, want) in [
            ("ij->jj", "output label 'j' repeats"),
            ("ij->ik", "output label 'k' is in no input"),
            ("ij->...i", "the output has '...' and no input does"),
        ] {
            let e = run_op(es(eq), vec![f32t(&[2, 2], &a)], 1, 12).expect_err(eq);
            assert!(e.to_string().contains(want), "{eq}: {e}");
        }
        assert_eq!(out(&r, 0).1, vec![10.0]);
        let r = run_op(
            es("i,j"),
            vec![f32t(&[2], &[1.0, 2.0]), f32t(&[2], &[3.0, 4.0])],
            1,
            12,
        )
        .expect("run");
        assert_eq!(out(&r, 0).1, vec![3.0, 4.0, 6.0, 8.0]);
        let r = run_op(
            es("...ij,...jk"),
            vec![f32t(&[1, 2, 2], &a), f32t(&[2, 2], &b)],
            1,
            12,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![1, 2, 2], vec![19.0, 22.0, 43.0, 50.0]));
        assert!(run_op(es("ij,jk"), vec![f32t(&[2, 2], &a)], 1, 12).is_err());
    }
}
