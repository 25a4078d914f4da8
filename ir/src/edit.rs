//! Graph edits, in the spirit of cranelift's cursors. A graph's node list (kept in topological
//! order) is private to `ir`: a [`Cursor`] stands at one place of it and inserts nodes there in
//! order, and the whole-list edits below ([`Module::remove_node`], [`Module::retain_nodes`],
//! [`Module::set_node_order`], [`Module::list_nodes`]) are the only other ways to change it.
//! Operands change through [`Module::set_operand`] and [`Module::replace_uses`].
//!
//! ```
//! use mmq_ir::edit::NewNode;
//! use mmq_ir::{At, DType, Module, Op, Type};
//!
//! let mut m = Module::new();
//! let g = m.add_graph("main", None);
//! let x = m.add_input(g, Some("x".into()), Type::tensor(DType::F32, vec![]));
//! let relu = m.add_node(g, Op::Relu {}, vec![Some(x)], vec![Some((None, Type::Unknown))], None);
//! // Two nodes before the Relu, in the order they are inserted.
//! let mut at = m.cursor(g, At::Before(relu));
//! let a = at.insert(NewNode::new(Op::Neg {}, vec![Some(x)]).output("a"));
//! let a_out = at.module().nodes[a].outputs[0];
//! let b = at.insert(NewNode::new(Op::Abs {}, vec![a_out]).output("b"));
//! assert_eq!(m.graphs[g].nodes(), &[a, b, relu]);
//! ```

mod emit;

pub use emit::{Emit, place, place_before};

use crate::module::{At, Module, NodeData, ValueData, ValueDef};
use crate::{GraphId, Value};
use crate::{Node, Op, Type};

/// A node to insert: its op, operands and results (`None`: an absent optional one), named or
/// not.
#[derive(Clone, Debug)]
pub struct NewNode {
    /// The op.
    pub op: Op,
    /// Operands (`None`: an absent optional operand).
    pub inputs: Vec<Option<Value>>,
    /// Results: name and type, `None` for an absent optional result.
    pub outputs: Vec<Option<(Option<String>, Type)>>,
    /// The node's name.
    pub name: Option<String>,
}

impl NewNode {
    /// A node of `op` on `inputs`, with no results yet and no name.
    pub fn new(op: Op, inputs: Vec<Option<Value>>) -> NewNode {
        NewNode {
            op,
            inputs,
            outputs: Vec::new(),
            name: None,
        }
    }

    /// Adds a result named `name`, its type left to inference.
    pub fn output(mut self, name: impl Into<String>) -> NewNode {
        self.outputs.push(Some((Some(name.into()), Type::Unknown)));
        self
    }

    /// Sets the results.
    pub fn outputs(mut self, outputs: Vec<Option<(Option<String>, Type)>>) -> NewNode {
        self.outputs = outputs;
        self
    }

    /// Names the node.
    pub fn named(mut self, name: impl Into<String>) -> NewNode {
        self.name = Some(name.into());
        self
    }
}

/// Where a cursor inserts.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// At this index of the node list.
    Index(usize),
    /// Nowhere: the nodes belong to the graph but are listed later ([`Module::list_nodes`]).
    Unlisted,
}

/// A place in one graph's node list. Each inserted node goes at the place and the cursor moves
/// past it, so nodes inserted one after another keep their order.
pub struct Cursor<'m> {
    m: &'m mut Module,
    graph: GraphId,
    place: Place,
}

