//! The rulebook's tests. Every `.mmir` file under `tests/rules/<set>/` is a rule fixture whose
//! header says what to run and what to expect:
//!
//! ```text
//! // rules: fold-bn,fuse-act      rule sets run together (then const-fold and DCE)
//! // target: ort                  cost model and ops (default: generic)
//! // expect: fold-bn-into-conv    rules that must fire (`none` for a negative fixture)
//! // bound: 1e-5                  numeric bound, relative to 1 + |reference|
//! ```
//!
//! For each fixture the printed result plus the table of rule firings is an insta snapshot
//! (`tests/tests/snapshots/rules__<set>__<file>.snap`); the interpreter runs the graph before
//! and after on seeded random inputs and the outputs must agree within the bound; the same
//! input must give byte-identical output on a second run. Companion tests check that rule
//! names are unique kebab-case, that every rule fires in some fixture, and that no snapshot is
//! left without its fixture.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use mmq_ir::{DType, Dim, Module, Type, text};
use mmq_kernels::{Interpreter, RtValue, Tensor};
use mmq_passes::{ConstFold, Dce, Pass, PassOptions, RewritePass, RuleSet, TargetRef};
use mmq_tests::repo_root;

struct Fixture {
    path: PathBuf,
    /// `<set>__<file stem>`.
    name: String,
    src: String,
    sets: Vec<RuleSet>,
    target: TargetRef,
    expect: Vec<String>,
    bound: f64,
}

fn fixtures() -> Vec<Fixture> {
    let root = repo_root().join("tests/rules");
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "mmir") {
                files.push(p);
            }
        }
    }
    files.sort();
    files.into_iter().map(|p| parse_fixture(&root, p)).collect()
}

fn parse_fixture(root: &Path, path: PathBuf) -> Fixture {
    let src = std::fs::read_to_string(&path).expect("readable fixture");
    let rel = path.strip_prefix(root).expect("under root");
    let name = rel
        .with_extension("")
        .to_string_lossy()
        .replace(['/', '\\'], "__");
    let mut f = Fixture {
        path: path.clone(),
        name,
        src: src.clone(),
        sets: Vec::new(),
        target: TargetRef::GENERIC,
        expect: Vec::new(),
        bound: 1e-5,
    };
    for line in src.lines() {
        let Some(h) = line.strip_prefix("//") else {
            continue;
        };
        let Some((k, v)) = h.split_once(':') else {
            continue;
        };
        let list = || -> Vec<String> {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        match k.trim() {
            "rules" => {
                f.sets = list()
                    .iter()
                    .map(|s| {
                        s.parse()
                            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                    })
                    .collect()
            }
            "target" => {
                f.target = match v.trim() {
                    "ort" => TargetRef::ORT,
                    "generic" => TargetRef::GENERIC,
                    t => panic!("{}: unknown target {t}", path.display()),
                }
            }
            "expect" => f.expect = list(),
            "bound" => f.bound = v.trim().parse().expect("numeric bound"),
            _ => {}
        }
    }
    assert!(
        !f.sets.is_empty(),
        "{}: needs a `// rules:` header",
        path.display()
    );
    assert!(
        !f.expect.is_empty(),
        "{}: needs an `// expect:` header",
        path.display()
    );
    f
}

fn load(f: &Fixture) -> Module {
    let (mut m, _) =
        text::parse(&f.src).unwrap_or_else(|e| panic!("{}: parse error: {e:?}", f.path.display()));
    mmq_ir::infer::infer_module(&mut m);
    let errs = mmq_ir::verify::verify_all(&m);
    assert!(
        errs.is_empty(),
        "{}: invalid fixture: {errs:?}",
        f.path.display()
    );
    m
}

/// Runs the fixture's rule sets, then const-fold and DCE; returns the module and the firings.
fn rewrite(f: &Fixture) -> (Module, BTreeMap<String, usize>) {
    let mut m = load(f);
    let opts = PassOptions {
        target: f.target,
        explain: false,
    };
    let rw = RewritePass::new(&f.sets);
    let report = rw.run(&mut m, &opts).expect("rewrite");
    for pass in [&ConstFold::new() as &dyn Pass, &Dce] {
        pass.run(&mut m, &opts)
            .unwrap_or_else(|e| panic!("{}: {e}", f.path.display()));
        mmq_ir::infer::infer_module(&mut m);
    }
    let errs = mmq_ir::verify::verify_all(&m);
    assert!(
        errs.is_empty(),
        "{}: rewrite produced invalid IR: {errs:?}\n{}",
        f.path.display(),
        text::print(&m)
    );
    (text::canonicalize_pruned(&m), report.counters)
}

fn table(fired: &BTreeMap<String, usize>) -> String {
    if fired.is_empty() {
        return "(none)\n".into();
    }
    let w = fired.keys().map(String::len).max().unwrap_or(0);
    fired
        .iter()
        .map(|(k, n)| format!("{k:w$}  {n}\n"))
        .collect()
}

/// A small deterministic generator (64-bit LCG), so inputs do not depend on a crate's version.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
}

