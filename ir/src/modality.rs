//! Modality analysis: which inputs of a multimodal model each node depends on.
//!
//! Every graph input is given a modality ([`Modality::Vision`], [`Modality::Text`] or
//! [`Modality::Audio`]) from an override (`--modality INPUT=vision`), else from its name, else
//! from its dtype and shape (see [`guess_input`]); an input that fits none contributes nothing.
//! Modalities then flow forward along operands: a node is labelled with the one modality it
//! depends on, [`Modality::Fusion`] when it depends on inputs of more than one, and
//! [`Modality::Shared`] when it depends on none (constants and unlabelled inputs only).
//!
//! Nodes of `If`/`Loop`/`Scan` bodies see the modalities of the operands of the node that owns
//! the body (for the body's inputs) and of the outer values they read; the owning node's results
//! also carry what its bodies depend on. Inputs of a top-level graph fed by another graph's output
//! ([`crate::Link`]) take that output's modalities.
//!
//! Weights are attributed to the nodes that use them: a constant read only by nodes of one label
//! (directly, or through constant-only nodes such as `Constant`, `Cast`, `Transpose`) has that
//! label; one read by nodes of different labels is [`Modality::Shared`].
//!
//! The result is a side table ([`Labels`]); the IR is not changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use crate::arena::SecondaryMap;
use crate::constant::Const;
use crate::dtype::DType;
use crate::module::{GraphId, Module, Node, Value, ValueDef};
use crate::types::Type;

/// The modality label of a node, value or weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    /// Depends on image or video inputs only.
    Vision,
    /// Depends on token inputs only.
    Text,
    /// Depends on audio inputs only.
    Audio,
    /// Depends on inputs of more than one modality.
    Fusion,
    /// Depends on no labelled input.
    Shared,
}

impl Modality {
    /// Every label, in the order reports list them.
    pub const ALL: [Modality; 5] = [
        Modality::Vision,
        Modality::Text,
        Modality::Audio,
        Modality::Fusion,
        Modality::Shared,
    ];

    /// The lower-case name (`vision`, `text`, `audio`, `fusion`, `shared`).
    pub fn name(self) -> &'static str {
        match self {
            Modality::Vision => "vision",
            Modality::Text => "text",
            Modality::Audio => "audio",
            Modality::Fusion => "fusion",
            Modality::Shared => "shared",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Modality::Vision => VISION,
            Modality::Text => TEXT,
            Modality::Audio => AUDIO,
            Modality::Fusion | Modality::Shared => 0,
        }
    }

    fn from_bits(bits: u8) -> Modality {
        match bits {
            0 => Modality::Shared,
            VISION => Modality::Vision,
            TEXT => Modality::Text,
            AUDIO => Modality::Audio,
            _ => Modality::Fusion,
        }
    }
}

impl fmt::Display for Modality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A modality name that is not one of `vision`, `text`, `audio`, `fusion`, `shared`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown modality '{0}' (expected vision, text, audio, fusion or shared)")]
pub struct ParseModalityError(pub String);

impl FromStr for Modality {
    type Err = ParseModalityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Modality::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseModalityError(s.to_owned()))
    }
}

const VISION: u8 = 1;
const TEXT: u8 = 2;
const AUDIO: u8 = 4;

/// How an input's modality was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputSource {
    /// Given by the caller.
    Override,
    /// From the input's name (`pixel_values`, `input_ids`, `input_features`, ...).
    Name,
    /// From the input's dtype and shape (float `[N, 3, H, W]`, integer `[N, S]`, ...).
    Shape,
    /// From the graph output that feeds it through a link.
    Link,
    /// Nothing matched; the input contributes no modality.
    Unknown,
}

/// The modality given to one graph input and why.
#[derive(Clone, Debug, PartialEq)]
pub struct InputLabel {
    /// The input value.
    pub value: Value,
    /// Its source name (empty when unnamed).
    pub name: String,
    /// The modality ([`Modality::Shared`] when unknown).
    pub modality: Modality,
    /// How it was decided.
    pub source: InputSource,
}

