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
    Refine::new(eg, eg.find(root), cost, &sel).run(&mut sel);
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

/// Improves a selection by exact DAG cost (the sum of the own costs of the classes reachable
/// from the root). A move switches one reachable class to another of its nodes, together with
/// every class that can then read its value from a tuple the DAG computes anyway (`get.N` of a
/// selected node: the sum output of a fused skip norm, say); it is kept when the DAG's cost
/// drops. The per-child cost split of the first pass cannot see that a value many nodes share
/// costs the same whichever of them is fused; this pass can.
///
/// Reference counts make a move cost what it changes, not the size of the graph: switching a
/// node releases the classes only it kept alive and brings in those the new node needs.
/// Cycles are ruled out with the post-order positions of the current DAG (a class can only be
/// reached from classes after it), falling back to a search through the classes a move adds.
struct Refine {
    /// Own cost of each node, by class index.
    own: Vec<Vec<f64>>,
    /// Child class indices of each node, by class index.
    kids: Vec<Vec<Vec<usize>>>,
    /// For classes holding `get.N` nodes: (node index, tuple class index).
    gets: Vec<(usize, usize, usize)>,
    sel: Vec<usize>,
    refc: Vec<u32>,
    pos: Vec<usize>,
    total: f64,
    root: usize,
    ids: Vec<Id>,
    trail: Vec<Change>,
}

#[derive(Clone, Copy)]
enum Change {
    Add(usize),
    Remove(usize),
    Select(usize, usize),
}

const NONE: usize = usize::MAX;

impl Refine {
    fn new(eg: &EG, root: Id, cost: &dyn CostModel, sel: &HashMap<Id, usize>) -> Refine {
        let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        ids.sort();
        let ix: HashMap<Id, usize> = ids.iter().enumerate().map(|(i, &c)| (c, i)).collect();
        let mut own = Vec::with_capacity(ids.len());
        let mut kids = Vec::with_capacity(ids.len());
        let mut gets = Vec::new();
        for (ci, &c) in ids.iter().enumerate() {
            own.push(eg[c].nodes.iter().map(|n| cost.cost(eg, c, n)).collect());
            kids.push(
                eg[c]
                    .nodes
                    .iter()
                    .map(|n| n.children().iter().map(|&k| ix[&eg.find(k)]).collect())
                    .collect(),
            );
            for (ni, n) in eg[c].nodes.iter().enumerate() {
                if let TNode::Get(_, [t]) = n {
                    gets.push((ci, ni, ix[&eg.find(*t)]));
                }
            }
        }
        let n = ids.len();
        let mut r = Refine {
            own,
            kids,
            gets,
            sel: ids
                .iter()
                .map(|c| sel.get(c).copied().unwrap_or(NONE))
                .collect(),
            refc: vec![0; n],
            pos: vec![NONE; n],
            total: 0.0,
            root: ix[&root],
            ids,
            trail: Vec::new(),
        };
        r.add(r.root);
        r.trail.clear();
        r.number();
        r
    }

    fn run(mut self, sel: &mut HashMap<Id, usize>) {
        if self.total.is_finite() {
            for _sweep in 0..4 {
                let moved = self.sweep();
                if !self.release_tuples() && !moved {
                    break;
                }
            }
        }
        if self.has_cycle() {
            // The position-based pruning of `reaches` assumes the numbered DAG; should a
            // combination of moves have closed a cycle anyway, keep the first pass's choice.
            return;
        }
        sel.clear();
        for (i, &c) in self.ids.iter().enumerate() {
            if self.sel[i] != NONE {
                sel.insert(c, self.sel[i]);
            }
        }
    }

    /// One pass over the live classes with alternatives; whether anything improved.
    fn sweep(&mut self) -> bool {
        let mut improved = false;
        let candidates: Vec<usize> = (0..self.ids.len())
            .filter(|&c| self.refc[c] > 0 && self.kids[c].len() > 1)
            .collect();
        for c in candidates {
            for j in 0..self.kids[c].len() {
                if self.refc[c] == 0 || j == self.sel[c] || !self.own[c][j].is_finite() {
                    continue;
                }
                let before = self.total;
                self.trail.clear();
                let mut through = false;
                if !self.switch(c, j) {
                    self.undo();
                    if !self.switch_through(c, j) {
                        continue;
                    }
                    through = true;
                }
                self.reuse_tuples();
                if self.total < before - 1e-9 {
                    improved = true;
                    self.number();
                } else {
                    self.undo();
                    if through {
                        self.number();
                    }
                }
            }
        }
        improved
    }

