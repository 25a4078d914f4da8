//! Module → `.mmir` text.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::PrintOptions;
use super::canon::{const_has_value, printed_entries, printed_links};
use super::lexer::{name_text, quote};
use crate::attr::Attr;
use crate::constant::{Const, ConstData, Storage};
use crate::dim::Sym;
use crate::dtype::DType;
use crate::module::{GraphId, ModelInfo, Module, Node, Value, ValueDef};
use crate::types::{TensorType, Type};

/// Assigns print keys (`name`, `name#k`, or a number) to a list of optionally named entities in
/// print order: a name unique in the list prints as itself, a repeated name gets `#k` on every
/// occurrence after the first, and unnamed entities are numbered from 0.
fn assign_keys(names: &[Option<&str>]) -> Vec<String> {
    let mut count: HashMap<&str, u32> = HashMap::new();
    for n in names.iter().flatten() {
        *count.entry(n).or_default() += 1;
    }
    let mut seen: HashMap<&str, u32> = HashMap::new();
    let mut next_num = 0u64;
    names
        .iter()
        .map(|n| match n {
            None => {
                let k = next_num.to_string();
                next_num += 1;
                k
            }
            Some(n) => {
                let k = seen.entry(n).or_default();
                let text = if *k == 0 {
                    name_text(n)
                } else {
                    format!("{}#{k}", name_text(n))
                };
                *k += 1;
                text
            }
        })
        .collect()
}

/// `f32` in shortest round-trip form; NaNs other than the canonical one print their bits.
pub(crate) fn f32_text(x: f32) -> String {
    if x.is_nan() && x.to_bits() != f32::NAN.to_bits() {
        format!("nan(0x{:08x})", x.to_bits())
    } else {
        format!("{x:?}")
    }
}

/// `f64` in shortest round-trip form; NaNs other than the canonical one print their bits.
pub(crate) fn f64_text(x: f64) -> String {
    if x.is_nan() && x.to_bits() != f64::NAN.to_bits() {
        format!("nan(0x{:016x})", x.to_bits())
    } else {
        format!("{x:?}")
    }
}

struct Printer<'a> {
    m: &'a Module,
    opts: &'a PrintOptions,
    out: String,
    const_keys: Vec<String>,
    has_value: Vec<bool>,
    /// Keys of the values of the top-level graph tree being printed.
    value_keys: HashMap<Value, String>,
    printed_graphs: HashSet<GraphId>,
}

/// A symbol's spelling (quoted when it is not an identifier).
fn sym_text(m: &Module, s: Sym) -> String {
    match m.symbols.get(s) {
        Some(d) => name_text(&d.name),
        None => quote(format!("<undeclared symbol {}>", s.index()).as_bytes()),
    }
}

fn tensor_type_text(m: &Module, t: &TensorType) -> String {
    let dtype = t.dtype.map_or("?", DType::name);
    match &t.shape {
        None => format!("{dtype}[*]"),
        Some(dims) => {
            let dims: Vec<String> = dims.iter().map(|d| d.render(&|s| sym_text(m, s))).collect();
            format!("{dtype}[{}]", dims.join(", "))
        }
    }
}

/// The `.mmir` spelling of a type (`f32[batch, seq, 768]`, `seq<i64[?]>`, `unknown`).
pub(crate) fn type_text(m: &Module, t: &Type) -> String {
    match t {
        Type::Unknown => "unknown".to_owned(),
        Type::Tensor(t) => tensor_type_text(m, t),
        Type::SparseTensor(t) => format!("sparse<{}>", tensor_type_text(m, t)),
        Type::Sequence(e) => format!("seq<{}>", type_text(m, e)),
        Type::Optional(e) => format!("opt<{}>", type_text(m, e)),
        Type::Map(k, v) => format!("map<{}, {}>", k.name(), type_text(m, v)),
    }
}