/// An override names no input of any top-level graph, or gives a label an input cannot have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModalityError {
    /// No top-level graph has an input of this name.
    #[error("--modality {name}: the model has no input '{name}' (inputs: {known})")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The input names, comma-separated.
        known: String,
    },
    /// Inputs are vision, text, audio or shared; `fusion` is a derived label.
    #[error("--modality {name}={modality}: an input can be vision, text, audio or shared")]
    NotAnInputLabel {
        /// The input name.
        name: String,
        /// The label given.
        modality: Modality,
    },
}

/// Per-node, per-value and per-weight labels of one top-level graph and its subgraphs.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    nodes: SecondaryMap<Node, Modality>,
    value_bits: SecondaryMap<Value, u8>,
    weights: BTreeMap<Const, Modality>,
    inputs: Vec<InputLabel>,
    order: Vec<Node>,
}

/// Node count and weight bytes of one label (see [`Labels::summary`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModalityStats {
    /// Nodes with this label (subgraph nodes included).
    pub nodes: usize,
    /// Bytes of the weights attributed to this label.
    pub weight_bytes: u64,
    /// Number of those weights.
    pub weights: usize,
}

impl Labels {
    /// The label of a node of the analysed graph tree ([`Modality::Shared`] for other nodes).
    pub fn node(&self, n: Node) -> Modality {
        self.nodes.get(n).copied().unwrap_or(Modality::Shared)
    }

    /// The label of a value: the modalities it depends on.
    pub fn value(&self, v: Value) -> Modality {
        Modality::from_bits(self.value_bits.get(v).copied().unwrap_or(0))
    }

    /// The input modalities a value depends on (a subset of vision, text, audio, in that order).
    pub fn value_sources(&self, v: Value) -> Vec<Modality> {
        let bits = self.value_bits.get(v).copied().unwrap_or(0);
        [Modality::Vision, Modality::Text, Modality::Audio]
            .into_iter()
            .filter(|m| bits & m.bit() != 0)
            .collect()
    }

    /// The label of a weight used by the analysed graph tree, if it is used there.
    pub fn weight(&self, c: Const) -> Option<Modality> {
        self.weights.get(&c).copied()
    }

    /// The weights used by the analysed graph tree with their labels, in constant order.
    pub fn weights(&self) -> impl Iterator<Item = (Const, Modality)> + '_ {
        self.weights.iter().map(|(&c, &m)| (c, m))
    }

    /// The top-level graph's inputs with their modalities.
    pub fn inputs(&self) -> &[InputLabel] {
        &self.inputs
    }

    /// Every labelled node, outer graph first, each graph in list order.
    pub fn nodes(&self) -> impl Iterator<Item = (Node, Modality)> + '_ {
        self.order.iter().map(|&n| (n, self.node(n)))
    }

    /// Node counts and weight bytes per label, in [`Modality::ALL`] order, labels with neither
    /// nodes nor weights left out.
    pub fn summary(&self, m: &Module) -> Vec<(Modality, ModalityStats)> {
        let mut by: BTreeMap<Modality, ModalityStats> = BTreeMap::new();
        for (_, label) in self.nodes() {
            by.entry(label).or_default().nodes += 1;
        }
        for (c, label) in self.weights() {
            let s = by.entry(label).or_default();
            s.weights += 1;
            s.weight_bytes += m.consts.get(c).map_or(0, |c| c.byte_len());
        }
        Modality::ALL
            .into_iter()
            .filter_map(|l| by.get(&l).map(|s| (l, *s)))
            .collect()
    }
}