impl Module {
    /// A cursor in `graph` at `at` (a node that is not in the list stands for its end).
    pub fn cursor(&mut self, graph: GraphId, at: At) -> Cursor<'_> {
        let list = &self.graphs[graph].nodes;
        let find = |n: Node| list.iter().position(|&x| x == n);
        let place = match at {
            At::Start => Place::Index(0),
            At::End => Place::Index(list.len()),
            At::Before(n) => Place::Index(find(n).unwrap_or(list.len())),
            At::After(n) => Place::Index(find(n).map_or(list.len(), |p| p + 1)),
            At::Unlisted => Place::Unlisted,
        };
        Cursor {
            m: self,
            graph,
            place,
        }
    }

    /// Appends a node to `graph`.
    pub fn add_node(
        &mut self,
        graph: GraphId,
        op: Op,
        inputs: Vec<Option<Value>>,
        outputs: Vec<Option<(Option<String>, Type)>>,
        name: Option<String>,
    ) -> Node {
        self.cursor(graph, At::End).insert(NewNode {
            op,
            inputs,
            outputs,
            name,
        })
    }

    /// Sets operand `index` of `node` (operands up to it that do not exist become absent).
    pub fn set_operand(&mut self, node: Node, index: usize, value: Option<Value>) {
        let inputs = &mut self.nodes[node].inputs;
        if inputs.len() <= index {
            inputs.resize(index + 1, None);
        }
        inputs[index] = value;
    }

    /// Replaces every operand of `node`.
    pub fn set_operands(&mut self, node: Node, inputs: Vec<Option<Value>>) {
        self.nodes[node].inputs = inputs;
    }

    /// Takes `node` out of its graph's node list (its arena entry stays, unlisted).
    pub fn remove_node(&mut self, node: Node) {
        let graph = self.nodes[node].graph;
        self.graphs[graph].nodes.retain(|&n| n != node);
    }

    /// Moves `node` from its graph's node list to the end of `to`'s.
    pub fn move_node(&mut self, node: Node, to: GraphId) {
        self.remove_node(node);
        self.nodes[node].graph = to;
        self.graphs[to].nodes.push(node);
    }

    /// Keeps the nodes of `graph` for which `keep` holds, in order.
    pub fn retain_nodes(&mut self, graph: GraphId, keep: impl FnMut(&Node) -> bool) {
        self.graphs[graph].nodes.retain(keep);
    }

    /// Replaces `graph`'s node list by `order`: each node belongs to the graph (the order is the
    /// caller's: a topological one, or the one it wants to keep).
    pub fn set_node_order(&mut self, graph: GraphId, order: Vec<Node>) {
        debug_assert!(
            order.iter().all(|&n| self.nodes[n].graph == graph),
            "a node of another graph in the order of graph {graph:?}"
        );
        self.graphs[graph].nodes = order;
    }

    /// Lists `nodes` (unlisted nodes of `graph`, as [`At::Unlisted`] leaves them) at `at`, in
    /// order.
    pub fn list_nodes(&mut self, graph: GraphId, at: At, nodes: &[Node]) {
        let Place::Index(i) = self.cursor(graph, at).place else {
            return;
        };
        self.graphs[graph].nodes.splice(i..i, nodes.iter().copied());
    }

    /// Replaces every use of `old` by `new` in `scope` and the graphs nested in it: operands of
    /// the nodes they list (except the nodes in `except`) and graph outputs. Returns the number
    /// of uses replaced.
    pub fn replace_uses(
        &mut self,
        old: Value,
        new: Value,
        scope: GraphId,
        except: &[Node],
    ) -> usize {
        let mut count = 0;
        for g in self.graph_tree(scope) {
            for o in self.graphs[g].outputs.iter_mut() {
                if *o == old {
                    *o = new;
                    count += 1;
                }
            }
            for i in 0..self.graphs[g].nodes.len() {
                let n = self.graphs[g].nodes[i];
                if except.contains(&n) {
                    continue;
                }
                if self.nodes.get(n).is_none() {
                    continue;
                }
                for x in self.nodes[n].inputs.iter_mut() {
                    if *x == Some(old) {
                        *x = Some(new);
                        count += 1;
                    }
                }
            }
        }
        count
    }
}

