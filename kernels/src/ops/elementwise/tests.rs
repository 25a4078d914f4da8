//! Unit tests of the elementwise family, run through the interpreter on one-node graphs.

use std::collections::HashMap;

use half::f16;
use mmq_ir::{DType, Entry, ModelInfo, Module, Op, Type};

use crate::error::KernelError;
use crate::interp::Interpreter;
use crate::numeric;
use crate::tensor::{Data, RtValue, Tensor};

/// Runs one node of `op` at `opset` on `inputs` (`None`: omitted) and returns its outputs.
fn run_op(opset: i64, op: Op, inputs: Vec<Option<Tensor>>) -> Result<Vec<Tensor>, KernelError> {
    let mut m = Module::new();
    let g = m.add_graph("g", None);
    let mut feeds = HashMap::new();
    let mut ins = Vec::new();
    for (i, t) in inputs.into_iter().enumerate() {
        match t {
            Some(t) => {
                let name = format!("x{i}");
                ins.push(Some(m.add_input(g, Some(name.clone()), Type::Unknown)));
                feeds.insert(name, RtValue::from(t));
            }
            None => ins.push(None),
        }
    }
    let node = m.add_node(
        g,
        op,
        ins,
        vec![Some((Some("y".to_owned()), Type::Unknown))],
        None,
    );
    let outs: Vec<_> = m.nodes[node].outputs.iter().flatten().copied().collect();
    m.graphs[g].outputs = outs;
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo {
            opsets: vec![(String::new(), opset)],
            ..ModelInfo::default()
        },
    });
    let interp = Interpreter::new(&m);
    let res = interp.run(g, &feeds)?;
    Ok(res
        .into_iter()
        .filter_map(|(_, v)| v.as_tensor().map(|t| (**t).clone()))
        .collect())
}

fn one(opset: i64, op: Op, inputs: Vec<Tensor>) -> Tensor {
    match run_op(opset, op, inputs.into_iter().map(Some).collect()) {
        Ok(mut v) if v.len() == 1 => v.remove(0),
        other => panic!("unexpected result {other:?}"),
    }
}

fn i32s(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
    Tensor::new(DType::I32, shape, Data::I32(v)).unwrap()
}

fn f32s(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
    Tensor::from_f32(shape, v).unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()) || (x.is_nan() && y.is_nan()),
            "{a:?} vs {b:?}"
        );
    }
}

#[test]
fn integer_div_and_mod_signs() {
    let a = i32s(vec![4], vec![7, -7, 7, -7]);
    let b = i32s(vec![4], vec![2, 2, -2, -2]);
    let d = one(17, Op::Div {}, vec![a.clone(), b.clone()]);
    assert_eq!(d.data, Data::I32(vec![3, -3, -3, 3]));
    let m = one(17, Op::Mod { fmod: None }, vec![a.clone(), b.clone()]);
    assert_eq!(m.data, Data::I32(vec![1, 1, -1, -1]));
    let f = one(17, Op::Mod { fmod: Some(1) }, vec![a, b]);
    assert_eq!(f.data, Data::I32(vec![1, -1, 1, -1]));
    let err = run_op(
        17,
        Op::Div {},
        vec![Some(i32s(vec![1], vec![1])), Some(i32s(vec![1], vec![0]))],
    );
    assert!(matches!(err, Err(KernelError::Invalid { .. })), "{err:?}");
}

#[test]
fn float_mod_is_c_fmod() {
    let a = f32s(vec![2], vec![-4.3, 4.3]);
    let b = f32s(vec![2], vec![2.1, -2.1]);
    let r = one(17, Op::Mod { fmod: Some(1) }, vec![a, b]);
    close(&r.to_f32().unwrap(), &[-0.1, 0.1]);
}

