//! The pass manager and the pipelines per target and level.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use mmq_ir::{Module, Severity};

use crate::canonicalize::Canonicalize;
use crate::const_fold::ConstFold;
use crate::dce::Dce;
use crate::egraph::{RewritePass, RuleSet};
use crate::pass::{Interrupt, Pass, PassError, PassOptions, PassReport};
use crate::targets::TargetRef;

/// An optimization level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum OptLevel {
    /// No passes: import and export only.
    O0,
    /// Canonicalize, const-fold, DCE.
    O1,
    /// `O1`, then the rule sets (simplification and fusions), then cleanup.
    #[default]
    O2,
}

impl OptLevel {
    /// The level as `-O` takes it (`0`, `1`, `2`).
    pub fn digit(self) -> char {
        match self {
            OptLevel::O0 => '0',
            OptLevel::O1 => '1',
            OptLevel::O2 => '2',
        }
    }
}

impl fmt::Display for OptLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "O{}", self.digit())
    }
}

/// An optimization level that is not `0`, `1` or `2`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimization level '{0}' (expected 0, 1 or 2)")]
pub struct ParseOptLevelError(pub String);

impl FromStr for OptLevel {
    type Err = ParseOptLevelError;

    /// Parses `0`, `1`, `2` (also `O2`, `-O2`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.trim_start_matches('-').trim_start_matches(['O', 'o']);
        match digits {
            "0" => Ok(OptLevel::O0),
            "1" => Ok(OptLevel::O1),
            "2" => Ok(OptLevel::O2),
            _ => Err(ParseOptLevelError(s.to_owned())),
        }
    }
}

/// After which passes the module is printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpAfter {
    /// After every pass.
    All,
    /// After each pass with this name. A bare `rewrite` also matches every `rewrite(...)`.
    Pass(String),
}

impl DumpAfter {
    /// Parses `all` or a pass name.
    pub fn parse(s: &str) -> DumpAfter {
        if s == "all" {
            DumpAfter::All
        } else {
            DumpAfter::Pass(s.to_owned())
        }
    }

    /// Whether a pass named `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            DumpAfter::All => true,
            DumpAfter::Pass(p) => {
                name == p
                    || name
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.starts_with('('))
            }
        }
    }
}

/// What one pass of a pipeline did.
#[derive(Clone, Debug)]
pub struct PassRun {
    /// The pass name.
    pub name: String,
    /// Wall time of the pass itself (not of verification or inference after it).
    pub time: Duration,
    /// The pass's report.
    pub report: PassReport,
    /// The module as `.mmir` text after the pass, when [`PassManager::dump_after`] selects it.
    pub dump: Option<String>,
}

/// What a pipeline did, pass by pass.
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    /// One entry per pass, in order.
    pub passes: Vec<PassRun>,
}

impl PipelineReport {
    /// Whether any pass changed the module.
    pub fn changed(&self) -> bool {
        self.passes.iter().any(|p| p.report.changed)
    }

    /// Total wall time of the passes.
    pub fn total_time(&self) -> Duration {
        self.passes.iter().map(|p| p.time).sum()
    }
}

/// Runs a list of passes in order.
///
/// After each pass, types are inferred again ([`mmq_ir::infer::infer_module`]) so that nodes
/// the pass created are typed; with [`PassManager::verify`] on, the module is also verified
/// ([`mmq_ir::verify::verify_all`]; warnings do not fail) before the first pass and after each
/// one. When a pass changed the module, the module is renumbered at the end
/// ([`mmq_ir::text::canonicalize`]) so that nodes and values the passes dropped do not stay in
/// its arenas.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    /// Verify before the first pass and after each pass. On by default in debug builds.
    pub verify: bool,
    /// Measure pass times (always recorded; this asks callers to show them).
    pub time: bool,
    /// Print the module after the selected passes into [`PassRun::dump`].
    pub dump_after: Option<DumpAfter>,
    /// Stop before the next pass once this is set.
    pub interrupt: Option<Interrupt>,
}

impl fmt::Debug for PassManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassManager")
            .field("passes", &self.names())
            .field("verify", &self.verify)
            .field("time", &self.time)
            .field("dump_after", &self.dump_after)
            .finish()
    }
}

impl Default for PassManager {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

/// The part of a compilation a [`pipeline`] covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A model that stays float: the target's legalization, the level's passes and, at `-O2`,
    /// the target's load forms.
    Float,
    /// A model about to be quantized: the same, except that activation fusion (`fuse-act`:
    /// Conv/Gemm + Relu/... into FusedConv/FusedGemm) and the load forms wait for
    /// [`Phase::AfterQuant`], so the quantization passes still see the plain `Conv` and `Gemm`
    /// nodes they quantize.
    BeforeQuant,
    /// After quantization: at `-O2`, `rewrite(fuse-act)` (the nodes left float fuse now), dce
    /// and the target's load forms.
    AfterQuant,
    /// The target's lowering into the ops it runs (its plugins), at every level; last.
    Lower,
}