pub(crate) fn print_module(m: &Module, opts: &PrintOptions) -> String {
    let const_names: Vec<Option<&str>> = m.consts.iter().map(|(_, c)| c.name.as_deref()).collect();
    let mut p = Printer {
        m,
        opts,
        out: String::new(),
        const_keys: assign_keys(&const_names),
        has_value: const_has_value(m),
        value_keys: HashMap::new(),
        printed_graphs: HashSet::new(),
    };
    p.module();
    p.out
}

impl Printer<'_> {
    fn module(&mut self) {
        let m = self.m;
        for (_, s) in m.symbols.iter() {
            let _ = write!(self.out, "sym {}", name_text(&s.name));
            if s.min.is_some() || s.max.is_some() {
                let b = |v: Option<i64>| v.map_or("?".to_owned(), |v| v.to_string());
                let _ = write!(self.out, " in [{}, {}]", b(s.min), b(s.max));
            }
            self.out.push('\n');
        }
        for (_, s) in m.symbols.iter() {
            if let Some(e) = &s.equals {
                let _ = writeln!(
                    self.out,
                    "assume {} = {}",
                    name_text(&s.name),
                    e.render(&|x| sym_text(m, x))
                );
            }
        }
        if !m.symbols.is_empty() && (!m.consts.is_empty() || !m.entries.is_empty()) {
            self.out.push('\n');
        }
        for (c, data) in m.consts.iter() {
            self.const_decl(c, data);
        }
        if !m.consts.is_empty() && !m.entries.is_empty() {
            self.out.push('\n');
        }
        // Keys among the printed entries (an entry whose graph is missing or already printed
        // is skipped, as `canonicalize` drops it).
        let printed = printed_entries(m);
        let entry_names: Vec<Option<&str>> = m
            .entries
            .iter()
            .zip(&printed)
            .map(|(e, &p)| p.then(|| m.graphs[e.graph].name.as_str()))
            .collect();
        let mut keys = assign_keys(
            &entry_names
                .iter()
                .flatten()
                .map(|n| Some(*n))
                .collect::<Vec<_>>(),
        )
        .into_iter();
        let entry_keys: Vec<String> = printed
            .iter()
            .map(|&p| {
                if p {
                    keys.next().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .collect();
        let mut first = true;
        for (i, e) in m.entries.iter().enumerate() {
            if !printed[i] {
                continue;
            }
            if !first {
                self.out.push('\n');
            }
            first = false;
            self.assign_value_keys(e.graph);
            self.graph(e.graph, &entry_keys[i], Some(&e.model), 0);
            self.out.push('\n');
        }
        let links = printed_links(m);
        if !links.is_empty() {
            self.out.push('\n');
        }
        for (l, from, to) in links {
            let _ = writeln!(
                self.out,
                "link @{}[{}] -> @{}[{}]",
                entry_keys[from], l.from.1, entry_keys[to], l.to.1
            );
        }
    }

    /// Computes the keys of every value defined in the tree of `root`, in print order.
    fn assign_value_keys(&mut self, root: GraphId) {
        let mut order = Vec::new();
        let mut seen = self.printed_graphs.clone();
        collect_values(self.m, root, &mut seen, &mut order);
        let names: Vec<Option<&str>> = order
            .iter()
            .map(|&v| self.m.values.get(v).and_then(|d| d.name.as_deref()))
            .collect();
        let keys = assign_keys(&names);
        self.value_keys = order.into_iter().zip(keys).collect();
    }

    fn ty(&self, t: &Type) -> String {
        type_text(self.m, t)
    }

    fn value_ty(&self, v: Value) -> String {
        match self.m.values.get(v) {
            Some(d) => self.ty(&self.m.types[d.ty]),
            None => "unknown".to_owned(),
        }
    }

    fn const_ref(&self, c: Const) -> String {
        match self.const_keys.get(c.index()) {
            Some(k) => format!("${k}"),
            None => format!(
                "${}",
                quote(format!("<missing constant {}>", c.index()).as_bytes())
            ),
        }
    }

    fn value_ref(&self, v: Value) -> String {
        if let Some(ValueDef::Const(c)) = self.m.values.get(v).map(|d| d.def) {
            return self.const_ref(c);
        }
        match self.value_keys.get(&v) {
            Some(k) => format!("%{k}"),
            None => format!(
                "%{}",
                quote(format!("<undefined {}>", v.index()).as_bytes())
            ),
        }
    }

    fn const_decl(&mut self, c: Const, data: &ConstData) {
        let kw = if self.has_value[c.index()] {
            "const"
        } else {
            "tensor"
        };
        let shape: Vec<String> = data.shape.iter().map(i64::to_string).collect();
        let body = self.const_body(data);
        let _ = writeln!(
            self.out,
            "{kw} {} : {}[{}] = {body}",
            self.const_ref(c),
            data.dtype.name(),
            shape.join(", ")
        );
    }

    fn const_body(&self, data: &ConstData) -> String {
        let hash = || format!("hash(\"{}\")", data.short_hash());
        let n = data.num_elements();
        match &data.storage {
            Storage::Strings(v) => {
                if v.len() != n {
                    return hash();
                }
                let items: Vec<String> = v.iter().map(|s| quote(s)).collect();
                format!("dense<[{}]>", items.join(", "))
            }
            Storage::Inline(b) => {
                if n > self.opts.inline_limit
                    || b.len() > self.opts.inline_limit.max(1).saturating_mul(16)
                {
                    return hash();
                }
                dense_text(data.dtype, b, n).unwrap_or_else(|| bytes_text(b))
            }
            Storage::Absent => hash(),
            Storage::External { file, offset, len } => format!(
                "external({}, offset = {offset}, length = {len}, hash = \"{}\")",
                quote(file.location.as_bytes()),
                data.short_hash()
            ),
        }
    }

    fn indent(&mut self, level: usize) {
        for _ in 0..level {
            self.out.push_str("  ");
        }
    }

    /// Prints graph `g` starting at the current position; its body is indented by `level + 1`.
    fn graph(&mut self, g: GraphId, key: &str, model: Option<&ModelInfo>, level: usize) {
        let m = self.m;
        self.printed_graphs.insert(g);
        let data = &m.graphs[g];
        let _ = write!(self.out, "graph @{key}(");
        for (i, &v) in data.inputs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "{}: {}", self.value_ref(v), self.value_ty(v));
            if let Some(ValueDef::Input {
                default: Some(c), ..
            }) = m.values.get(v).map(|d| d.def)
            {
                let _ = write!(self.out, " = {}", self.const_ref(c));
            }
        }
        let outs: Vec<String> = data.outputs.iter().map(|&v| self.value_ty(v)).collect();
        let _ = write!(self.out, ") -> ({})", outs.join(", "));
        if !data.doc.is_empty() {
            let _ = write!(self.out, " doc {}", quote(data.doc.as_bytes()));
        }
        if let Some(model) = model {
            self.model(model);
        }
        self.out.push_str(" {\n");
        for &n in &data.nodes {
            if m.nodes.get(n).is_some() {
                self.node(n, level + 1);
            }
        }
        self.indent(level + 1);
        self.out.push_str("return");
        for (i, &v) in data.outputs.iter().enumerate() {
            self.out.push_str(if i == 0 { " " } else { ", " });
            let r = self.value_ref(v);
            self.out.push_str(&r);
        }
        self.out.push('\n');
        self.indent(level);
        self.out.push('}');
    }

    fn model(&mut self, model: &ModelInfo) {
        let mut fields: Vec<String> = Vec::new();
        if model.ir_version != 0 {
            fields.push(format!("ir_version = {}", model.ir_version));
        }
        if !model.opsets.is_empty() {
            let items: Vec<String> = model
                .opsets
                .iter()
                .map(|(d, v)| format!("{} = {v}", quote(d.as_bytes())))
                .collect();
            fields.push(format!("opsets = {{{}}}", items.join(", ")));
        }
        let strings = [
            ("producer_name", &model.producer_name),
            ("producer_version", &model.producer_version),
            ("domain", &model.domain),
        ];
        for (k, v) in strings {
            if !v.is_empty() {
                fields.push(format!("{k} = {}", quote(v.as_bytes())));
            }
        }
        if model.model_version != 0 {
            fields.push(format!("model_version = {}", model.model_version));
        }
        if !model.doc.is_empty() {
            fields.push(format!("doc = {}", quote(model.doc.as_bytes())));
        }
        if !model.metadata.is_empty() {
            let items: Vec<String> = model
                .metadata
                .iter()
                .map(|(k, v)| format!("{} = {}", quote(k.as_bytes()), quote(v.as_bytes())))
                .collect();
            fields.push(format!("metadata = {{{}}}", items.join(", ")));
        }
        if !model.functions.is_empty() {
            let items: Vec<String> = model.functions.iter().map(|f| bytes_text(f)).collect();
            fields.push(format!("functions = [{}]", items.join(", ")));
        }
        if let Some(src) = &model.source {
            let s = src.to_string_lossy();
            fields.push(format!("source = {}", quote(s.as_bytes())));
        }
        if !fields.is_empty() {
            let _ = write!(self.out, " model {{{}}}", fields.join(", "));
        }
    }

    fn node(&mut self, n: Node, level: usize) {
        let m = self.m;
        let data = &m.nodes[n];
        self.indent(level);
        if !data.outputs.is_empty() {
            let outs: Vec<String> = data
                .outputs
                .iter()
                .map(|o| o.map_or("_".to_owned(), |v| self.value_ref(v)))
                .collect();
            let _ = write!(self.out, "{} = ", outs.join(", "));
        }
        // Bare names are the modeled ops of the default domain; everything else is written
        // with its domain.
        match &data.op {
            op if op.is_custom() || !op.domain().is_empty() => {
                let _ = write!(
                    self.out,
                    "{}.{}",
                    quote(op.domain().as_bytes()),
                    name_text(op.op_type())
                );
            }
            op => self.out.push_str(op.op_type()),
        }
        let ins: Vec<String> = data
            .inputs
            .iter()
            .map(|o| o.map_or("_".to_owned(), |v| self.value_ref(v)))
            .collect();
        let _ = write!(self.out, "({})", ins.join(", "));
        let attrs = data.op.attrs();
        if !attrs.is_empty() {
            let multiline = attrs.iter().any(|(_, a)| !a.graphs().is_empty());
            self.out.push_str(" {");
            for (i, (name, a)) in attrs.iter().enumerate() {
                if multiline {
                    self.out.push('\n');
                    self.indent(level + 1);
                } else if i > 0 {
                    self.out.push_str(", ");
                }
                let _ = write!(self.out, "{} = ", name_text(name));
                self.attr(a, level + 1);
                if multiline && i + 1 < attrs.len() {
                    self.out.push(',');
                }
            }
            if multiline {
                self.out.push('\n');
                self.indent(level);
            }
            self.out.push('}');
        }
        let tys: Vec<String> = data
            .outputs
            .iter()
            .flatten()
            .map(|&v| self.value_ty(v))
            .collect();
        if !tys.is_empty() {
            let _ = write!(self.out, " : {}", tys.join(", "));
        }
        if self.opts.loc
            && let Some(name) = &data.name
        {
            let _ = write!(self.out, " loc({})", quote(name.as_bytes()));
        }
        if let Some(note) = self.opts.node_notes.get(&n) {
            let _ = write!(self.out, " // {}", note.replace('\n', " "));
        }
        self.out.push('\n');
    }

    fn graph_attr(&mut self, g: GraphId, level: usize) {
        match self.m.graphs.get(g) {
            Some(data) if !self.printed_graphs.contains(&g) => {
                let key = name_text(&data.name);
                self.graph(g, &key, None, level);
            }
            // A graph referenced twice (or a dangling handle) cannot be printed inline again;
            // the reference makes the text fail to parse rather than silently duplicating it.
            Some(data) => {
                let _ = write!(self.out, "@{}", name_text(&data.name));
            }
            None => {
                let _ = write!(self.out, "@{}", quote(b"<missing graph>"));
            }
        }
    }

    fn attr(&mut self, a: &Attr, level: usize) {
        fn list<T>(p: &mut Printer<'_>, kind: &str, items: &[T], f: impl Fn(&mut Printer<'_>, &T)) {
            if items.is_empty() {
                let _ = write!(p.out, "{kind}[]");
                return;
            }
            p.out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    p.out.push_str(", ");
                }
                f(p, x);
            }
            p.out.push(']');
        }
        match a {
            Attr::Int(i) => {
                let _ = write!(self.out, "{i}");
            }
            Attr::Float(x) => self.out.push_str(&f32_text(*x)),
            Attr::String(s) => self.out.push_str(&quote(s.as_bytes())),
            Attr::Tensor(c) => {
                let r = self.const_ref(*c);
                self.out.push_str(&r);
            }
            Attr::Graph(g) => self.graph_attr(*g, level),
            Attr::Type(t) => {
                let t = self.ty(t);
                let _ = write!(self.out, "type<{t}>");
            }
            Attr::Ints(v) => list(self, "ints", v, |p, i| {
                let _ = write!(p.out, "{i}");
            }),
            Attr::Floats(v) => list(self, "floats", v, |p, x| p.out.push_str(&f32_text(*x))),
            Attr::Strings(v) => list(self, "strings", v, |p, s| {
                p.out.push_str(&quote(s.as_bytes()));
            }),
            Attr::Tensors(v) => list(self, "tensors", v, |p, c| {
                let r = p.const_ref(*c);
                p.out.push_str(&r);
            }),
            Attr::Graphs(v) => list(self, "graphs", v, |p, g| p.graph_attr(*g, level)),
            Attr::Types(v) => list(self, "types", v, |p, t| {
                let t = p.ty(t);
                let _ = write!(p.out, "type<{t}>");
            }),
        }
    }
}