/// Guesses the modality of a graph input from its name, then its dtype and shape. `None` when
/// nothing fits.
///
/// Names (case-insensitive substrings): `pixel`, `image`, `img`, `vision`, `patch`, `video` are
/// vision; `audio`, `speech`, `wav`, `mel`, `spectrogram`, `fbank`, `input_features`,
/// `input_values` are audio; `input_ids`, `token`, `text`, `attention_mask`, `position_ids`,
/// `past_key`, `past_value`, `cache_position` are text. Shapes: a float rank-4 tensor with 1, 3
/// or 4 channels first or last, or any float rank-5 tensor, is vision; an integer tensor of rank
/// 1 or 2 is text (token ids); a float rank-3 tensor with 80 or 128 bins is audio (mel frames).
pub fn guess_input(name: &str, ty: &Type) -> Option<(Modality, InputSource)> {
    let lower = name.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if has(&["pixel", "image", "img", "vision", "patch", "video"]) {
        return Some((Modality::Vision, InputSource::Name));
    }
    if has(&[
        "audio",
        "speech",
        "wav",
        "mel",
        "spectrogram",
        "fbank",
        "input_features",
        "input_values",
    ]) {
        return Some((Modality::Audio, InputSource::Name));
    }
    if has(&[
        "input_ids",
        "token",
        "text",
        "attention_mask",
        "position_ids",
        "past_key",
        "past_value",
        "cache_position",
    ]) {
        return Some((Modality::Text, InputSource::Name));
    }
    let t = ty.as_tensor()?;
    let dtype = t.dtype?;
    let shape = t.shape.as_ref()?;
    let known = |i: usize| shape.get(i).and_then(|d| d.as_known());
    let is_float = matches!(
        dtype,
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::U8
    );
    let is_int = matches!(dtype, DType::I64 | DType::I32);
    let channels = |c: Option<i64>| matches!(c, Some(1 | 3 | 4));
    let guess = match shape.len() {
        4 if is_float && (channels(known(1)) || channels(known(3))) => Some(Modality::Vision),
        5 if is_float => Some(Modality::Vision),
        1 | 2 if is_int => Some(Modality::Text),
        3 if is_float && (1..3).any(|i| matches!(known(i), Some(80 | 128))) => {
            Some(Modality::Audio)
        }
        _ => None,
    };
    guess.map(|m| (m, InputSource::Shape))
}

/// Labels every node of top-level graph `graph` and of its subgraphs. `overrides` give input
/// modalities by input name; a name that is not an input of any top-level graph of `m` is an
/// error, as is the label `fusion`.
pub fn analyze(
    m: &Module,
    graph: GraphId,
    overrides: &[(String, Modality)],
) -> Result<Labels, ModalityError> {
    check_overrides(m, overrides)?;
    let mut visiting = HashSet::new();
    Ok(analyze_graph(m, graph, overrides, &mut visiting))
}

fn check_overrides(m: &Module, overrides: &[(String, Modality)]) -> Result<(), ModalityError> {
    let names: Vec<&str> = m
        .entries
        .iter()
        .flat_map(|e| m.graphs[e.graph].inputs.iter())
        .filter_map(|&v| m.values[v].name.as_deref())
        .collect();
    for (name, modality) in overrides {
        if *modality == Modality::Fusion {
            return Err(ModalityError::NotAnInputLabel {
                name: name.clone(),
                modality: *modality,
            });
        }
        if !names.contains(&name.as_str()) {
            return Err(ModalityError::UnknownInput {
                name: name.clone(),
                known: names.join(", "),
            });
        }
    }
    Ok(())
}