/// The passes of `phase` for `target` at `level`. The level's passes:
///
/// - `O0`: none;
/// - `O1`: canonicalize, const-fold, dce;
/// - `O2`: `O1`, then `rewrite(simplify)`, `rewrite(fold-bn,transformer)`,
///   `rewrite(fuse-act,fuse-quant)`, const-fold, canonicalize, dce.
///
/// The target adds its legalization first ([`crate::Target::legalize`], at every level), its
/// decode and load forms at the end of `-O2` ([`crate::Target::decode_forms`],
/// [`crate::Target::load_forms`]) and its lowering
/// ([`Phase::Lower`]); its other choices happen inside the rewrite passes (cost model,
/// available fused ops), which read [`PassOptions::target`].
pub fn pipeline(target: TargetRef, level: OptLevel, phase: Phase) -> PassManager {
    use RuleSet::{FoldBn, FuseAct, FuseQuant, Simplify, Transformer};
    let rewrite = |sets: &[RuleSet]| -> Box<dyn Pass> { Box::new(RewritePass::new(sets)) };
    let o2 = level >= OptLevel::O2;
    let mut passes: Vec<Box<dyn Pass>> = Vec::new();
    match phase {
        Phase::Float | Phase::BeforeQuant => {
            passes.extend(target.legalize());
            if level >= OptLevel::O1 {
                passes.push(Box::new(Canonicalize));
                passes.push(Box::new(ConstFold::new()));
                passes.push(Box::new(Dce));
            }
            if o2 {
                passes.push(rewrite(&[Simplify]));
                passes.push(rewrite(&[FoldBn, Transformer]));
                passes.push(if phase == Phase::Float {
                    rewrite(&[FuseAct, FuseQuant])
                } else {
                    rewrite(&[FuseQuant])
                });
                passes.push(Box::new(ConstFold::new()));
                passes.push(Box::new(Canonicalize));
                passes.push(Box::new(Dce));
                if phase == Phase::Float {
                    passes.extend(target.decode_forms());
                    passes.extend(target.load_forms());
                }
            }
        }
        Phase::AfterQuant => {
            if o2 {
                passes.push(rewrite(&[FuseAct]));
                passes.push(Box::new(Dce));
                passes.extend(target.decode_forms());
                passes.extend(target.load_forms());
            }
        }
        Phase::Lower => passes.extend(target.lowering()),
    }
    PassManager::new(passes)
}

impl PassManager {
    /// A manager running `passes` in order.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Self {
        PassManager {
            passes,
            verify: cfg!(debug_assertions),
            time: false,
            dump_after: None,
            interrupt: None,
        }
    }

    /// Appends a pass.
    pub fn push(&mut self, pass: Box<dyn Pass>) {
        self.passes.push(pass);
    }

    /// The passes, in order (to build a longer pipeline from this one).
    pub fn into_passes(self) -> Vec<Box<dyn Pass>> {
        self.passes
    }

    /// The pass names in order.
    pub fn names(&self) -> Vec<&str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass on `m`. Stops at the first pass that fails, or whose result does not
    /// verify when [`PassManager::verify`] is on.
    pub fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PipelineReport, PassError> {
        let mut out = PipelineReport::default();
        if self.passes.is_empty() {
            return Ok(out);
        }
        if self.verify {
            check(m, "input")?;
        }
        for pass in &self.passes {
            if self.interrupt.as_ref().is_some_and(Interrupt::is_set) {
                return Err(PassError::Interrupted {
                    pass: pass.name().to_owned(),
                });
            }
            let start = Instant::now();
            let report = pass.run(m, opts)?;
            let time = start.elapsed();
            mmq_ir::infer::infer_module(m);
            if self.verify {
                check(m, pass.name())?;
            }
            let dump = self
                .dump_after
                .as_ref()
                .filter(|d| d.matches(pass.name()))
                .map(|_| mmq_ir::text::print(m));
            out.passes.push(PassRun {
                name: pass.name().to_owned(),
                time,
                report,
                dump,
            });
        }
        if out.changed() {
            *m = mmq_ir::text::canonicalize_pruned(m);
        }
        Ok(out)
    }
}

/// Verifies `m`; errors (not warnings) fail with the name of the pass that ran last.
fn check(m: &Module, pass: &str) -> Result<(), PassError> {
    let errors = mmq_ir::verify::verify_all(m);
    if errors.iter().any(|e| e.severity == Severity::Error) {
        return Err(PassError::Invalid {
            pass: pass.to_owned(),
            errors: errors
                .into_iter()
                .filter(|e| e.severity == Severity::Error)
                .collect(),
        });
    }
    Ok(())
}