/// The values defined in the tree of `g` (inputs, then per node its subgraphs' values and its
/// results), in print order. Graphs in `seen` are skipped (and `g`'s tree is added to it).
pub(crate) fn collect_values(
    m: &Module,
    g: GraphId,
    seen: &mut HashSet<GraphId>,
    out: &mut Vec<Value>,
) {
    let Some(data) = m.graphs.get(g) else { return };
    if !seen.insert(g) {
        return;
    }
    out.extend(data.inputs.iter().copied());
    for &n in &data.nodes {
        let Some(node) = m.nodes.get(n) else { continue };
        for sg in node.op.subgraphs() {
            collect_values(m, sg, seen, out);
        }
        out.extend(node.outputs.iter().flatten().copied());
    }
}

/// `dense<[...]>` for the dtypes with a literal syntax, when `b` holds exactly `n` elements.
fn dense_text(dtype: DType, b: &[u8], n: usize) -> Option<String> {
    let width = match dtype {
        DType::F32 | DType::I32 | DType::U32 => 4,
        DType::F64 | DType::I64 | DType::U64 => 8,
        DType::I16 | DType::U16 => 2,
        DType::I8 | DType::U8 | DType::Bool => 1,
        _ => return None,
    };
    if b.len() != n.checked_mul(width)? {
        return None;
    }
    if dtype == DType::Bool && b.iter().any(|&x| x > 1) {
        return None;
    }
    let items: Vec<String> = b
        .chunks_exact(width)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..width].copy_from_slice(c);
            let u = u64::from_le_bytes(w);
            match dtype {
                DType::F32 => f32_text(f32::from_bits(u as u32)),
                DType::F64 => f64_text(f64::from_bits(u)),
                DType::I8 => (u as u8 as i8).to_string(),
                DType::I16 => (u as u16 as i16).to_string(),
                DType::I32 => (u as u32 as i32).to_string(),
                DType::I64 => (u as i64).to_string(),
                DType::Bool => (if u == 1 { "true" } else { "false" }).to_owned(),
                _ => u.to_string(),
            }
        })
        .collect();
    Some(format!("dense<[{}]>", items.join(", ")))
}

/// `bytes<"hex">`.
fn bytes_text(b: &[u8]) -> String {
    let mut hex = String::with_capacity(b.len() * 2 + 9);
    hex.push_str("bytes<\"");
    for x in b {
        let _ = write!(hex, "{x:02x}");
    }
    hex.push_str("\">");
    hex
}