#[test]
fn broadcasting_shapes_and_values() {
    // [2,1,3] + [4,1] -> [2,4,3]
    let a = f32s(vec![2, 1, 3], vec![0., 1., 2., 10., 11., 12.]);
    let b = f32s(vec![4, 1], vec![100., 200., 300., 400.]);
    let r = one(17, Op::Add {}, vec![a, b]);
    assert_eq!(r.shape, vec![2, 4, 3]);
    let v = r.to_f32().unwrap();
    assert_eq!(&v[..6], &[100., 101., 102., 200., 201., 202.]);
    assert_eq!(&v[21..], &[410., 411., 412.]);
    // Scalar operand and trailing-dim broadcast.
    let s = one(
        17,
        Op::Sub {},
        vec![f32s(vec![], vec![1.0]), f32s(vec![2], vec![3., 4.])],
    );
    assert_eq!(s.to_f32().unwrap(), vec![-2., -3.]);
    let t = one(
        17,
        Op::Mul {},
        vec![
            f32s(vec![2, 2], vec![1., 2., 3., 4.]),
            f32s(vec![2], vec![10., 100.]),
        ],
    );
    assert_eq!(t.to_f32().unwrap(), vec![10., 200., 30., 400.]);
    // Middle-axis broadcast with an empty dim.
    let e = one(
        17,
        Op::Add {},
        vec![f32s(vec![0, 3], vec![]), f32s(vec![1, 3], vec![1., 2., 3.])],
    );
    assert_eq!(e.shape, vec![0, 3]);
    let bad = run_op(
        17,
        Op::Add {},
        vec![
            Some(f32s(vec![2], vec![1., 2.])),
            Some(f32s(vec![3], vec![1., 2., 3.])),
        ],
    );
    assert!(bad.is_err());
}