fn analyze_graph(
    m: &Module,
    graph: GraphId,
    overrides: &[(String, Modality)],
    visiting: &mut HashSet<GraphId>,
) -> Labels {
    visiting.insert(graph);
    let mut labels = Labels::default();
    for (index, &v) in m.graphs[graph].inputs.iter().enumerate() {
        let name = m.values[v].name.clone().unwrap_or_default();
        let over = overrides.iter().rev().find(|(n, _)| *n == name);
        let (bits, modality, source) = if let Some((_, o)) = over {
            (o.bit(), *o, InputSource::Override)
        } else if let Some(bits) = linked_bits(m, graph, index as u32, overrides, visiting) {
            (bits, Modality::from_bits(bits), InputSource::Link)
        } else if let Some((o, source)) = guess_input(&name, m.value_type(v)) {
            (o.bit(), o, source)
        } else {
            (0, Modality::Shared, InputSource::Unknown)
        };
        labels.value_bits.insert(v, bits);
        labels.inputs.push(InputLabel {
            value: v,
            name,
            modality,
            source,
        });
    }
    let mut consumers: HashMap<Value, Vec<Node>> = HashMap::new();
    forward(m, graph, 0, &mut labels, &mut consumers);
    attribute_weights(m, graph, &mut labels, &consumers);
    visiting.remove(&graph);
    labels
}

/// The modalities of the graph output that feeds input `index` of `graph` through a link.
fn linked_bits(
    m: &Module,
    graph: GraphId,
    index: u32,
    overrides: &[(String, Modality)],
    visiting: &mut HashSet<GraphId>,
) -> Option<u8> {
    let link = m.links.iter().find(|l| l.to == (graph, index))?;
    let (src, out) = link.from;
    if visiting.contains(&src) {
        return None;
    }
    let v = *m.graphs.get(src)?.outputs.get(out as usize)?;
    let src_labels = analyze_graph(m, src, overrides, visiting);
    src_labels.value_bits.get(v).copied()
}

/// Propagates modality bits forward through `graph`; `inherited` is what the graph's own
/// inputs depend on when it is a body (the owning node's operands).
fn forward(
    m: &Module,
    graph: GraphId,
    inherited: u8,
    labels: &mut Labels,
    consumers: &mut HashMap<Value, Vec<Node>>,
) -> u8 {
    let g = &m.graphs[graph];
    if g.parent.is_some() {
        for &v in &g.inputs {
            labels.value_bits.insert(v, inherited);
        }
    }
    for &n in &g.nodes {
        let node = &m.nodes[n];
        let mut bits = 0u8;
        for &v in node.inputs.iter().flatten() {
            bits |= labels.value_bits.get(v).copied().unwrap_or(0);
            consumers.entry(v).or_default().push(n);
        }
        labels.order.push(n);
        let operand_bits = bits;
        for sub in node.op.subgraphs() {
            if m.graphs.get(sub).is_none() {
                continue;
            }
            let body = forward(m, sub, operand_bits, labels, consumers);
            bits |= body;
        }
        labels.nodes.insert(n, Modality::from_bits(bits));
        for &v in node.outputs.iter().flatten() {
            labels.value_bits.insert(v, bits);
        }
    }
    // A body depends on everything its nodes read, not only on what it returns.
    let mut out = 0;
    for &v in &g.outputs {
        out |= labels.value_bits.get(v).copied().unwrap_or(0);
    }
    for &n in &g.nodes {
        for &v in m.nodes[n].outputs.iter().flatten() {
            out |= labels.value_bits.get(v).copied().unwrap_or(0);
        }
    }
    out
}

/// The node of `graph` that is `n` or holds `n` in one of its (nested) bodies.
fn ancestor_in(m: &Module, mut n: Node, graph: GraphId) -> Option<Node> {
    loop {
        let g = m.nodes[n].graph;
        if g == graph {
            return Some(n);
        }
        n = m.graphs[g].parent?;
    }
}

