//! The ONNX node test suite through the reference interpreter: each case's model is imported and
//! run on the case's first data set, and every output is compared with the expected one the way
//! the ONNX backend test runner does (same dtype and shape; numbers within the case's rtol/atol,
//! NaN where NaN is expected; strings and bools exact; small float and int types by decoded
//! value). Sequences compare element by element, optionals by presence and then content; the
//! data set layout for them is described in `tools/oracle.py` (`node-dump --with-data`).
//!
//! `MMQ_NODE_FILTER=add,matmul` runs only the cases whose name contains one of the substrings
//! and fails when any of them fails. Without a filter every case runs and the failures must be
//! exactly those listed in `tests/interp-node-suite-expectations.txt` (`CASE REASON` per line).
//! The actual list is written to `target/interp-node-suite-actual.txt`.

#![allow(
    clippy::print_stderr,
    reason = "the test reports its pass count and failures"
)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use mmq_ir::DType;
use mmq_kernels::{Data, Interpreter, RtValue, Tensor};
use mmq_tests::{check_expectations, oracle, repo_root, scratch_dir};

const EXPECTATIONS: &str = "tests/interp-node-suite-expectations.txt";
const ACTUAL: &str = "target/interp-node-suite-actual.txt";
/// A case still running after this long is recorded as failed (its thread is left behind).
const CASE_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_RTOL: f64 = 1e-3;
const DEFAULT_ATOL: f64 = 1e-7;

/// Why a case fails, and the op the failure is attributed to (for the summary).
struct Failure {
    reason: String,
    op: String,
}

/// Reads the values `stem_<i>` of a data set, in index order, each with its name: a tensor
/// `stem_<i>.pb`, a sequence directory `stem_<i>.seq/`, an optional `stem_<i>.opt.pb` /
/// `stem_<i>.opt.seq/` holding a value or `stem_<i>.none` holding none. A
/// `stem_<i>.unsupported` marker (any other kind of value) is an error.
fn data_values(dir: &Path, stem: &str) -> Result<Vec<(String, RtValue)>, String> {
    let mut values = Vec::new();
    for i in 0.. {
        let base = format!("{stem}_{i}");
        let path = |suffix: &str| dir.join(format!("{base}{suffix}"));
        let value = if path(".pb").is_file() {
            let (name, t) = read_tensor(&path(".pb"))?;
            (name, RtValue::from(t))
        } else if path(".seq").is_dir() {
            let (name, seq) = read_sequence(&path(".seq"))?;
            (name, RtValue::Sequence(seq))
        } else if path(".opt.pb").is_file() {
            let (name, t) = read_tensor(&path(".opt.pb"))?;
            let inner = RtValue::from(t);
            (name, RtValue::Optional(Some(Box::new(inner))))
        } else if path(".opt.seq").is_dir() {
            let (name, seq) = read_sequence(&path(".opt.seq"))?;
            let inner = RtValue::Sequence(seq);
            (name, RtValue::Optional(Some(Box::new(inner))))
        } else if path(".none").is_file() {
            let name = std::fs::read_to_string(path(".none"))
                .map_err(|e| format!("data: {base}.none: {e}"))?;
            (name.trim().to_owned(), RtValue::Optional(None))
        } else if path(".unsupported").is_file() {
            let kind = std::fs::read_to_string(path(".unsupported")).unwrap_or_default();
            return Err(format!("non-tensor data: {stem} {i} is a {}", kind.trim()));
        } else {
            break;
        };
        values.push(value);
    }
    Ok(values)
}

fn read_tensor(path: &Path) -> Result<(String, Tensor), String> {
    let c = mmq_onnx::load_tensor(path).map_err(|e| format!("data: {e}"))?;
    let t = Tensor::from_const(&c).map_err(|e| format!("data: {e}"))?;
    Ok((c.name.unwrap_or_default(), t))
}

