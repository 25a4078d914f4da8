//! The compile API on a committed fixture: progress events, the report's stages, and usage
//! errors before any work.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mmq_compiler::{
    Accuracy, CalibrationSource, CompileError, CompileOptions, Precision, Progress, Scheme, Stage,
    compile, load,
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
        precision: Precision::of(Scheme::Int8),
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
                precision: Precision::Int4 {
                    int4: mmq_compiler::Int4Options {
                        block: 48,
                        ..Default::default()
                    },
                    awq: false,
                },
                ..CompileOptions::default()
            },
            "--block 48: expected 32, 64 or 128",
        ),
        (
            CompileOptions {
                precision: Precision::of(Scheme::Int8),
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

/// The settings a front end takes one by one become a typed plan, or an error naming the setting
/// and the plans that take it, in the front end's own words.
#[test]
fn settings_that_do_not_fit_their_scheme_are_refused_by_name() {
    use mmq_compiler::{ObserverChoice, Opt, Quant, QuantFlags, Spelling};
    let int = |s: Scheme| Some(Quant::One(s));
    let cases: Vec<(QuantFlags, &str)> = vec![
        (
            QuantFlags {
                awq: true,
                ..Default::default()
            },
            "--awq needs --quant int4, not no --quant",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Int4),
                smoothquant: Some(0.5),
                ..Default::default()
            },
            "--smoothquant needs --quant int8 or int8-dynamic, not --quant int4",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Int8),
                block: Some(64),
                ..Default::default()
            },
            "--block 64 needs --quant int4, mixed or --auto, not --quant int8",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Fp8),
                asym: true,
                ..Default::default()
            },
            "--asym needs --quant int4, mixed or --auto, not --quant fp8",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Int4),
                observer: Some(ObserverChoice::Measured),
                ..Default::default()
            },
            "--observer auto needs --quant int8 or --auto, not --quant int4",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Fp16),
                observer: Some("entropy".parse().expect("observer")),
                ..Default::default()
            },
            "--observer entropy needs --quant int8, fp8, mixed or --auto, not --quant fp16",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Int8),
                granularity: Some(mmq_passes::quant::int8::ActGranularity::PerToken),
                ..Default::default()
            },
            "--granularity per-token needs --quant int8-dynamic, not --quant int8",
        ),
        (
            QuantFlags {
                quant: Some(Quant::Mixed),
                ..Default::default()
            },
            "--quant mixed needs --precision-map",
        ),
        (
            QuantFlags {
                quant: int(Scheme::Int8),
                auto: Some(0.99),
                ..Default::default()
            },
            "--auto cannot be used with --quant",
        ),
    ];
    for (flags, want) in cases {
        let e = flags.clone().precision().expect_err(want);
        assert_eq!(e.to_string(), want);
    }

    // Another front end's words for the same error.
    struct Keywords;
    impl Spelling for Keywords {
        fn option(&self, o: Opt) -> String {
            o.flag().trim_start_matches('-').replace('-', "_")
        }
        fn setting(&self, o: Opt, v: &str) -> String {
            format!("{}={}", self.option(o), self.value(v))
        }
        fn value(&self, v: &str) -> String {
            format!("{v:?}")
        }
    }
    let e = QuantFlags {
        quant: int(Scheme::Int4),
        smoothquant: Some(0.5),
        ..Default::default()
    }
    .precision()
    .expect_err("refused");
    assert_eq!(
        e.message(&Keywords),
        "smoothquant needs quant=\"int8\" or \"int8-dynamic\", not quant=\"int4\""
    );

    // What fits becomes the plan with its settings.
    let p = QuantFlags {
        quant: int(Scheme::Int4),
        block: Some(64),
        asym: true,
        awq: true,
        ..Default::default()
    }
    .precision()
    .expect("fits");
    assert!(
        matches!(
            p,
            Precision::Int4 {
                int4: mmq_compiler::Int4Options {
                    block: 64,
                    symmetric: false,
                    accuracy_level: None
                },
                awq: true
            }
        ),
        "{p:?}"
    );
    assert!(matches!(
        QuantFlags::default().precision(),
        Ok(Precision::Float)
    ));
}
