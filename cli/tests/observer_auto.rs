//! `--observer auto`: the INT8 model of each observer is measured on samples kept from the
//! ranges, the best one is chosen, and the model equals the one compiled with that observer
//! named; on both targets.

mod common;

use common::{fixture, run_in, scratch};

/// The figures and the choice of the `observer auto:` note.
fn choice(err: &str) -> (Vec<(String, f64)>, String) {
    let line = err
        .lines()
        .find(|l| l.contains("observer auto: cosine of"))
        .unwrap_or_else(|| panic!("no observer line: {err}"));
    let (figures, chosen) = line
        .rsplit_once("; chose ")
        .and_then(|(head, chosen)| Some((head.rsplit_once(": ")?.1, chosen)))
        .unwrap_or_else(|| panic!("{line}"));
    let figures = figures
        .split(", ")
        .map(|f| {
            let (name, value) = f.rsplit_once(' ').unwrap_or_else(|| panic!("{f}"));
            (
                name.to_owned(),
                value.parse().unwrap_or_else(|_| panic!("{f}")),
            )
        })
        .collect();
    (figures, chosen.to_owned())
}

#[test]
fn the_best_measured_observer_is_chosen_and_compiles_as_if_named() {
    let fx = fixture("clip");
    for target in ["ort", "trt"] {
        let dir = scratch(&format!("observer-auto-{target}"));
        let compile = |observer: &str, out: &str| {
            run_in(
                &dir,
                &[
                    "compile",
                    &fx,
                    "--target",
                    target,
                    "--quant",
                    "int8",
                    "--placement",
                    "all",
                    "--calib-random",
                    "12",
                    "--observer",
                    observer,
                    "-o",
                    out,
                ],
            )
        };
        let (code, _, err) = compile("auto", "auto.out");
        assert_eq!(code, 0, "{target}: {err}");
        let (figures, chosen) = choice(&err);
        let names: Vec<&str> = figures.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["minmax", "percentile:99.99", "entropy", "mse"],
            "{err}"
        );
        let best = figures
            .iter()
            .fold(None::<&(String, f64)>, |b, f| match b {
                Some(b) if b.1 >= f.1 => Some(b),
                _ => Some(f),
            })
            .expect("figures");
        assert_eq!(chosen, best.0, "{target}: {err}");
        // On this fixture the measurement moves off the default.
        assert_eq!(chosen, "mse", "{target}: {err}");
        assert!(
            err.contains("on 3 sample(s) kept from the ranges"),
            "a quarter of 12 judges: {err}"
        );
        assert!(err.contains(&format!("({chosen})")), "{err}");
        let (code, _, err) = compile(&chosen, "named.out");
        assert_eq!(code, 0, "{target}: {err}");
        let model = |out: &str| {
            let p = dir.join(out);
            let p = if target == "trt" {
                p.join("model.onnx")
            } else {
                p
            };
            std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        assert!(
            model("auto.out") == model("named.out"),
            "{target}: --observer auto and --observer {chosen} differ"
        );
    }
    // Only INT8 models are compared.
    let dir = scratch("observer-auto-usage");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fx,
            "--quant",
            "int4",
            "--observer",
            "auto",
            "-o",
            "x.onnx",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--observer auto") && err.contains("--quant int4"),
        "{err}"
    );
    assert!(!dir.join("x.onnx").exists());
}
