//! Engine tests on small `.mmir` graphs.

use mmq_ir::{Module, text};

use crate::RewritePass;
use crate::pass::{Pass, PassOptions};
use crate::targets::TargetRef;

pub(crate) fn parse(src: &str) -> Module {
    let (mut m, _) = text::parse(src).unwrap_or_else(|e| panic!("{e:?}"));
    let errs = mmq_ir::infer::infer_module(&mut m);
    assert!(
        errs.iter().all(|e| e.severity != mmq_ir::Severity::Error),
        "{errs:?}"
    );
    m
}

pub(crate) fn rewrite(
    src: &str,
    sets: &[&str],
    target: TargetRef,
) -> (String, Vec<(String, usize)>) {
    let mut m = parse(src);
    let opts = PassOptions {
        target,
        explain: false,
    };
    let sets: Vec<super::RuleSet> = sets.iter().map(|s| s.parse().expect("rule set")).collect();
    let rep = RewritePass::new(&sets).run(&mut m, &opts).unwrap();
    let errs = mmq_ir::verify::verify_all(&m);
    assert!(
        errs.is_empty(),
        "invalid after rewrite: {errs:?}\n{}",
        text::print(&m)
    );
    let m = text::canonicalize(&m);
    (text::print(&m), rep.counters.into_iter().collect())
}

#[test]
fn identity_and_transpose_pairs_collapse() {
    let src = "graph @g(%x: f32[2, 3]) -> (f32[3, 2]) {
  %a = Identity(%x) : f32[2, 3]
  %b = Transpose(%a) {perm = [1, 0]} : f32[3, 2]
  %c = Transpose(%b) {perm = [1, 0]} : f32[2, 3]
  %d = Transpose(%c) {perm = [1, 0]} : f32[3, 2]
  return %d
}
";
    let (out, fired) = rewrite(src, &["simplify"], TargetRef::GENERIC);
    assert!(out.matches("Transpose").count() == 1, "{out}");
    assert!(!out.contains("Identity"), "{out}");
    assert!(fired.iter().any(|(r, _)| r == "identity-elim"), "{fired:?}");
}

/// A node whose subgraph reads a value of the graph stays after that value's definition (the
/// e-graph sees no operand edge for a capture).
#[test]
fn captured_values_are_defined_before_their_reader() {
    let src = "graph @g(%x: f32[2, 3], %c: bool[]) -> (f32[2, 3], f32[2, 3]) {
  %a = Relu(%x) : f32[2, 3]
  %y = If(%c) {
    then_branch = graph @t() -> (f32[2, 3]) {
      %p = Neg(%a) : f32[2, 3]
      return %p
    },
    else_branch = graph @e() -> (f32[2, 3]) {
      %q = Identity(%a) : f32[2, 3]
      return %q
    }
  } : f32[2, 3]
  %b = Identity(%a) : f32[2, 3]
  return %y, %b
}
";
    let (out, fired) = rewrite(src, &["simplify"], TargetRef::GENERIC);
    assert!(fired.iter().any(|(r, _)| r == "identity-elim"), "{fired:?}");
    let relu = out.find("Relu(").expect("Relu kept");
    let iff = out.find("If(").expect("If kept");
    assert!(relu < iff, "If before the value its branches read:\n{out}");
}
