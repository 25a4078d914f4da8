//! Extraction: the cheapest acyclic choice of one e-node per reachable e-class.
//!
//! egg's `Extractor` sums the cost of every child as if it were a tree, so a value shared by
//! many users is counted once per path; along a residual stream that doubles per layer and
//! swamps the differences rules make. Here a class's cost is its node's own cost plus each
//! child's cost divided by the number of e-nodes that use that child, which keeps costs near
//! the DAG's total (a shared value's cost is split among its users). Candidates are accepted
//! only when they do not close a cycle.

use std::collections::{HashMap, HashSet};

use egg::{Id, Language};

use super::convert::EG;
use super::cost::CostModel;
use super::lang::TNode;

/// The chosen e-node per class reachable from `root`.
pub(crate) fn extract(eg: &EG, root: Id, cost: &dyn CostModel) -> HashMap<Id, TNode> {
    let classes: Vec<Id> = {
        let mut v: Vec<Id> = eg.classes().map(|c| c.id).collect();
        v.sort();
        v
    };
    // Number of e-node uses of each class.
    let mut uses: HashMap<Id, f64> = HashMap::new();
    for c in eg.classes() {
        for n in &c.nodes {
            for &ch in n.children() {
                *uses.entry(eg.find(ch)).or_default() += 1.0;
            }
        }
    }
    let mut best: HashMap<Id, (f64, usize)> = HashMap::new();
    let share = |best: &HashMap<Id, (f64, usize)>, ch: Id| -> Option<f64> {
        let ch = eg.find(ch);
        best.get(&ch)
            .map(|&(c, _)| c / uses.get(&ch).copied().unwrap_or(1.0).max(1.0))
    };
    for _pass in 0..64 {
        let mut changed = false;
        for &cid in &classes {
            let class = &eg[cid];
            for (i, n) in class.nodes.iter().enumerate() {
                let mut total = cost.cost(eg, cid, n);
                let mut ok = true;
                for &ch in n.children() {
                    if eg.find(ch) == cid {
                        ok = false;
                        break;
                    }
                    match share(&best, ch) {
                        Some(c) => total += c,
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok || !total.is_finite() {
                    continue;
                }
                match best.get(&cid) {
                    None => {
                        best.insert(cid, (total, i));
                        changed = true;
                    }
                    Some(&(cur, j)) if j == i && (total - cur).abs() > 1e-9 => {
                        best.insert(cid, (total, i));
                        changed = true;
                    }
                    Some(&(cur, j))
                        if j != i && total < cur - 1e-9 && !reaches(eg, &best, n, cid) =>
                    {
                        best.insert(cid, (total, i));
                        changed = true;
                    }
                    _ => {}
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut sel: HashMap<Id, usize> = best.iter().map(|(&c, &(_, i))| (c, i)).collect();
    refine(eg, eg.find(root), cost, &mut sel);
    let mut out = HashMap::new();
    let mut stack = vec![eg.find(root)];
    while let Some(c) = stack.pop() {
        if out.contains_key(&c) {
            continue;
        }
        if let Some(&i) = sel.get(&c) {
            let n = eg[c].nodes[i].clone();
            for &ch in n.children() {
                stack.push(eg.find(ch));
            }
            out.insert(c, n);
        }
    }
    out
}

/// Whether `target` is reachable from `node`'s children through the current choices.
fn reaches(eg: &EG, best: &HashMap<Id, (f64, usize)>, node: &TNode, target: Id) -> bool {
    let mut seen = HashSet::new();
    let mut stack: Vec<Id> = node.children().iter().map(|&c| eg.find(c)).collect();
    while let Some(c) = stack.pop() {
        if c == target {
            return true;
        }
        if !seen.insert(c) {
            continue;
        }
        if let Some(&(_, i)) = best.get(&c) {
            stack.extend(eg[c].nodes[i].children().iter().map(|&x| eg.find(x)));
        }
    }
    false
}

/// The classes reachable from `root` under `sel` and the sum of their nodes' own costs;
/// `None` when the selection has a cycle or misses a class.
fn dag_cost(
    eg: &EG,
    root: Id,
    sel: &HashMap<Id, usize>,
    own: &HashMap<Id, Vec<f64>>,
) -> Option<(f64, Vec<Id>)> {
    // 0 = unseen, 1 = on the stack, 2 = done.
    let mut state: HashMap<Id, u8> = HashMap::new();
    let mut order = Vec::new();
    let mut total = 0.0;
    let mut stack: Vec<(Id, bool)> = vec![(root, false)];
    while let Some((c, done)) = stack.pop() {
        if done {
            state.insert(c, 2);
            order.push(c);
            continue;
        }
        match state.get(&c) {
            Some(2) => continue,
            Some(1) => return None,
            _ => {}
        }
        state.insert(c, 1);
        let i = *sel.get(&c)?;
        total += own.get(&c)?[i];
        stack.push((c, true));
        for &ch in eg[c].nodes[i].children() {
            let ch = eg.find(ch);
            match state.get(&ch) {
                Some(2) => {}
                Some(1) => return None,
                _ => stack.push((ch, false)),
            }
        }
    }
    Some((total, order))
}

/// Improves a selection by exact DAG cost: for each reachable class with alternatives, try each
/// other node, together with switching every class that can read the same value from a tuple
/// the selection already computes (`get.N` of a selected node: the sum output of a fused skip
/// norm, say), and keep the change when the sum of own costs of the reachable DAG drops. The
/// per-child cost split of the first pass cannot see that a value many nodes share costs the
/// same whichever of them is fused; this pass can.
fn refine(eg: &EG, root: Id, cost: &dyn CostModel, sel: &mut HashMap<Id, usize>) {
    let mut own: HashMap<Id, Vec<f64>> = HashMap::new();
    for c in eg.classes() {
        own.insert(
            c.id,
            c.nodes.iter().map(|n| cost.cost(eg, c.id, n)).collect(),
        );
    }
    let Some((mut current, mut reach)) = dag_cost(eg, root, sel, &own) else {
        return;
    };
    for _sweep in 0..4 {
        let mut improved = false;
        let mut candidates: Vec<Id> = reach
            .iter()
            .copied()
            .filter(|&c| eg[c].nodes.len() > 1)
            .collect();
        candidates.sort();
        for c in candidates {
            for i in 0..eg[c].nodes.len() {
                if sel.get(&c) == Some(&i) || !own[&c][i].is_finite() {
                    continue;
                }
                let mut trial = sel.clone();
                trial.insert(c, i);
                let Some((_, r)) = dag_cost(eg, root, &trial, &own) else {
                    continue;
                };
                reuse_tuples(eg, &r, &mut trial);
                let result = dag_cost(eg, root, &trial, &own).or_else(|| {
                    // Reuse closed a cycle: judge the move alone.
                    trial = sel.clone();
                    trial.insert(c, i);
                    dag_cost(eg, root, &trial, &own)
                });
                if let Some((t, r)) = result
                    && t < current - 1e-9
                {
                    *sel = trial;
                    current = t;
                    reach = r;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
}

/// Switches every class in `reach` that holds `get.N` of a node selected in `reach` to that
/// `get.N` (reading a result the DAG computes anyway).
fn reuse_tuples(eg: &EG, reach: &[Id], sel: &mut HashMap<Id, usize>) {
    let live: std::collections::HashSet<Id> = reach.iter().copied().collect();
    for &c in reach {
        for (i, n) in eg[c].nodes.iter().enumerate() {
            if let TNode::Get(_, [t]) = n
                && live.contains(&eg.find(*t))
                && sel.get(&c) != Some(&i)
            {
                sel.insert(c, i);
                break;
            }
        }
    }
}