/// A sequence directory: `name.txt`, `dtype.txt` (ONNX element type code) and the elements
/// `0.pb`, `1.pb`, ... (every one of that dtype).
fn read_sequence(dir: &Path) -> Result<(String, Vec<Arc<Tensor>>), String> {
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .map(|s| s.trim().to_owned())
            .map_err(|e| format!("data: {}: {e}", dir.join(file).display()))
    };
    let name = read("name.txt")?;
    let code = read("dtype.txt")?;
    let dtype = code
        .parse::<i32>()
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| format!("data: {}: unknown element type {code:?}", dir.display()))?;
    let mut elems = Vec::new();
    for k in 0.. {
        let p = dir.join(format!("{k}.pb"));
        if !p.is_file() {
            break;
        }
        let (_, t) = read_tensor(&p)?;
        if t.dtype != dtype {
            return Err(format!(
                "data: {}: element {k} is {}, the sequence holds {dtype}",
                dir.display(),
                t.dtype
            ));
        }
        elems.push(Arc::new(t));
    }
    Ok((name, elems))
}

fn tolerances(case: &Path) -> (f64, f64) {
    let text = std::fs::read_to_string(case.join("tolerance.txt")).unwrap_or_default();
    let mut it = text.split_whitespace().map(str::parse::<f64>);
    match (it.next(), it.next()) {
        (Some(Ok(r)), Some(Ok(a))) => (r, a),
        _ => (DEFAULT_RTOL, DEFAULT_ATOL),
    }
}

/// Compares one output like `numpy.testing.assert_allclose(actual, expected, rtol, atol)`.
fn compare(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if actual.dtype != expected.dtype {
        return Err(format!(
            "dtype {} != expected {}",
            actual.dtype, expected.dtype
        ));
    }
    if actual.shape != expected.shape {
        return Err(format!(
            "shape {:?} != expected {:?}",
            actual.shape, expected.shape
        ));
    }
    match (&actual.data, &expected.data) {
        (Data::Str(a), Data::Str(b)) => {
            return match a.iter().zip(b).position(|(x, y)| x != y) {
                Some(i) => Err(format!("element {i}: {:?} != expected {:?}", a[i], b[i])),
                None => Ok(()),
            };
        }
        (Data::Bool(a), Data::Bool(b)) => {
            return match a.iter().zip(b).position(|(x, y)| x != y) {
                Some(i) => Err(format!("element {i}: {} != expected {}", a[i], b[i])),
                None => Ok(()),
            };
        }
        _ => {}
    }
    let a = actual.to_f64().map_err(|e| e.to_string())?;
    let b = expected.to_f64().map_err(|e| e.to_string())?;
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let ok = if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * y.abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, x, y));
        }
    }
    match first {
        Some((i, x, y)) => Err(format!(
            "{bad} of {} elements differ (rtol={rtol:e} atol={atol:e}); first at {i}: {x} != expected {y}",
            a.len()
        )),
        None => Ok(()),
    }
}

/// The kind of a runtime value, for messages.
fn kind(v: &RtValue) -> &'static str {
    match v {
        RtValue::Tensor(_) => "tensor",
        RtValue::Sequence(_) => "sequence",
        RtValue::Optional(Some(_)) => "optional holding a value",
        RtValue::Optional(None) => "empty optional",
    }
}

/// Compares any runtime value: tensors with [`compare`], sequences by length and then element by
/// element, optionals by presence and then content.
fn compare_value(actual: &RtValue, expected: &RtValue, rtol: f64, atol: f64) -> Result<(), String> {
    match (actual, expected) {
        (RtValue::Tensor(a), RtValue::Tensor(b)) => compare(a, b, rtol, atol),
        (RtValue::Sequence(a), RtValue::Sequence(b)) => {
            if a.len() != b.len() {
                return Err(format!(
                    "sequence of {} tensors, expected {}",
                    a.len(),
                    b.len()
                ));
            }
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                compare(x, y, rtol, atol).map_err(|e| format!("sequence element {k}: {e}"))?;
            }
            Ok(())
        }
        (RtValue::Optional(None), RtValue::Optional(None)) => Ok(()),
        (RtValue::Optional(Some(a)), RtValue::Optional(Some(b))) => {
            compare_value(a, b, rtol, atol).map_err(|e| format!("optional: {e}"))
        }
        _ => Err(format!("{}, expected {}", kind(actual), kind(expected))),
    }
}

/// The op named in an interpreter error (`run: name (Op): ...` or `run: Op node: ...`), if any.
fn op_in_reason(reason: &str) -> Option<String> {
    let label = reason.strip_prefix("run: ")?.split(": ").next()?;
    let op = match label.rsplit_once(" (") {
        Some((_, rest)) => rest.strip_suffix(')')?,
        None => label.strip_suffix(" node")?,
    };
    (!op.is_empty() && !op.contains(' ')).then(|| op.to_owned())
}