#[test]
fn max_propagates_nan_and_broadcasts() {
    let r = one(
        13,
        Op::Max {},
        vec![
            f32s(vec![3], vec![1.0, f32::NAN, 3.0]),
            f32s(vec![1], vec![2.0]),
            f32s(vec![3], vec![0.0, 0.0, 5.0]),
        ],
    );
    let v = r.to_f32().unwrap();
    assert_eq!(v[0], 2.0);
    assert!(v[1].is_nan());
    assert_eq!(v[2], 5.0);
    let m = one(
        13,
        Op::Mean {},
        vec![f32s(vec![2], vec![1.0, 2.0]), f32s(vec![2], vec![3.0, 6.0])],
    );
    assert_eq!(m.to_f32().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn round_is_half_to_even() {
    let r = one(
        17,
        Op::Round {},
        vec![f32s(vec![6], vec![0.5, 1.5, 2.5, -0.5, -1.5, 2.4])],
    );
    assert_eq!(r.to_f32().unwrap(), vec![0.0, 2.0, 2.0, -0.0, -2.0, 2.0]);
    let h = Tensor::new(
        DType::F16,
        vec![2],
        Data::F16(vec![f16::from_f32(2.5), f16::from_f32(3.5)]),
    )
    .unwrap();
    assert_eq!(
        one(17, Op::Round {}, vec![h]).to_f32().unwrap(),
        vec![2.0, 4.0]
    );
}

#[test]
fn cast_saturates_to_fp8() {
    let x = f32s(vec![4], vec![1000.0, -1000.0, f32::INFINITY, 1.0]);
    let cast = |sat: i64| {
        one(
            19,
            Op::Cast {
                round_mode: None,
                saturate: Some(sat),
                to: Some(i64::from(DType::F8E4M3FN.onnx_code())),
            },
            vec![x.clone()],
        )
    };
    let s = cast(1);
    assert_eq!(s.to_f32().unwrap(), vec![448.0, -448.0, 448.0, 1.0]);
    let n = cast(0).to_f32().unwrap();
    assert!(n[0].is_nan() && n[1].is_nan() && n[2].is_nan());
    assert_eq!(n[3], 1.0);
    let Data::Codes(c) = &s.data else {
        panic!("codes expected")
    };
    assert_eq!(c[0], numeric::encode(DType::F8E4M3FN, 448.0, true));
}

#[test]
fn cast_numbers_strings_and_ints() {
    let to = |d: DType| Some(i64::from(d.onnx_code()));
    let x = f32s(vec![5], vec![-1.7, 2.9, 1e-5, 0.5, f32::NAN]);
    let i = one(
        13,
        Op::Cast {
            round_mode: None,
            saturate: None,
            to: to(DType::I32),
        },
        vec![x.clone()],
    );
    assert_eq!(i.data, Data::I32(vec![-1, 2, 0, 0, i32::MIN]));
    let s = one(
        13,
        Op::Cast {
            round_mode: None,
            saturate: None,
            to: to(DType::String),
        },
        vec![x],
    );
    assert_eq!(
        s.data,
        Data::Str(vec![
            "-1.7".into(),
            "2.9000001".into(),
            "9.9999997e-06".into(),
            "0.5".into(),
            "NaN".into()
        ])
    );
    let back = one(
        13,
        Op::Cast {
            round_mode: None,
            saturate: None,
            to: to(DType::F32),
        },
        vec![
            Tensor::new(
                DType::String,
                vec![3],
                Data::Str(vec!["INF".into(), "-3.25".into(), "NaN".into()]),
            )
            .unwrap(),
        ],
    );
    let v = back.to_f32().unwrap();
    assert_eq!(v[0], f32::INFINITY);
    assert_eq!(v[1], -3.25);
    assert!(v[2].is_nan());
    let w = one(
        13,
        Op::Cast {
            round_mode: None,
            saturate: None,
            to: to(DType::U8),
        },
        vec![i32s(vec![2], vec![300, -1])],
    );
    assert_eq!(w.data, Data::U8(vec![44, 255]));
}

#[test]
fn softmax_opset_11_flattens_opset_13_uses_axis() {
    let x = f32s(vec![2, 2], vec![0.0, 0.0, 0.0, 0.0]);
    let x3 = f32s(vec![1, 2, 2], vec![0.0, 0.0, 0.0, 0.0]);
    // Opset 11, axis 1: the [1, 4] coercion spreads over all four elements.
    let a = one(11, Op::Softmax { axis: None }, vec![x3.clone()]);
    close(&a.to_f32().unwrap(), &[0.25; 4]);
    // Opset 13, axis -1: each row of two.
    let b = one(13, Op::Softmax { axis: None }, vec![x3]);
    close(&b.to_f32().unwrap(), &[0.5; 4]);
    let c = one(
        13,
        Op::Softmax { axis: Some(0) },
        vec![f32s(vec![2, 2], vec![0.0, 1.0, 0.0, 3.0])],
    );
    close(&c.to_f32().unwrap(), &[0.5, 0.119_202_92, 0.5, 0.880_797]);
    let l = one(13, Op::LogSoftmax { axis: None }, vec![x]);
    close(&l.to_f32().unwrap(), &[-std::f32::consts::LN_2; 4]);
    let h = one(
        13,
        Op::Hardmax { axis: None },
        vec![f32s(vec![2, 3], vec![1., 3., 3., 0., -1., -2.])],
    );
    assert_eq!(h.to_f32().unwrap(), vec![0., 1., 0., 1., 0., 0.]);
}

/// Softmax and LogSoftmax over contiguous rows (the last axis) give bit for bit what the
/// strided form gives over the same rows laid out as columns (axis 0 of the transpose): large
/// and tiny values, infinities, a row of -inf, a NaN, and a row length off the eight lanes.
#[test]
fn softmax_rows_match_the_strided_form() {
    let (rows, len) = (4, 19);
    let mut x: Vec<f32> = (0..rows * len)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 1.7)
        .collect();
    x[3] = 80.0;
    x[len + 5] = f32::NEG_INFINITY;
    x[len + 18] = f32::INFINITY;
    x[2 * len..3 * len].fill(f32::NEG_INFINITY);
    x[3 * len + 7] = f32::NAN;
    let xt: Vec<f32> = (0..len * rows)
        .map(|i| x[(i % rows) * len + i / rows])
        .collect();
    for op in [
        Op::Softmax { axis: Some(1) },
        Op::LogSoftmax { axis: Some(1) },
    ] {
        let by_rows = one(13, op.clone(), vec![f32s(vec![rows, len], x.clone())]);
        let by_cols = match op {
            Op::Softmax { .. } => Op::Softmax { axis: Some(0) },
            _ => Op::LogSoftmax { axis: Some(0) },
        };
        let by_cols = one(13, by_cols, vec![f32s(vec![len, rows], xt.clone())]);
        let (a, b) = (by_rows.to_f32().unwrap(), by_cols.to_f32().unwrap());
        let b: Vec<f32> = (0..rows * len)
            .map(|i| b[(i % len) * rows + i / len])
            .collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{op:?}");
        // Row 0 is a distribution.
        if matches!(op, Op::Softmax { .. }) {
            close(&[a[..len].iter().sum::<f32>()], &[1.0]);
        }
    }
}

fn red_op(make: fn(Option<i64>) -> Op, keepdims: Option<i64>) -> Op {
    make(keepdims)
}

#[test]
fn empty_reductions() {
    let x = f32s(vec![2, 0], vec![]);
    let axes = Tensor::from_i64(vec![1], vec![1]).unwrap();
    let reduce = |op: Op| one(18, op, vec![x.clone(), axes.clone()]);
    let max = reduce(red_op(
        |k| Op::ReduceMax {
            axes: None,
            keepdims: k,
            noop_with_empty_axes: None,
        },
        Some(0),
    ));
    assert_eq!(max.shape, vec![2]);
    assert_eq!(max.to_f32().unwrap(), vec![f32::NEG_INFINITY; 2]);
    let sum = reduce(Op::ReduceSum {
        axes: None,
        keepdims: None,
        noop_with_empty_axes: None,
    });
    assert_eq!(sum.shape, vec![2, 1]);
    assert_eq!(sum.to_f32().unwrap(), vec![0.0; 2]);
    let prod = reduce(Op::ReduceProd {
        axes: None,
        keepdims: Some(0),
        noop_with_empty_axes: None,
    });
    assert_eq!(prod.to_f32().unwrap(), vec![1.0; 2]);
    let ls = reduce(Op::ReduceLogSum {
        axes: None,
        keepdims: Some(0),
        noop_with_empty_axes: None,
    });
    assert_eq!(ls.to_f32().unwrap(), vec![f32::NEG_INFINITY; 2]);
    let xi = i32s(vec![2, 0], vec![]);
    let mi = one(
        18,
        Op::ReduceMax {
            axes: None,
            keepdims: Some(0),
            noop_with_empty_axes: None,
        },
        vec![xi, axes],
    );
    assert_eq!(mi.data, Data::I32(vec![i32::MIN; 2]));
}

#[test]
fn reductions_over_axes() {
    // [2,3,2], reduce axes 0 and 2 (not adjacent) and axis 1 (middle).
    let x = f32s(vec![2, 3, 2], (0..12).map(|v| v as f32).collect());
    let a = one(
        13,
        Op::ReduceSum {
            axes: None,
            keepdims: Some(0),
            noop_with_empty_axes: None,
        },
        vec![x.clone(), Tensor::from_i64(vec![2], vec![0, -1]).unwrap()],
    );
    assert_eq!(
        a.to_f32().unwrap(),
        vec![0. + 1. + 6. + 7., 2. + 3. + 8. + 9., 4. + 5. + 10. + 11.]
    );
    let m = one(
        11,
        Op::ReduceMean {
            axes: Some(vec![1]),
            keepdims: None,
            noop_with_empty_axes: None,
        },
        vec![x.clone()],
    );
    assert_eq!(m.shape, vec![2, 1, 2]);
    assert_eq!(m.to_f32().unwrap(), vec![2., 3., 8., 9.]);
    let all = one(
        11,
        Op::ReduceMax {
            axes: None,
            keepdims: Some(0),
            noop_with_empty_axes: None,
        },
        vec![x.clone()],
    );
    assert_eq!(all.shape, Vec::<usize>::new());
    assert_eq!(all.to_f32().unwrap(), vec![11.0]);
    let am = one(
        13,
        Op::ArgMax {
            axis: Some(1),
            keepdims: Some(0),
            select_last_index: None,
        },
        vec![x],
    );
    assert_eq!(am.data, Data::I64(vec![2, 2, 2, 2]));
    let ties = f32s(vec![4], vec![1., 3., 3., 0.]);
    let first = one(
        13,
        Op::ArgMax {
            axis: None,
            keepdims: None,
            select_last_index: None,
        },
        vec![ties.clone()],
    );
    let last = one(
        13,
        Op::ArgMax {
            axis: None,
            keepdims: None,
            select_last_index: Some(1),
        },
        vec![ties],
    );
    assert_eq!(
        (first.data, last.data),
        (Data::I64(vec![1]), Data::I64(vec![2]))
    );
}

#[test]
fn cumsum_exclusive_reverse() {
    let x = f32s(vec![4], vec![1., 2., 3., 4.]);
    let axis = Tensor::from_i64(vec![], vec![0]).unwrap();
    let r = one(
        14,
        Op::CumSum {
            exclusive: Some(1),
            reverse: Some(1),
        },
        vec![x, axis],
    );
    assert_eq!(r.to_f32().unwrap(), vec![9., 7., 4., 0.]);
}

#[test]
fn where_clip_and_activations() {
    let c = Tensor::new(DType::Bool, vec![2], Data::Bool(vec![true, false])).unwrap();
    let s = |v: &[&str]| {
        Tensor::new(
            DType::String,
            vec![v.len()],
            Data::Str(v.iter().map(|x| x.to_string()).collect()),
        )
        .unwrap()
    };
    let w = one(16, Op::Where {}, vec![c, s(&["a", "b"]), s(&["c"])]);
    assert_eq!(w.data, Data::Str(vec!["a".into(), "c".into()]));
    let clipped = one(
        13,
        Op::Clip {
            min: None,
            max: None,
        },
        vec![
            i32s(vec![3], vec![-5, 0, 5]),
            i32s(vec![], vec![-1]),
            i32s(vec![], vec![1]),
        ],
    );
    assert_eq!(clipped.data, Data::I32(vec![-1, 0, 1]));
    let old = one(
        6,
        Op::Clip {
            min: Some(-1.0),
            max: None,
        },
        vec![f32s(vec![2], vec![-5.0, 5.0])],
    );
    assert_eq!(old.to_f32().unwrap(), vec![-1.0, 5.0]);
    let gelu = one(
        20,
        Op::Gelu { approximate: None },
        vec![f32s(vec![2], vec![1.0, -1.0])],
    );
    close(&gelu.to_f32().unwrap(), &[0.841_344_7, -0.158_655_26]);
    let p = one(
        16,
        Op::PRelu {},
        vec![
            f32s(vec![2, 2], vec![-1., 1., -2., 2.]),
            f32s(vec![2], vec![0.5, 0.25]),
        ],
    );
    assert_eq!(p.to_f32().unwrap(), vec![-0.5, 1., -1., 2.]);
}

#[test]
fn shifts_and_small_int_casts() {
    let x = Tensor::new(DType::I8, vec![3], Data::I8(vec![-8, 4, -1])).unwrap();
    let y = Tensor::new(DType::I8, vec![3], Data::I8(vec![8, 9, -1])).unwrap();
    let r = one(
        18,
        Op::BitShift {
            direction: Some("RIGHT".into()),
        },
        vec![x.clone(), y.clone()],
    );
    assert_eq!(r.data, Data::I8(vec![-1, 0, -1]));
    let l = one(
        18,
        Op::BitShift {
            direction: Some("LEFT".into()),
        },
        vec![x, y],
    );
    assert_eq!(l.data, Data::I8(vec![0, 0, 0]));
    // Out-of-range values become 0 in int4 (numpy with ml_dtypes); fp4 NaN becomes -0.
    let to = |d: DType| Op::Cast {
        round_mode: None,
        saturate: None,
        to: Some(i64::from(d.onnx_code())),
    };
    let i4 = one(
        21,
        to(DType::I4),
        vec![f32s(vec![4], vec![-9.0, -8.0, 7.9, 8.0])],
    );
    assert_eq!(i4.to_f32().unwrap(), vec![0.0, -8.0, 7.0, 0.0]);
    let f4 = one(
        23,
        to(DType::F4E2M1),
        vec![f32s(vec![2], vec![f32::NAN, 5.5])],
    );
    let v = f4.to_f32().unwrap();
    assert!(v[0] == 0.0 && v[0].is_sign_negative());
    assert_eq!(v[1], 6.0);
    let m = one(
        13,
        Op::Mod { fmod: None },
        vec![
            f32s(vec![3], vec![0.0, -3.0, 1.0]),
            f32s(vec![3], vec![-2.0, f32::INFINITY, -f32::INFINITY]),
        ],
    );
    let v = m.to_f32().unwrap();
    assert!(v[0] == 0.0 && v[0].is_sign_negative());
    assert_eq!(&v[1..], &[f32::INFINITY, f32::NEG_INFINITY]);
}

#[test]
fn cast_to_e8m0_round_modes() {
    let x = f32s(vec![4], vec![3.0, 2.0, -3.0, 5.0]);
    let cast = |mode: &str| {
        let t = one(
            25,
            Op::Cast {
                round_mode: Some(mode.to_owned()),
                saturate: None,
                to: Some(i64::from(DType::F8E8M0.onnx_code())),
            },
            vec![x.clone()],
        );
        t.to_f32().unwrap()
    };
    assert_eq!(cast("up"), vec![4.0, 2.0, 4.0, 8.0]);
    assert_eq!(cast("down"), vec![2.0, 2.0, 2.0, 4.0]);
    assert_eq!(cast("nearest"), vec![4.0, 2.0, 4.0, 4.0]);
}

/// The error function by its Maclaurin series below 2 and the continued fraction of `erfc` up to
/// 6 (to about 1e-15): the reference `libm`'s f64 `erf` and the interpreter's f32 erf are held to.
fn series_erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.0 {
        let x2 = a * a;
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        let mut f = 0.0;
        let mut k = 60.0;
        while k > 0.0 {
            f = (k / 2.0) / (a + f);
            k -= 1.0;
        }
        1.0 - (-a * a).exp() / (a + f) / std::f64::consts::PI.sqrt()
    } else {
        1.0
    };
    if x < 0.0 { -r } else { r }
}

#[test]
fn erf_is_within_ulps_of_the_series() {
    let mut worst32 = 0.0f64;
    let mut worst64 = 0.0f64;
    for i in -60_000..=60_000 {
        let x = f64::from(i) * 1e-4;
        let want = series_erf(x);
        let got64 = super::unary::erf(x);
        worst64 = worst64.max((got64 - want).abs() / f64::EPSILON);
        let x32 = x as f32;
        let want32 = series_erf(f64::from(x32));
        let got32 = crate::vmath::erf(x32);
        let ulp = f64::from(f32::EPSILON) * want32.abs().max(f64::from(f32::MIN_POSITIVE));
        worst32 = worst32.max((f64::from(got32) - want32).abs() / ulp);
    }
    // The series itself is good to about 1e-15 (4.5 epsilons).
    assert!(worst64 <= 8.0, "f64 erf off by {worst64} epsilons");
    // f32: the interpreter's vectorized erf (crate::vmath), faithfully rounded.
    assert!(worst32 <= 1.5, "f32 erf off by {worst32} ulp");
    assert!(crate::vmath::erf(f32::NAN).is_nan() && super::unary::erf(f64::NAN).is_nan());
    assert_eq!(crate::vmath::erf(f32::INFINITY), 1.0);
}
