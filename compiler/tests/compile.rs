//! The compile API on a committed fixture: progress events, the report's stages, and usage
//! errors before any work.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mmq_compiler::{
    Accuracy, CalibrationSource, CompileError, CompileOptions, Precision, Progress, QuantScheme,
    Stage, compile, load,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/fixtures/{name}/model.onnx"))
}

fn module(name: &str) -> mmq_ir::Module {
    let (m, warnings) = load::load(&[fixture(name)])
        .and_then(|l| l.verified())
        .expect("loads");
    assert!(warnings.is_empty(), "{warnings}");
    m
}

#[test]
fn calibration_reports_progress_once_per_sample_and_finishes_once() {
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&events);
    let options = CompileOptions {
        precision: Precision::Scheme(QuantScheme::Int8),
        calibration: CalibrationSource::Random { count: 3, seed: 0 },
        accuracy: Accuracy::Off,
        progress: Some(Arc::new(move |p: Progress<'_>| {
            log.lock().expect("lock").push(match p {
                Progress::Start { what, total } => format!("start {what} {total:?}"),
                Progress::Advance => "advance".to_owned(),
                Progress::Finish => "finish".to_owned(),
            });
        })),
        ..CompileOptions::default()
    };
    let mut m = module("vit");
    let report = compile(&mut m, &options).expect("compiles");
    let events = events.lock().expect("lock").clone();
    assert_eq!(
        events,
        [
            "start calibrating Some(3)",
            "advance",
            "advance",
            "advance",
            "finish"
        ]
    );
    let stages: Vec<(Stage, &str)> = report
        .passes
        .iter()
        .map(|p| (p.stage, p.name.as_str()))
        .collect();
    let int8 = stages
        .iter()
        .position(|(_, n)| *n == "int8")
        .expect("int8 ran");
    assert_eq!(stages[int8].0, Stage::Quantize);
    assert!(
        stages[..int8].iter().all(|(s, _)| *s == Stage::Optimize),
        "{stages:?}"
    );
    assert!(
        stages[int8 + 1..].iter().all(|(s, _)| *s == Stage::Finish),
        "{stages:?}"
    );
    let notes = &report.passes[int8].notes;
    assert!(
        notes[0].starts_with("calibrated ") && notes[0].ends_with("on 3 samples (minmax)"),
        "{notes:?}"
    );
    assert!(report.accuracy.is_none());
}

#[test]
fn options_that_do_not_fit_fail_before_any_work() {
    let mut m = module("vit");
    let before = mmq_ir::text::print(&m);
    for (options, want) in [
        (
            CompileOptions {
                awq: true,
                ..CompileOptions::default()
            },
            "--awq needs --quant int4, not no --quant",
        ),
        (
            CompileOptions {
                precision: Precision::Scheme(QuantScheme::Int8),
                calibration: CalibrationSource::Random { count: 0, seed: 0 },
                ..CompileOptions::default()
            },
            "need at least one sample",
        ),
        (
            CompileOptions {
                calibration: CalibrationSource::Random { count: 4, seed: 0 },
                ..CompileOptions::default()
            },
            "--calib-random: nothing is quantized",
        ),
        (
            CompileOptions {
                dump_after: Some(mmq_passes::DumpAfter::Pass("int8".into())),
                ..CompileOptions::default()
            },
            "--dump-after int8: no such pass",
        ),
    ] {
        let err = compile(&mut m, &options).expect_err("refused");
        assert!(matches!(err, CompileError::Options(_)), "{err:?}");
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!(mmq_ir::text::print(&m), before, "the module is untouched");
    }
}