/// Runs one case directory; the error is why it fails.
fn run_case(dir: &Path) -> Result<(), Failure> {
    let fail = |reason: String, op: &str| Failure {
        reason,
        op: op.to_owned(),
    };
    let model = dir.join("model.onnx");
    let m = mmq_onnx::load_files(&[model.as_path()], &mmq_onnx::LoadOptions::default())
        .map_err(|e| fail(format!("import: {e}"), "(import)"))?;
    let graph = m.entries[0].graph;
    // The op under test: the only node's op, else the first node's (expanded cases).
    let nodes = &m.graphs[graph].nodes();
    let main_op = match nodes.len() {
        0 => "(no nodes)".to_owned(),
        1 => m.nodes[nodes[0]].op.op_type().to_owned(),
        _ => format!("{} (multi-node)", m.nodes[nodes[0]].op.op_type()),
    };
    let data = dir.join("test_data_set_0");
    if !data.is_dir() {
        return Err(fail("no data set".to_owned(), &main_op));
    }
    let inputs = data_values(&data, "input").map_err(|e| fail(e, "(non-tensor data)"))?;
    let outputs = data_values(&data, "output").map_err(|e| fail(e, "(non-tensor data)"))?;
    let feeds: HashMap<String, RtValue> = inputs.into_iter().collect();
    let got = Interpreter::new(&m).run(graph, &feeds).map_err(|e| {
        let reason = format!("run: {e}");
        let op = op_in_reason(&reason).unwrap_or_else(|| main_op.clone());
        fail(reason, &op)
    })?;
    if got.len() != outputs.len() {
        return Err(fail(
            format!("{} outputs, expected {}", got.len(), outputs.len()),
            &main_op,
        ));
    }
    let (rtol, atol) = tolerances(dir);
    for (i, ((name, actual), (_, expected))) in got.iter().zip(&outputs).enumerate() {
        compare_value(actual, expected, rtol, atol)
            .map_err(|e| fail(format!("output {i} ({name}): {e}"), &main_op))?;
    }
    Ok(())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string payload)".to_owned())
}

/// Runs a case on its own thread, catching panics and giving up after [`CASE_TIMEOUT`].
fn run_isolated(dir: PathBuf) -> Result<(), Failure> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("interp-case".to_owned())
        .stack_size(64 << 20)
        .spawn(move || {
            let r = std::panic::catch_unwind(|| run_case(&dir)).unwrap_or_else(|p| {
                Err(Failure {
                    reason: format!("panic: {}", panic_message(&*p)),
                    op: "(panic)".to_owned(),
                })
            });
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(Failure {
            reason: format!("cannot start a thread: {e}"),
            op: "(harness)".to_owned(),
        });
    }
    rx.recv_timeout(CASE_TIMEOUT).unwrap_or_else(|_| {
        Err(Failure {
            reason: format!("timeout after {}s", CASE_TIMEOUT.as_secs()),
            op: "(timeout)".to_owned(),
        })
    })
}