/// Random inputs for graph 0: floats in [-2, 2), integers in [0, 3), bools; every symbolic dim
/// bound to 3 (or the symbol's minimum when larger).
fn random_inputs(m: &Module, seed: u64) -> HashMap<String, RtValue> {
    let g = m.entries[0].graph;
    let mut rng = Lcg(seed);
    let mut out = HashMap::new();
    for &v in &m.graphs[g].inputs {
        let name = m.values[v].name.clone().unwrap_or_default();
        let Type::Tensor(tt) = m.value_type(v) else {
            panic!("input {name} has no tensor type");
        };
        let bind = |sym: mmq_ir::Sym| Some(m.symbols[sym].min.unwrap_or(1).max(3));
        let dtype = tt
            .dtype
            .unwrap_or_else(|| panic!("input {name} has no dtype"));
        let shape: Vec<usize> = tt
            .shape
            .as_deref()
            .unwrap_or_else(|| panic!("input {name} has no shape"))
            .iter()
            .map(|d| match d {
                Dim::Expr(e) => e.eval(&bind).unwrap_or(3).max(0) as usize,
                Dim::Unknown => 3,
            })
            .collect();
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n)
            .map(|_| {
                let r = rng.next();
                match dtype {
                    DType::Bool => (r < 0.5) as i32 as f64,
                    d if d.is_float() => r * 4.0 - 2.0,
                    _ => (r * 3.0).floor(),
                }
            })
            .collect();
        let t = Tensor::from_f64_as(dtype, shape, &vals).expect("input tensor");
        out.insert(name, RtValue::Tensor(t.into()));
    }
    out
}

fn run(m: &Module, inputs: &HashMap<String, RtValue>) -> Vec<(String, Vec<f64>)> {
    let g = m.entries[0].graph;
    Interpreter::new(m)
        .run(g, inputs)
        .unwrap_or_else(|e| panic!("interpreter: {e}\n{}", text::print(m)))
        .into_iter()
        .map(|(n, v)| {
            let t = v.as_tensor().expect("tensor output").clone();
            (n, t.to_f64().expect("numeric output"))
        })
        .collect()
}

fn check_numerics(f: &Fixture, before: &Module, after: &Module) {
    for seed in [1u64, 2] {
        let inputs = random_inputs(before, seed);
        let a = run(before, &inputs);
        let b = run(after, &inputs);
        assert_eq!(a.len(), b.len(), "{}: output count", f.name);
        for ((na, va), (nb, vb)) in a.iter().zip(&b) {
            assert_eq!(na, nb, "{}: output names", f.name);
            assert_eq!(va.len(), vb.len(), "{}: output {na} size", f.name);
            for (i, (x, y)) in va.iter().zip(vb).enumerate() {
                let err = (x - y).abs() / (1.0 + x.abs());
                assert!(
                    err <= f.bound || (x.is_nan() && y.is_nan()),
                    "{}: output {na}[{i}]: {x} before, {y} after (bound {})",
                    f.name,
                    f.bound
                );
            }
        }
    }
}

#[test]
fn rule_fixtures() {
    let mut fired_anywhere: BTreeSet<String> = BTreeSet::new();
    let mut failures = Vec::new();
    for f in fixtures() {
        let result = std::panic::catch_unwind(|| {
            let (out, fired) = rewrite(&f);
            let text_out = text::print(&out);
            let (again, _) = rewrite(&f);
            assert_eq!(
                text_out,
                text::print(&again),
                "{}: not deterministic",
                f.name
            );
            if f.expect == ["none"] {
                assert!(
                    fired.is_empty(),
                    "{}: negative fixture fired {fired:?}",
                    f.name
                );
            } else {
                for r in &f.expect {
                    assert!(
                        fired.contains_key(r),
                        "{}: expected {r} to fire; fired {fired:?}",
                        f.name
                    );
                }
            }
            check_numerics(&f, &load(&f), &out);
            let mut settings = insta::Settings::clone_current();
            settings.set_snapshot_path("snapshots");
            settings.set_prepend_module_to_snapshot(false);
            settings.bind(|| {
                insta::assert_snapshot!(
                    format!("rules__{}", f.name),
                    format!("{text_out}// ---- rules applied ----\n{}", table(&fired))
                );
            });
            fired.into_keys().collect::<Vec<_>>()
        });
        match result {
            Ok(names) => fired_anywhere.extend(names),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{}: {msg}", f.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} fixture(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let mut never = Vec::new();
    for set in RuleSet::ALL {
        for r in set.rule_names() {
            if !fired_anywhere.contains(&r) {
                never.push(format!("{set}/{r}"));
            }
        }
    }
    assert!(never.is_empty(), "rules that fire in no fixture: {never:?}");
}

#[test]
fn rule_names_are_unique_kebab_case() {
    let mut seen = BTreeSet::new();
    for set in RuleSet::ALL {
        for r in set.rule_names() {
            assert!(
                !r.is_empty()
                    && r.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !r.starts_with('-')
                    && !r.ends_with('-'),
                "rule name {r} is not kebab-case"
            );
            assert!(seen.insert(r.clone()), "rule name {r} is used twice");
        }
    }
}

#[test]
fn no_orphaned_rule_snapshots() {
    let names: BTreeSet<String> = fixtures()
        .into_iter()
        .map(|f| format!("rules__{}.snap", f.name))
        .collect();
    let dir = repo_root().join("tests/tests/snapshots");
    let mut orphans = Vec::new();
    for e in std::fs::read_dir(&dir).expect("snapshot dir") {
        let n = e.expect("entry").file_name().to_string_lossy().into_owned();
        if n.starts_with("rules__") && n.ends_with(".snap") && !names.contains(&n) {
            orphans.push(n);
        }
    }
    assert!(
        orphans.is_empty(),
        "snapshots without a fixture (delete them): {orphans:?}"
    );
}