impl Cursor<'_> {
    /// The module, to read.
    pub fn module(&self) -> &Module {
        self.m
    }

    /// The module, to add constants and values to.
    pub fn module_mut(&mut self) -> &mut Module {
        self.m
    }

    /// The graph the cursor edits.
    pub fn graph(&self) -> GraphId {
        self.graph
    }

    /// Inserts `new` at the cursor, with fresh result values, and moves past it.
    pub fn insert(&mut self, new: NewNode) -> Node {
        let m = &mut *self.m;
        let node = m.nodes.push(NodeData {
            op: new.op,
            inputs: new.inputs,
            outputs: Vec::new(),
            name: new.name,
            graph: self.graph,
        });
        let mut outs = Vec::with_capacity(new.outputs.len());
        for (index, o) in new.outputs.into_iter().enumerate() {
            outs.push(o.map(|(name, ty)| {
                let ty = m.intern(ty);
                m.values.push(ValueData {
                    name,
                    ty,
                    def: ValueDef::Output {
                        node,
                        index: index as u32,
                    },
                })
            }));
        }
        m.nodes[node].outputs = outs;
        if let Place::Index(i) = &mut self.place {
            let list = &mut m.graphs[self.graph].nodes;
            let at = (*i).min(list.len());
            list.insert(at, node);
            *i = at + 1;
        }
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::GraphId;
    use crate::{Dim, text};

    fn parsed(src: &str) -> Module {
        text::parse(src).expect("parses").0
    }

    fn names(m: &Module, g: GraphId) -> Vec<String> {
        m.graphs[g]
            .nodes
            .iter()
            .map(|&n| {
                let v = m.nodes[n].outputs[0].expect("one result");
                m.values[v].name.clone().unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn a_cursor_places_nodes_where_asked_and_in_order() {
        let mut m = parsed(
            "graph @g(%x: f32[2]) -> (f32[2]) {\n  %a = Relu(%x) : f32[2]\n  %b = Neg(%a) : f32[2]\n  return %b\n}\n",
        );
        let g = m.entries[0].graph;
        let (a, b) = (m.graphs[g].nodes[0], m.graphs[g].nodes[1]);
        let x = m.graphs[g].inputs[0];
        let ty = Type::tensor(crate::DType::F32, vec![Dim::known(2)]);
        let add = |m: &mut Module, at: At, name: &str| {
            let out = vec![Some((Some(name.to_owned()), ty.clone()))];
            m.cursor(g, at)
                .insert(NewNode::new(Op::Abs {}, vec![Some(x)]).outputs(out))
        };
        add(&mut m, At::Start, "start");
        add(&mut m, At::Before(b), "before_b");
        add(&mut m, At::After(a), "after_a");
        add(&mut m, At::End, "end");
        let loose = add(&mut m, At::Unlisted, "unlisted");
        assert_eq!(
            names(&m, g),
            ["start", "a", "after_a", "before_b", "b", "end"]
        );
        assert!(!m.graphs[g].nodes.contains(&loose));
        assert_eq!(m.nodes[loose].graph, g);
        // An anchor that is not listed puts the node last.
        add(&mut m, At::Before(loose), "fallback");
        assert_eq!(names(&m, g).last().map(String::as_str), Some("fallback"));
        // Nodes inserted through one cursor keep their order, and listing places loose nodes.
        let mut at = m.cursor(g, At::Before(b));
        for name in ["one", "two"] {
            let out = vec![Some((Some(name.to_owned()), ty.clone()))];
            at.insert(NewNode::new(Op::Abs {}, vec![Some(x)]).outputs(out));
        }
        m.list_nodes(g, At::After(a), &[loose]);
        assert_eq!(
            names(&m, g),
            [
                "start", "a", "unlisted", "after_a", "before_b", "one", "two", "b", "end",
                "fallback"
            ]
        );
    }

    #[test]
    fn whole_list_edits_and_operands() {
        let mut m = parsed(
            "graph @g(%x: f32[2], %y: f32[2]) -> (f32[2]) {\n  %a = Relu(%x) : f32[2]\n  %b = Neg(%a) : f32[2]\n  %c = Abs(%b) : f32[2]\n  return %c\n}\n",
        );
        let g = m.entries[0].graph;
        let [a, b, c] = m.graphs[g].nodes()[..] else {
            panic!("three nodes")
        };
        let y = m.graphs[g].inputs[1];
        m.set_operand(b, 0, Some(y));
        m.set_operand(b, 2, Some(y));
        assert_eq!(m.nodes[b].inputs, [Some(y), None, Some(y)]);
        m.remove_node(a);
        assert_eq!(m.graphs[g].nodes(), [b, c]);
        m.set_node_order(g, vec![c, b]);
        assert_eq!(m.graphs[g].nodes(), [c, b]);
        m.retain_nodes(g, |&n| n != c);
        assert_eq!(m.graphs[g].nodes(), [b]);
        let h = m.add_graph("h", None);
        m.move_node(b, h);
        assert!(m.graphs[g].nodes().is_empty());
        assert_eq!((m.graphs[h].nodes(), m.nodes[b].graph), (&[b][..], h));
    }

    #[test]
    fn replace_uses_reaches_subgraphs_and_outputs_and_skips_exceptions() {
        let src = "graph @g(%x: f32[2], %c: bool[]) -> (f32[2], f32[2]) {\n  %a = Relu(%x) : f32[2]\n  %n = Neg(%a) : f32[2]\n  %y = If(%c) {\n    then_branch = graph @t() -> (f32[2]) {\n      %p = Abs(%a) : f32[2]\n      return %p\n    },\n    else_branch = graph @e() -> (f32[2]) {\n      return %a\n    }\n  } : f32[2]\n  return %a, %y\n}\n";
        let mut m = parsed(src);
        let g = m.entries[0].graph;
        let [relu, neg, _] = m.graphs[g].nodes[..] else {
            panic!("three nodes")
        };
        let a = m.nodes[relu].outputs[0].expect("a");
        let x = m.graphs[g].inputs[0];
        // Neg keeps reading `a`; the branch node, the else branch's output and the graph
        // output switch to `x`.
        assert_eq!(m.replace_uses(a, x, g, &[neg]), 3);
        assert_eq!(m.nodes[neg].inputs[0], Some(a));
        assert_eq!(m.graphs[g].outputs[0], x);
        let printed = text::print(&m);
        assert!(printed.contains("%p = Abs(%x)"), "{printed}");
        assert!(printed.contains("return %x\n    }"), "{printed}");
    }
}