/// Module builders shared by the pass tests.
#[cfg(test)]
pub(crate) mod test_util {
    use bytes::Bytes;
    use mmq_ir::{
        ConstData, DType, Dim, Entry, GraphId, ModelInfo, Module, Op, Storage, Type, Value,
    };

    /// A module with one entry graph `main` at opset 21.
    pub fn module() -> (Module, GraphId) {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                ir_version: 10,
                opsets: vec![(String::new(), 21)],
                ..Default::default()
            },
        });
        (m, g)
    }

    /// An f32 tensor type.
    pub fn f32_ty(dims: Vec<Dim>) -> Type {
        Type::tensor(DType::F32, dims)
    }

    /// A node with one result named `name` (type left to inference).
    pub fn node(m: &mut Module, g: GraphId, op: Op, inputs: Vec<Value>, name: &str) -> Value {
        let n = m.add_node(
            g,
            op,
            inputs.into_iter().map(Some).collect(),
            vec![Some((Some(name.to_owned()), Type::Unknown))],
            None,
        );
        mmq_ir::infer::infer_module(m);
        m.nodes[n].outputs[0].expect("one result")
    }

    /// [`node`] (the name says the op has one operand or none).
    pub fn unary(m: &mut Module, g: GraphId, op: Op, inputs: Vec<Value>, name: &str) -> Value {
        node(m, g, op, inputs, name)
    }

    /// An i64 constant.
    pub fn i64_const(m: &mut Module, name: &str, vals: &[i64], shape: Vec<i64>) -> Value {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.add_const(ConstData::new(
            Some(name.to_owned()),
            DType::I64,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        ))
    }

    /// An f32 constant.
    pub fn f32_const(m: &mut Module, name: &str, vals: &[f32], shape: Vec<i64>) -> Value {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.add_const(ConstData::new(
            Some(name.to_owned()),
            DType::F32,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        ))
    }

    /// `If(cond)` whose then-branch returns `Relu(then_val)` and else-branch `Neg(else_val)`
    /// (both read outer values inside a node); returns the If's result, named `name`.
    pub fn if_node(
        m: &mut Module,
        g: GraphId,
        cond: Value,
        then_val: Value,
        else_val: Value,
        name: &str,
    ) -> Value {
        let then_g = m.add_graph(&format!("{name}_then"), None);
        let else_g = m.add_graph(&format!("{name}_else"), None);
        let n = m.add_node(
            g,
            Op::If {
                then_branch: Some(then_g),
                else_branch: Some(else_g),
            },
            vec![Some(cond)],
            vec![Some((Some(name.to_owned()), Type::Unknown))],
            None,
        );
        m.graphs[then_g].parent = Some(n);
        m.graphs[else_g].parent = Some(n);
        let t = node(m, then_g, Op::Relu {}, vec![then_val], &format!("{name}_t"));
        m.graphs[then_g].outputs = vec![t];
        let e = node(m, else_g, Op::Neg {}, vec![else_val], &format!("{name}_e"));
        m.graphs[else_g].outputs = vec![e];
        mmq_ir::infer::infer_module(m);
        m.nodes[n].outputs[0].expect("one result")
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use mmq_ir::Dim;

    /// `y = Relu(x + (a * b))` with a dead `Exp(x)` and a foldable `a * b`.
    fn sample() -> Module {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(2)]));
        let a = f32_const(&mut m, "a", &[1.0, 2.0], vec![2]);
        let b = f32_const(&mut m, "b", &[3.0, 4.0], vec![2]);
        let ab = node(&mut m, g, mmq_ir::Op::Mul {}, vec![a, b], "ab");
        let s = node(&mut m, g, mmq_ir::Op::Add {}, vec![x, ab], "s");
        let _dead = node(&mut m, g, mmq_ir::Op::Exp {}, vec![x], "dead");
        let y = node(&mut m, g, mmq_ir::Op::Relu {}, vec![s], "y");
        m.graphs[g].outputs = vec![y];
        m
    }

    #[test]
    fn levels_parse() {
        assert_eq!("0".parse(), Ok(OptLevel::O0));
        assert_eq!("1".parse(), Ok(OptLevel::O1));
        assert_eq!("O2".parse(), Ok(OptLevel::O2));
        assert!("3".parse::<OptLevel>().is_err());
        assert_eq!(OptLevel::default(), OptLevel::O2);
    }

    #[test]
    fn pipelines_are_explicit_lists() {
        assert!(
            pipeline(TargetRef::ORT, OptLevel::O0, Phase::Float)
                .names()
                .is_empty()
        );
        assert_eq!(
            pipeline(TargetRef::ORT, OptLevel::O1, Phase::Float).names(),
            ["canonicalize", "const-fold", "dce"]
        );
        assert_eq!(
            pipeline(TargetRef::GENERIC, OptLevel::O2, Phase::Float).names(),
            [
                "canonicalize",
                "const-fold",
                "dce",
                "rewrite(simplify)",
                "rewrite(fold-bn,transformer)",
                "rewrite(fuse-act,fuse-quant)",
                "const-fold",
                "canonicalize",
                "dce"
            ]
        );
    }

    #[test]
    fn phases_split_the_pipeline_where_quantization_runs() {
        let names = |t: TargetRef, l: OptLevel, p: Phase| -> Vec<String> {
            pipeline(t, l, p)
                .names()
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        let float = names(TargetRef::ORT, OptLevel::O2, Phase::Float);
        assert_eq!(
            float[float.len() - 2..],
            ["decode-skip-norms", "residual-sum"]
        );
        let before = names(TargetRef::ORT, OptLevel::O2, Phase::BeforeQuant);
        assert!(
            before.contains(&"rewrite(fuse-quant)".to_owned()),
            "{before:?}"
        );
        assert!(
            !before
                .iter()
                .any(|n| n.contains("fuse-act") || n.ends_with("-norms") || n == "residual-sum"),
            "{before:?}"
        );
        assert_eq!(
            names(TargetRef::ORT, OptLevel::O2, Phase::AfterQuant),
            [
                "rewrite(fuse-act)",
                "dce",
                "decode-skip-norms",
                "residual-sum"
            ]
        );
        assert!(names(TargetRef::ORT, OptLevel::O1, Phase::AfterQuant).is_empty());
        assert!(names(TargetRef::ORT, OptLevel::O2, Phase::Lower).is_empty());
        // TensorRT legalizes and lowers at every level.
        assert_eq!(
            names(TargetRef::TRT, OptLevel::O0, Phase::Float),
            ["decompose"]
        );
        assert_eq!(
            names(TargetRef::TRT, OptLevel::O0, Phase::Lower),
            ["trt-plugins"]
        );
    }

    #[test]
    fn o0_leaves_the_module_unchanged() {
        let mut m = sample();
        let before = m.clone();
        let text = mmq_ir::text::print(&m);
        let report = pipeline(TargetRef::ORT, OptLevel::O0, Phase::Float)
            .run(&mut m, &PassOptions::default())
            .expect("runs");
        assert!(report.passes.is_empty());
        assert!(m == before);
        assert_eq!(mmq_ir::text::print(&m), text);
    }

    #[test]
    fn o1_dumps_and_times_each_pass() {
        let mut m = sample();
        let mut pm = pipeline(TargetRef::ORT, OptLevel::O1, Phase::Float);
        pm.verify = true;
        pm.time = true;
        pm.dump_after = Some(DumpAfter::Pass("const-fold".into()));
        let report = pm.run(&mut m, &PassOptions::default()).expect("runs");
        let names: Vec<&str> = report.passes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["canonicalize", "const-fold", "dce"]);
        let fold = &report.passes[1];
        assert_eq!(fold.report.counters.get("folded-nodes"), Some(&1));
        let dump = fold.dump.as_deref().expect("dump after const-fold");
        assert!(dump.contains("Exp("), "dce has not run yet:\n{dump}");
        assert!(!dump.contains("Mul("), "a * b is folded:\n{dump}");
        assert!(report.passes[0].dump.is_none() && report.passes[2].dump.is_none());
        assert_eq!(
            report.passes[2].report.counters.get("removed-nodes"),
            Some(&1)
        );
        assert!(report.total_time() >= fold.time);
        let text = mmq_ir::text::print(&m);
        assert!(!text.contains("Exp(") && text.contains("Relu("), "{text}");
        // The result is canonical: printing and parsing gives the same module.
        let (parsed, _) = mmq_ir::text::parse(&text).expect("parses");
        assert!(parsed == m);
    }

    #[test]
    fn dump_after_matches_rewrite_passes_by_prefix() {
        let d = DumpAfter::parse("rewrite");
        assert!(d.matches("rewrite(simplify)"));
        assert!(!d.matches("rewriter"));
        assert!(DumpAfter::parse("all").matches("dce"));
    }

    #[test]
    fn o2_runs_clean() {
        let mut m = sample();
        let mut pm = pipeline(TargetRef::ORT, OptLevel::O2, Phase::Float);
        pm.verify = true;
        let report = pm.run(&mut m, &PassOptions::default()).expect("runs");
        assert_eq!(
            report.passes.len(),
            11,
            "the nine passes of -O2 and the target's decode and load forms"
        );
        assert!(mmq_ir::verify::verify(&m).is_ok());
    }
}