/// Dumps the suite with data, reusing the previous dump when the oracle script and the Python
/// environment are unchanged (the stamp file records both).
fn dump_cases() -> PathBuf {
    let root = repo_root();
    let stamp = format!(
        "{}\n{}",
        std::fs::read_to_string(root.join("tools/oracle.py")).unwrap_or_default(),
        std::fs::read_to_string(root.join(".venv/pyvenv.cfg")).unwrap_or_default()
    );
    let cases = root.join("target/mmq-test-scratch/interp-node-suite/cases");
    let stamp_path = cases.join("dump.stamp");
    if std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
        && cases.join("cases.txt").is_file()
    {
        return cases;
    }
    let cases = scratch_dir("interp-node-suite/cases");
    let out = oracle(&[
        OsStr::new("node-dump"),
        cases.as_os_str(),
        OsStr::new("--with-data"),
    ]);
    assert!(
        out.status.success(),
        "node-dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&stamp_path, stamp).expect("write the dump stamp");
    cases
}

#[test]
fn interpreter_node_suite() {
    let cases = dump_cases();
    let listing = std::fs::read_to_string(cases.join("cases.txt")).expect("cases.txt");
    let all: Vec<&str> = listing.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        all.len() > 1500,
        "the node suite has {} cases, expected ~1900",
        all.len()
    );
    let filter: Option<Vec<String>> = std::env::var("MMQ_NODE_FILTER").ok().map(|f| {
        f.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    });
    let names: Vec<&str> = match &filter {
        Some(subs) => all
            .iter()
            .copied()
            .filter(|n| subs.iter().any(|s| n.contains(s.as_str())))
            .collect(),
        None => all.clone(),
    };

    // Panics inside cases are reported as failures; keep their default report off stderr.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some("interp-case") {
            default_hook(info);
        }
    }));
    let start = std::time::Instant::now();
    let mut failing: BTreeMap<String, Failure> = BTreeMap::new();
    for name in &names {
        if let Err(mut f) = run_isolated(cases.join(name)) {
            f.reason = f.reason.replace('\n', " ").chars().take(160).collect();
            failing.insert((*name).to_owned(), f);
        }
    }
    let elapsed = start.elapsed();
    let _ = std::panic::take_hook();

    let passing = names.len() - failing.len();
    let mut by_op: BTreeMap<&str, usize> = BTreeMap::new();
    for f in failing.values() {
        *by_op.entry(f.op.as_str()).or_default() += 1;
    }
    let mut by_op: Vec<(&str, usize)> = by_op.into_iter().collect();
    by_op.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let summary: Vec<String> = by_op.iter().map(|(op, n)| format!("{op} {n}")).collect();
    eprintln!(
        "interpreter: {passing} of {} cases pass ({:.1}s)\nfailures by op: {}",
        names.len(),
        elapsed.as_secs_f64(),
        summary.join(", ")
    );

    if filter.is_some() {
        for (name, f) in &failing {
            eprintln!("FAIL {name}: {}", f.reason);
        }
        assert!(
            failing.is_empty(),
            "{} of {} selected cases fail (listed above)",
            failing.len(),
            names.len()
        );
        return;
    }

    let reasons: BTreeMap<String, String> = failing
        .iter()
        .map(|(k, f)| (k.clone(), f.reason.clone()))
        .collect();
    eprintln!("actual list in {ACTUAL}");
    if let Err(e) = check_expectations(EXPECTATIONS, &reasons, ACTUAL) {
        panic!("{e}");
    }
}

#[test]
fn compare_value_checks_sequences_and_optionals() {
    let t = |v: Vec<f32>| {
        Arc::new(Tensor::new(DType::F32, vec![v.len()], Data::F32(v)).expect("a valid tensor"))
    };
    let seq = |v: Vec<Arc<Tensor>>| RtValue::Sequence(v);
    let some = |v: RtValue| RtValue::Optional(Some(Box::new(v)));
    let a = seq(vec![t(vec![1.0, 2.0]), t(vec![3.0])]);
    assert!(compare_value(&a, &a, 0.0, 0.0).is_ok());
    let shorter = seq(vec![t(vec![1.0, 2.0])]);
    assert!(
        compare_value(&shorter, &a, 0.0, 0.0)
            .is_err_and(|e| e.contains("sequence of 1 tensors, expected 2"))
    );
    let off = seq(vec![t(vec![1.0, 2.0]), t(vec![4.0])]);
    assert!(compare_value(&off, &a, 0.0, 0.0).is_err_and(|e| e.starts_with("sequence element 1:")));
    assert!(compare_value(&seq(vec![]), &seq(vec![]), 0.0, 0.0).is_ok());
    let none = RtValue::Optional(None);
    assert!(compare_value(&none, &none, 0.0, 0.0).is_ok());
    assert!(
        compare_value(&none, &some(a.clone()), 0.0, 0.0)
            .is_err_and(|e| e == "empty optional, expected optional holding a value")
    );
    assert!(compare_value(&some(a.clone()), &some(a.clone()), 0.0, 0.0).is_ok());
    assert!(compare_value(&some(off), &some(a.clone()), 0.0, 0.0).is_err());
    // A plain value never matches an optional holding it.
    assert!(compare_value(&a, &some(a.clone()), 0.0, 0.0).is_err());
}