    /// Selects node `j` for live class `c` where that closed a cycle through one of the node's
    /// operands: a live operand class whose current node reads `c` is first switched to one of
    /// its other nodes that does not (a fused op unioned with a reshape of the value it
    /// replaces: the reshape reads the old value, the old value is to become a reshape of the
    /// fused op). False, with nothing changed, when no such pair of switches exists; otherwise
    /// the changes are on the trail for the caller to keep or undo.
    fn switch_through(&mut self, c: usize, j: usize) -> bool {
        let kids = self.kids[c][j].clone();
        for k in kids {
            if k == c || self.refc[k] == 0 || self.sel[k] == NONE {
                continue;
            }
            if !self.reaches(&self.kids[k][self.sel[k]].clone(), c) {
                continue;
            }
            for i in 0..self.kids[k].len() {
                if i == self.sel[k] || !self.own[k][i].is_finite() {
                    continue;
                }
                self.trail.clear();
                if self.reaches(&self.kids[k][i].clone(), c) || !self.switch(k, i) {
                    self.undo();
                    continue;
                }
                // `c` may have lived only through `k`'s old node.
                self.number();
                if self.refc[c] > 0 && self.switch(c, j) {
                    return true;
                }
                self.undo();
                self.number();
            }
        }
        false
    }

    /// Selects node `j` for live class `c`; false (nothing changed) when that closes a cycle or
    /// reaches a class without a selection.
    fn switch(&mut self, c: usize, j: usize) -> bool {
        if self.reaches(&self.kids[c][j].clone(), c) {
            return false;
        }
        let old = self.sel[c];
        for k in self.kids[c][j].clone() {
            if !self.add(k) {
                return false;
            }
        }
        self.trail.push(Change::Select(c, old));
        self.total += self.own[c][j] - self.own[c][old];
        self.sel[c] = j;
        for k in self.kids[c][old].clone() {
            self.remove(k);
        }
        true
    }

    /// The converse of [`Refine::reuse_tuples`]: for each live multi-result node, switches
    /// every live class that reads one of its results (`get.N`) to another of its nodes at
    /// once, cheapest own cost first, and keeps the move when the DAG's cost drops. One class
    /// at a time cannot get there: the node stays live as long as any reader is left (a fused
    /// skip norm whose sum output also feeds the next block).
    fn release_tuples(&mut self) -> bool {
        let mut tuples: Vec<usize> = self
            .gets
            .iter()
            .map(|&(_, _, t)| t)
            .filter(|&t| self.refc[t] > 0)
            .collect();
        tuples.sort_unstable();
        tuples.dedup();
        let mut improved = false;
        for t in tuples {
            let readers: Vec<usize> = self
                .gets
                .iter()
                .filter(|&&(c, j, tt)| tt == t && self.refc[c] > 0 && self.sel[c] == j)
                .map(|&(c, _, _)| c)
                .collect();
            if readers.is_empty() {
                continue;
            }
            let before = self.total;
            self.trail.clear();
            let mut all = true;
            // Whether a switch renumbered the DAG (then undoing it must renumber again).
            let mut moved = false;
            for c in readers {
                if self.refc[c] == 0 {
                    continue;
                }
                let mut alts: Vec<usize> = (0..self.kids[c].len())
                    .filter(|&i| i != self.sel[c] && self.own[c][i].is_finite())
                    .collect();
                alts.sort_by(|&a, &b| self.own[c][a].total_cmp(&self.own[c][b]));
                let mut switched = false;
                for i in alts {
                    let mark = self.trail.len();
                    if self.switch(c, i) {
                        switched = true;
                        moved = true;
                        self.number();
                        break;
                    }
                    self.undo_to(mark);
                }
                if !switched {
                    all = false;
                    break;
                }
            }
            if all && self.total < before - 1e-9 {
                improved = true;
            } else {
                self.undo();
                if moved {
                    self.number();
                }
            }
        }
        improved
    }

