//! `MatMulNBits`' `accuracy_level` comes from the target unless the options name one: the ort
//! target asks for ONNX Runtime's int8 compute (4), `Some(0)` leaves the attribute out, another
//! level is written as given, and the trt target (whose plugin computes in f16) writes none.

use mmq_compiler::{CompileOptions, Int4Options, Precision, compile};
use mmq_ir::{Module, Op};
use mmq_passes::targets::TargetRef;
use mmq_tests::repo_root;

/// `--quant int4` with these settings.
fn int4(accuracy_level: Option<i64>, symmetric: bool) -> Precision {
    Precision::Int4 {
        int4: Int4Options {
            accuracy_level,
            symmetric,
            ..Int4Options::default()
        },
        awq: false,
    }
}

/// The `accuracy_level` of every INT4 product (`MatMulNBits` or trt's `MmqMatMulNBits`).
fn levels(target: &str, level: Option<i64>, symmetric: bool) -> Vec<Option<i64>> {
    let path = repo_root().join("tests/fixtures/llama_gqa_kv/model.onnx");
    let (mut m, _): (Module, _) = mmq_compiler::load::load(&[path])
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}", e.rendered));
    let options = CompileOptions {
        target: TargetRef::by_name(target).expect("target"),
        precision: int4(level, symmetric),
        accuracy: mmq_compiler::Accuracy::Off,
        ..CompileOptions::default()
    };
    compile(&mut m, &options).unwrap_or_else(|e| panic!("{target} {level:?}: {e}"));
    let g = m.entries[0].graph;
    let found: Vec<Option<i64>> = m.graphs[g]
        .nodes()
        .iter()
        .filter_map(|&n| match &m.nodes[n].op {
            Op::MatMulNBits { accuracy_level, .. } => Some(*accuracy_level),
            // The TensorRT plugin has no accuracy level.
            Op::MmqMatMulNBits { .. } => Some(None),
            _ => None,
        })
        .collect();
    assert!(!found.is_empty(), "{target} {level:?}: no INT4 product");
    found
}

#[test]
fn the_target_chooses_and_the_options_override() {
    assert!(levels("ort", None, true).iter().all(|&l| l == Some(4)));
    assert!(levels("ort", None, false).iter().all(|&l| l == Some(4)));
    assert!(levels("ort", Some(0), true).iter().all(Option::is_none));
    assert!(levels("ort", Some(1), true).iter().all(|&l| l == Some(1)));
    // Asymmetric blocks: trt's MmqMatMulNBits plugin (symmetric ones become DequantizeLinear).
    assert!(levels("trt", None, false).iter().all(Option::is_none));
}

#[test]
fn a_level_out_of_range_is_refused() {
    let options = CompileOptions {
        precision: int4(Some(7), true),
        ..CompileOptions::default()
    };
    let e = options.check().expect_err("level 7").to_string();
    assert!(e.contains("--int4-accuracy-level 7"), "{e}");
    let trt = CompileOptions {
        target: TargetRef::by_name("trt").expect("trt"),
        precision: int4(Some(4), true),
        ..options
    };
    let e = trt.check().expect_err("trt has no MatMulNBits").to_string();
    assert!(e.contains("target trt has none"), "{e}");
}