/// Labels each weight by the nodes that use it (see the module documentation).
fn attribute_weights(
    m: &Module,
    graph: GraphId,
    labels: &mut Labels,
    consumers: &HashMap<Value, Vec<Node>>,
) {
    // The label a node's results are used under: its own when it depends on an input, else the
    // common label of its users (Shared when they differ), else the owning node's.
    let mut use_label: HashMap<Node, Modality> = HashMap::new();
    let combine = |acc: Option<Modality>, l: Modality| match acc {
        None => Some(l),
        Some(a) if a == l => Some(a),
        Some(_) => Some(Modality::Shared),
    };
    for g in m.graph_tree(graph) {
        let parent_label = m.graphs[g]
            .parent
            .and_then(|p| use_label.get(&p).copied())
            .unwrap_or(Modality::Shared);
        for &n in m.graphs[g].nodes.iter().rev() {
            let own = labels.node(n);
            let label = if own != Modality::Shared {
                own
            } else {
                let mut acc = None;
                for &v in m.nodes[n].outputs.iter().flatten() {
                    for &c in consumers.get(&v).map_or(&[][..], |c| c.as_slice()) {
                        let user = ancestor_in(m, c, g).unwrap_or(c);
                        let l = use_label
                            .get(&user)
                            .copied()
                            .unwrap_or_else(|| labels.node(user));
                        acc = combine(acc, l);
                    }
                }
                acc.unwrap_or(parent_label)
            };
            use_label.insert(n, label);
        }
    }
    let mut weights: BTreeMap<Const, Option<Modality>> = BTreeMap::new();
    for g in m.graph_tree(graph) {
        for &n in &m.graphs[g].nodes {
            let l = use_label.get(&n).copied().unwrap_or(Modality::Shared);
            let node = &m.nodes[n];
            let operand_consts = node.inputs.iter().flatten().filter_map(|&v| {
                match m.values.get(v).map(|d| d.def) {
                    Some(ValueDef::Const(c)) => Some(c),
                    Some(ValueDef::Input {
                        default: Some(c), ..
                    }) => Some(c),
                    _ => None,
                }
            });
            for c in operand_consts.chain(node.op.attr_consts()) {
                let e = weights.entry(c).or_insert(None);
                *e = combine(*e, l);
            }
        }
    }
    labels.weights = weights
        .into_iter()
        .map(|(c, l)| (c, l.unwrap_or(Modality::Shared)))
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constant::{ConstData, Storage};
    use crate::dim::Dim;
    use crate::op::Op;

    fn f32t(dims: &[i64]) -> Type {
        Type::tensor(DType::F32, dims.iter().map(|&d| Dim::known(d)).collect())
    }

    fn weight(m: &mut Module, name: &str, n: usize) -> Value {
        m.add_const(ConstData::new(
            Some(name.to_owned()),
            DType::F32,
            vec![n as i64],
            Storage::Inline(bytes::Bytes::from(vec![0u8; n * 4])),
        ))
    }

    /// pixel -> Conv(w_conv) -> a; ids -> Gather(w_emb) -> b; a + b -> fused.
    fn two_tower() -> (Module, GraphId, [Node; 4]) {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        let px = m.add_input(g, Some("pixel_values".into()), f32t(&[1, 3, 8, 8]));
        let ids = m.add_input(
            g,
            Some("ids".into()),
            Type::tensor(DType::I64, vec![Dim::known(1), Dim::known(4)]),
        );
        let wc = weight(&mut m, "w_conv", 8);
        let we = weight(&mut m, "w_emb", 16);
        let wshared = weight(&mut m, "w_shared", 4);
        let conv = m.add_node(
            g,
            Op::from_parts("", "Relu", vec![]),
            vec![Some(px), Some(wc), Some(wshared)],
            vec![Some((Some("a".into()), f32t(&[1])))],
            Some("vision/conv".into()),
        );
        let a = m.nodes[conv].outputs[0].unwrap();
        let gather = m.add_node(
            g,
            Op::from_parts("", "Gather", vec![]),
            vec![Some(we), Some(ids)],
            vec![Some((Some("b".into()), f32t(&[1])))],
            Some("text/embed".into()),
        );
        let b = m.nodes[gather].outputs[0].unwrap();
        let cst = m.add_node(
            g,
            Op::from_parts("", "Neg", vec![]),
            vec![Some(wshared)],
            vec![Some((Some("c".into()), f32t(&[1])))],
            Some("const_only".into()),
        );
        let c = m.nodes[cst].outputs[0].unwrap();
        let add = m.add_node(
            g,
            Op::from_parts("", "Sum", vec![]),
            vec![Some(a), Some(b), Some(c)],
            vec![Some((Some("fused".into()), f32t(&[1])))],
            Some("fusion/add".into()),
        );
        let out = m.nodes[add].outputs[0].unwrap();
        m.graphs[g].outputs.push(out);
        m.entries.push(crate::Entry {
            graph: g,
            model: Default::default(),
        });
        (m, g, [conv, gather, cst, add])
    }

    #[test]
    fn labels_flow_from_inputs() {
        let (m, g, [conv, gather, cst, add]) = two_tower();
        let l = analyze(&m, g, &[]).unwrap();
        assert_eq!(l.node(conv), Modality::Vision);
        assert_eq!(l.node(gather), Modality::Text);
        assert_eq!(l.node(cst), Modality::Shared);
        assert_eq!(l.node(add), Modality::Fusion);
        assert_eq!(l.inputs()[0].source, InputSource::Name);
        assert_eq!(l.inputs()[1].source, InputSource::Shape);
        let out = m.graphs[g].outputs[0];
        assert_eq!(l.value_sources(out), vec![Modality::Vision, Modality::Text]);
    }

    #[test]
    fn weights_follow_their_users() {
        let (m, g, _) = two_tower();
        let l = analyze(&m, g, &[]).unwrap();
        let by_name: BTreeMap<String, Modality> = l
            .weights()
            .map(|(c, lab)| (m.consts[c].name.clone().unwrap(), lab))
            .collect();
        assert_eq!(by_name["w_conv"], Modality::Vision);
        assert_eq!(by_name["w_emb"], Modality::Text);
        // Read by the vision conv and (through a constant-only node) by the fusion sum.
        assert_eq!(by_name["w_shared"], Modality::Shared);
        let s: BTreeMap<Modality, ModalityStats> = l.summary(&m).into_iter().collect();
        assert_eq!(s[&Modality::Vision].weight_bytes, 32);
        assert_eq!(s[&Modality::Text].weight_bytes, 64);
        assert_eq!(s[&Modality::Fusion].nodes, 1);
        assert_eq!(s[&Modality::Shared].nodes, 1);
    }

    #[test]
    fn overrides_win_and_are_checked() {
        let (m, g, [conv, _, _, add]) = two_tower();
        let l = analyze(&m, g, &[("pixel_values".into(), Modality::Audio)]).unwrap();
        assert_eq!(l.node(conv), Modality::Audio);
        assert_eq!(l.inputs()[0].source, InputSource::Override);
        let l = analyze(&m, g, &[("ids".into(), Modality::Vision)]).unwrap();
        assert_eq!(l.node(add), Modality::Vision);
        let e = analyze(&m, g, &[("nope".into(), Modality::Text)]).unwrap_err();
        assert!(e.to_string().contains("pixel_values, ids"), "{e}");
        let e = analyze(&m, g, &[("ids".into(), Modality::Fusion)]).unwrap_err();
        assert!(matches!(e, ModalityError::NotAnInputLabel { .. }));
    }

    #[test]
    fn guesses_from_names_and_shapes() {
        let t = |d: DType, s: &[i64]| Type::tensor(d, s.iter().map(|&x| Dim::known(x)).collect());
        let g = |n: &str, ty: Type| guess_input(n, &ty).map(|x| x.0);
        assert_eq!(
            g("x", t(DType::F32, &[1, 3, 224, 224])),
            Some(Modality::Vision)
        );
        assert_eq!(
            g("x", t(DType::F32, &[1, 224, 224, 3])),
            Some(Modality::Vision)
        );
        assert_eq!(g("x", t(DType::I64, &[1, 7])), Some(Modality::Text));
        assert_eq!(g("x", t(DType::F32, &[1, 80, 3000])), Some(Modality::Audio));
        assert_eq!(
            g("input_features", t(DType::F32, &[1, 2])),
            Some(Modality::Audio)
        );
        assert_eq!(
            g("attention_mask", t(DType::F32, &[1, 2])),
            Some(Modality::Text)
        );
        assert_eq!(g("x", t(DType::F32, &[1, 7, 64])), None);
        assert_eq!("Vision".parse::<Modality>(), Ok(Modality::Vision));
        assert!("pixels".parse::<Modality>().is_err());
    }

    #[test]
    fn labels_print_as_comments_that_parse_back() {
        let (m, g, [conv, ..]) = two_tower();
        let l = analyze(&m, g, &[]).unwrap();
        let opts = crate::text::PrintOptions {
            node_notes: l.nodes().map(|(n, lab)| (n, lab.to_string())).collect(),
            ..Default::default()
        };
        let text = crate::text::print_with(&m, &opts);
        assert!(text.contains("loc(\"vision/conv\") // vision"), "{text}");
        assert!(text.contains("// fusion"), "{text}");
        let (back, _) = crate::text::parse(&text).unwrap();
        assert_eq!(crate::text::print(&back), crate::text::print(&m));
        assert_eq!(l.node(conv), Modality::Vision);
    }

    #[test]
    fn bodies_and_links_carry_labels() {
        // main: If(cond) { then: Neg(pixel outer value) } with cond from a constant.
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        let px = m.add_input(g, Some("pixel_values".into()), f32t(&[1, 3, 8, 8]));
        let cond = m.add_const(ConstData::new(
            Some("cond".into()),
            DType::Bool,
            vec![],
            Storage::Inline(bytes::Bytes::from(vec![1u8])),
        ));
        let body = m.add_graph("then", None);
        let w = weight(&mut m, "w_body", 4);
        let inner = m.add_node(
            body,
            Op::from_parts("", "Mul", vec![]),
            vec![Some(px), Some(w)],
            vec![Some((Some("inner".into()), f32t(&[1])))],
            None,
        );
        let inner_out = m.nodes[inner].outputs[0].unwrap();
        m.graphs[body].outputs.push(inner_out);
        let iff = m.add_node(
            g,
            Op::from_parts(
                "",
                "If",
                vec![
                    ("then_branch".into(), crate::Attr::Graph(body)),
                    ("else_branch".into(), crate::Attr::Graph(body)),
                ],
            ),
            vec![Some(cond)],
            vec![Some((Some("y".into()), f32t(&[1])))],
            None,
        );
        m.graphs[body].parent = Some(iff);
        let y = m.nodes[iff].outputs[0].unwrap();
        m.graphs[g].outputs.push(y);
        // A second graph whose input is fed by `y`.
        let dec = m.add_graph("decoder", None);
        let x = m.add_input(dec, Some("x".into()), f32t(&[1]));
        let relu = m.add_node(
            dec,
            Op::from_parts("", "Relu", vec![]),
            vec![Some(x)],
            vec![Some((Some("z".into()), f32t(&[1])))],
            None,
        );
        for graph in [g, dec] {
            m.entries.push(crate::Entry {
                graph,
                model: Default::default(),
            });
        }
        m.links.push(crate::Link {
            from: (g, 0),
            to: (dec, 0),
        });
        let l = analyze(&m, g, &[]).unwrap();
        assert_eq!(l.node(inner), Modality::Vision);
        assert_eq!(
            l.node(iff),
            Modality::Vision,
            "an If is what its bodies read"
        );
        let wc = match m.values[w].def {
            ValueDef::Const(c) => c,
            _ => unreachable!(),
        };
        assert_eq!(l.weight(wc), Some(Modality::Vision));
        let l = analyze(&m, dec, &[]).unwrap();
        assert_eq!(l.inputs()[0].source, InputSource::Link);
        assert_eq!(l.node(relu), Modality::Vision);
        let l = analyze(&m, dec, &[("x".into(), Modality::Audio)]).unwrap();
        assert_eq!(l.node(relu), Modality::Audio);
    }
}