    fn reuse_tuples(&mut self) {
        for g in 0..self.gets.len() {
            let (c, j, t) = self.gets[g];
            if self.refc[c] > 0 && self.refc[t] > 0 && self.sel[c] != j {
                let mark = self.trail.len();
                let before = self.total;
                if !self.switch(c, j) || self.total > before + 1e-9 {
                    self.undo_to(mark);
                }
            }
        }
    }

    /// Whether `target` is reachable from `from` through selected nodes.
    fn reaches(&self, from: &[usize], target: usize) -> bool {
        let limit = self.pos[target];
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<usize> = from.to_vec();
        while let Some(k) = stack.pop() {
            if k == target {
                return true;
            }
            // A numbered class before `target` in post-order cannot reach it.
            if limit != NONE && self.pos[k] != NONE && self.pos[k] < limit {
                continue;
            }
            if !seen.insert(k) || self.sel[k] == NONE {
                continue;
            }
            stack.extend(self.kids[k][self.sel[k]].iter().copied());
        }
        false
    }

    /// Adds a use of class `c`, bringing in its selected subtree when it was dead.
    fn add(&mut self, c: usize) -> bool {
        let mut stack = vec![c];
        while let Some(k) = stack.pop() {
            self.refc[k] += 1;
            self.trail.push(Change::Add(k));
            if self.refc[k] == 1 {
                let s = self.sel[k];
                if s == NONE {
                    return false;
                }
                self.total += self.own[k][s];
                stack.extend(self.kids[k][s].iter().copied());
            }
        }
        true
    }

    /// Drops a use of class `c`, releasing its subtree when it was the last.
    fn remove(&mut self, c: usize) {
        let mut stack = vec![c];
        while let Some(k) = stack.pop() {
            self.refc[k] -= 1;
            self.trail.push(Change::Remove(k));
            if self.refc[k] == 0 {
                let s = self.sel[k];
                self.total -= self.own[k][s];
                stack.extend(self.kids[k][s].iter().copied());
            }
        }
    }

    fn undo(&mut self) {
        self.undo_to(0);
    }

    fn undo_to(&mut self, mark: usize) {
        while self.trail.len() > mark {
            match self.trail.pop() {
                Some(Change::Add(k)) => {
                    if self.refc[k] == 1 && self.sel[k] != NONE {
                        self.total -= self.own[k][self.sel[k]];
                    }
                    self.refc[k] -= 1;
                }
                Some(Change::Remove(k)) => {
                    if self.refc[k] == 0 {
                        self.total += self.own[k][self.sel[k]];
                    }
                    self.refc[k] += 1;
                }
                Some(Change::Select(c, old)) => {
                    self.total += self.own[c][old] - self.own[c][self.sel[c]];
                    self.sel[c] = old;
                }
                None => {}
            }
        }
    }

    /// Whether the selection reachable from the root has a cycle.
    fn has_cycle(&self) -> bool {
        // 0 = unseen, 1 = on the path, 2 = done.
        let mut state = vec![0u8; self.ids.len()];
        let mut stack = vec![(self.root, false)];
        while let Some((c, done)) = stack.pop() {
            if done {
                state[c] = 2;
                continue;
            }
            match state[c] {
                1 => return true,
                2 => continue,
                _ => {}
            }
            state[c] = 1;
            stack.push((c, true));
            if self.sel[c] != NONE {
                for &k in &self.kids[c][self.sel[c]] {
                    match state[k] {
                        1 => return true,
                        0 => stack.push((k, false)),
                        _ => {}
                    }
                }
            }
        }
        false
    }

    /// Post-order positions of the live DAG.
    fn number(&mut self) {
        self.pos.iter_mut().for_each(|p| *p = NONE);
        let mut next = 0;
        let mut stack = vec![(self.root, false)];
        let mut seen = vec![false; self.ids.len()];
        while let Some((c, done)) = stack.pop() {
            if done {
                self.pos[c] = next;
                next += 1;
                continue;
            }
            if seen[c] {
                continue;
            }
            seen[c] = true;
            stack.push((c, true));
            if self.sel[c] != NONE {
                for &k in &self.kids[c][self.sel[c]] {
                    if !seen[k] {
                        stack.push((k, false));
                    }
                }
            }
        }
    }
}
