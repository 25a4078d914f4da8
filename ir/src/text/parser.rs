//! `.mmir` text → Module: a recursive-descent parser over the lexer's tokens.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::lexer::{RefName, Tok, Token, lex};
use super::{ParseError, ParseOptions, SpanMap};
use crate::attr::Attr;
use crate::constant::{Const, ConstData, ExternalFile, Storage};
use crate::diag::Entity;
use crate::dim::{Dim, DimExpr};
use crate::dtype::DType;
use crate::module::{Entry, GraphId, Link, ModelInfo, Module, Value, ValueDef};
use crate::op::Op;
use crate::types::{TensorType, Type};

/// Deepest nesting of types, dim parentheses and subgraphs (keeps the recursion bounded).
const MAX_DEPTH: usize = 64;

/// An error was reported; the caller resynchronizes.
struct Reported;

type PResult<T> = Result<T, Reported>;

pub(crate) fn parse_module(
    src: &str,
    opts: &ParseOptions,
) -> Result<(Module, SpanMap), Vec<ParseError>> {
    let (toks, errors) = lex(src);
    let mut p = Parser {
        toks,
        pos: 0,
        errors,
        opts,
        m: Module::new(),
        spans: SpanMap::default(),
        declared_syms: HashMap::new(),
        consts: HashMap::new(),
        scopes: Vec::new(),
        poisoned: HashSet::new(),
        defining: Vec::new(),
        entries: HashMap::new(),
        links: Vec::new(),
        files: HashMap::new(),
        depth: 0,
    };
    p.module();
    if p.errors.is_empty() {
        Ok((p.m, p.spans))
    } else {
        Err(p.errors)
    }
}

fn ref_text(sigil: char, r: &RefName) -> String {
    match r {
        RefName::Num(n) => format!("{sigil}{n}"),
        RefName::Named(n, 0) => format!("{sigil}{}", super::lexer::name_text(n)),
        RefName::Named(n, k) => format!("{sigil}{}#{k}", super::lexer::name_text(n)),
    }
}

fn ref_source_name(r: &RefName) -> Option<String> {
    match r {
        RefName::Named(n, _) => Some(n.clone()),
        RefName::Num(_) => None,
    }
}

/// What an attribute value is, in words.
fn attr_kind(a: &Attr) -> &'static str {
    match a {
        Attr::Int(_) => "an int",
        Attr::Float(_) => "a float",
        Attr::String(_) => "a string",
        Attr::Tensor(_) => "a tensor",
        Attr::Graph(_) => "a graph",
        Attr::Type(_) => "a type",
        Attr::Ints(_) => "a list of ints",
        Attr::Floats(_) => "a list of floats",
        Attr::Strings(_) => "a list of strings",
        Attr::Tensors(_) => "a list of tensors",
        Attr::Graphs(_) => "a list of graphs",
        Attr::Types(_) => "a list of types",
    }
}

/// The kind a modeled op's attribute expects, found by trying one sample of each kind.
fn expected_kind(op_type: &str, name: &str) -> Option<&'static str> {
    let samples = [
        Attr::Int(0),
        Attr::Float(0.0),
        Attr::String(String::new()),
        Attr::Tensor(Const::from_index(0)),
        Attr::Graph(GraphId::from_index(0)),
        Attr::Type(Type::Unknown),
        Attr::Ints(Vec::new()),
        Attr::Floats(Vec::new()),
        Attr::Strings(Vec::new()),
        Attr::Tensors(Vec::new()),
        Attr::Graphs(Vec::new()),
        Attr::Types(Vec::new()),
    ];
    samples.into_iter().find_map(|a| {
        let kind = attr_kind(&a);
        (!Op::from_parts("", op_type, vec![(name.to_owned(), a)]).is_custom()).then_some(kind)
    })
}

/// A parsed attribute with the spans of its name and value.
struct ParsedAttr {
    name: String,
    name_span: Range<usize>,
    value: Attr,
    value_span: Range<usize>,
}

struct Parser<'a> {
    toks: Vec<Token>,
    pos: usize,
    errors: Vec<ParseError>,
    opts: &'a ParseOptions,
    m: Module,
    spans: SpanMap,
    /// Symbols declared with `sym`, with the span of the declaration's name.
    declared_syms: HashMap<String, Range<usize>>,
    consts: HashMap<RefName, (Const, Range<usize>)>,
    /// Value scopes, innermost last: the graph being parsed and the graphs enclosing it.
    scopes: Vec<HashMap<RefName, (Value, Range<usize>)>>,
    /// Names whose definition failed to parse: uses are not reported again.
    poisoned: HashSet<RefName>,
    /// Results of the statements being parsed (innermost last): a use of one is a value used
    /// in its own definition.
    defining: Vec<RefName>,
    entries: HashMap<RefName, (GraphId, Range<usize>)>,
    links: Vec<PendingLink>,
    files: HashMap<String, Arc<ExternalFile>>,
    depth: usize,
}

struct PendingLink {
    from: (RefName, Range<usize>, u32),
    to: (RefName, Range<usize>, u32),
}

impl Parser<'_> {
    // ---- token helpers ----

    fn tok(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn peek_tok(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].tok
    }

    fn span(&self) -> Range<usize> {
        self.toks[self.pos.min(self.toks.len() - 1)].span.clone()
    }

    fn prev_end(&self) -> usize {
        if self.pos == 0 {
            0
        } else {
            self.toks[(self.pos - 1).min(self.toks.len() - 1)].span.end
        }
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos.min(self.toks.len() - 1)].clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn at_punct(&self, c: char) -> bool {
        *self.tok() == Tok::Punct(c)
    }

    fn at_ident(&self, s: &str) -> bool {
        matches!(self.tok(), Tok::Ident(i) if i == s)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.at_punct(c) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn describe(tok: &Tok) -> String {
        match tok {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Int(_) => "an integer".to_owned(),
            Tok::Float(_) => "a float".to_owned(),
            Tok::Str(_) => "a string".to_owned(),
            Tok::Value(r) => format!("`{}`", ref_text('%', r)),
            Tok::Const(r) => format!("`{}`", ref_text('$', r)),
            Tok::Graph(r) => format!("`{}`", ref_text('@', r)),
            Tok::Arrow => "`->`".to_owned(),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "end of input".to_owned(),
        }
    }

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) -> Reported {
        self.errors.push(ParseError::new(span, message));
        Reported
    }

    fn push_error(&mut self, e: ParseError) -> Reported {
        self.errors.push(e);
        Reported
    }

    fn unexpected(&mut self, what: &str) -> Reported {
        let found = Self::describe(self.tok());
        let span = self.span();
        self.error(span, format!("expected {what}, found {found}"))
    }

    fn expect_punct(&mut self, c: char) -> PResult<Range<usize>> {
        if self.at_punct(c) {
            Ok(self.bump().span)
        } else {
            Err(self.unexpected(&format!("`{c}`")))
        }
    }

    fn expect_ident(&mut self, s: &str) -> PResult<Range<usize>> {
        if self.at_ident(s) {
            Ok(self.bump().span)
        } else {
            Err(self.unexpected(&format!("`{s}`")))
        }
    }

    fn string(&mut self, what: &str) -> PResult<(String, Range<usize>)> {
        match self.tok().clone() {
            Tok::Str(b) => {
                let span = self.bump().span;
                match String::from_utf8(b) {
                    Ok(s) => Ok((s, span)),
                    Err(_) => Err(self.error(span, format!("{what} must be valid UTF-8"))),
                }
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// A bare or quoted name.
    fn name(&mut self, what: &str) -> PResult<(String, Range<usize>)> {
        match self.tok().clone() {
            Tok::Ident(s) => Ok((s, self.bump().span)),
            Tok::Str(_) => self.string(what),
            _ => Err(self.unexpected(what)),
        }
    }

    /// An integer literal with an optional `-`, in `i64`.
    fn int(&mut self, what: &str) -> PResult<(i64, Range<usize>)> {
        let start = self.span().start;
        let neg = self.eat_punct('-');
        match *self.tok() {
            Tok::Int(n) => {
                let end = self.bump().span.end;
                let v = if neg { -(n as i128) } else { n as i128 };
                match i64::try_from(v) {
                    Ok(v) => Ok((v, start..end)),
                    Err(_) => Err(self.error(start..end, "integer does not fit in 64 bits")),
                }
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn enter(&mut self) -> PResult<()> {
        if self.depth >= MAX_DEPTH {
            let span = self.span();
            return Err(self.error(span, format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        Ok(())
    }

    /// Skips from token `start` to the next line that starts at bracket depth 0 (for a
    /// top-level item: the next line starting with an item keyword), without consuming a
    /// closing brace that ends the enclosing graph body.
    fn recover(&mut self, start: usize, top: bool) {
        self.pos = start;
        let mut depth = 0usize;
        let mut first = true;
        loop {
            let t = &self.toks[self.pos.min(self.toks.len() - 1)];
            if t.tok == Tok::Eof {
                return;
            }
            if !first && depth == 0 && t.line_start {
                let item = matches!(&t.tok, Tok::Ident(k)
                    if matches!(k.as_str(), "sym" | "assume" | "const" | "tensor" | "graph" | "link"));
                if !top || item {
                    return;
                }
            }
            match t.tok {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(c @ (')' | ']' | '}')) => {
                    if depth == 0 {
                        if !top && c == '}' && !first {
                            return;
                        }
                    } else {
                        depth -= 1;
                    }
                }
                _ => {}
            }
            first = false;
            self.bump();
        }
    }

    // ---- module ----

    fn module(&mut self) {
        loop {
            let start = self.pos;
            let r = match self.tok() {
                Tok::Eof => break,
                Tok::Ident(k) if k == "sym" => self.sym_decl(),
                Tok::Ident(k) if k == "assume" => self.assume_decl(),
                Tok::Ident(k) if k == "const" || k == "tensor" => self.const_decl(),
                Tok::Ident(k) if k == "graph" => self.top_graph(),
                Tok::Ident(k) if k == "link" => self.link(),
                _ => Err(self.unexpected("`sym`, `assume`, `const`, `tensor`, `graph` or `link`")),
            };
            if r.is_err() {
                self.recover(start, true);
            }
        }
        self.resolve_links();
    }

    fn sym_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.name("a symbol name")?;
        let (mut min, mut max) = (None, None);
        if self.at_ident("in") {
            self.bump();
            self.expect_punct('[')?;
            min = self.bound()?;
            self.expect_punct(',')?;
            max = self.bound()?;
            self.expect_punct(']')?;
        }
        if let Some(first) = self.declared_syms.get(&name) {
            let e = ParseError::new(span, format!("symbol `{name}` is declared twice"))
                .label(first.clone(), "first declared here");
            return Err(self.push_error(e));
        }
        let s = self.m.symbol(&name);
        self.m.symbols[s].min = min;
        self.m.symbols[s].max = max;
        self.declared_syms.insert(name, span.clone());
        self.spans.insert(Entity::Sym(s), span);
        Ok(())
    }

    /// `assume NAME = EXPR`: the declared symbol `NAME` equals `EXPR`, an expression over other
    /// declared symbols that do not stand for expressions themselves.
    fn assume_decl(&mut self) -> PResult<()> {
        self.bump();
        let (name, span) = self.name("a symbol name")?;
        let Some(s) = self
            .m
            .find_symbol(&name)
            .filter(|_| self.declared_syms.contains_key(&name))
        else {
            let e = ParseError::new(span, format!("`assume` names undeclared symbol `{name}`"));
            return Err(self.push_error(e));
        };
        self.expect_punct('=')?;
        let start = self.span().start;
        let e = self.dim_expr()?;
        let at = start..self.prev_end();
        if self.m.symbols[s].equals.is_some() {
            let e = ParseError::new(span, format!("symbol `{name}` is assumed equal twice"));
            return Err(self.push_error(e));
        }
        let mut mentioned = Vec::new();
        e.symbols(&mut mentioned);
        for x in mentioned {
            let xname = self.m.symbols[x].name.clone();
            let problem = if x == s {
                Some(format!(
                    "`{name}` cannot be assumed equal to an expression of itself"
                ))
            } else if !self.declared_syms.contains_key(&xname) {
                Some(format!("symbol `{xname}` is not declared"))
            } else if self.m.symbols[x].equals.is_some() {
                Some(format!(
                    "`{xname}` stands for an expression itself; write that expression instead"
                ))
            } else {
                None
            };
            if let Some(msg) = problem {
                return Err(self.push_error(ParseError::new(at, msg)));
            }
        }
        if self.m.symbols.iter().any(|(_, d)| {
            let mut v = Vec::new();
            if let Some(x) = &d.equals {
                x.symbols(&mut v);
            }
            v.contains(&s)
        }) {
            let msg = format!("`{name}` appears in an earlier `assume`; assume it first");
            return Err(self.push_error(ParseError::new(span, msg)));
        }
        self.m.symbols[s].equals = Some(e);
        Ok(())
    }

    fn bound(&mut self) -> PResult<Option<i64>> {
        if self.eat_punct('?') {
            return Ok(None);
        }
        Ok(Some(self.int("an integer bound or `?`")?.0))
    }

    fn const_decl(&mut self) -> PResult<()> {
        let kw = self.bump();
        let with_value = matches!(&kw.tok, Tok::Ident(k) if k == "const");
        let (key, span) = match self.tok().clone() {
            Tok::Const(r) => (r, self.bump().span),
            _ => return Err(self.unexpected("a constant name such as `$w`")),
        };
        let r = self.const_rest(&key, span.clone(), with_value);
        if r.is_err() {
            self.poisoned.insert(key);
        }
        r
    }

    fn const_rest(&mut self, key: &RefName, span: Range<usize>, with_value: bool) -> PResult<()> {
        self.expect_punct(':')?;
        let dtype = self.dtype()?;
        self.expect_punct('[')?;
        let mut shape = Vec::new();
        if !self.at_punct(']') {
            loop {
                let (d, dspan) = self.int("a constant dimension")?;
                if d < 0 {
                    return Err(self.error(dspan, "a constant's dimensions must not be negative"));
                }
                shape.push(d);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(']')?;
        self.expect_punct('=')?;
        let data = self.const_body(key, dtype, shape)?;
        if let Some((_, first)) = self.consts.get(key) {
            let e = ParseError::new(
                span,
                format!("constant `{}` is defined twice", ref_text('$', key)),
            )
            .label(first.clone(), "first defined here");
            return Err(self.push_error(e));
        }
        let c = Const::from_index(self.m.consts.len());
        if with_value {
            let v = self.m.add_const(data);
            self.spans.insert(Entity::Value(v), span.clone());
        } else {
            self.m.add_attr_const(data);
        }
        self.spans.insert(Entity::Const(c), span.clone());
        self.consts.insert(key.clone(), (c, span));
        Ok(())
    }

    fn dtype(&mut self) -> PResult<DType> {
        match self.tok().clone() {
            Tok::Ident(s) => {
                let span = self.bump().span;
                match s.parse::<DType>() {
                    Ok(d) => Ok(d),
                    Err(()) => {
                        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                        let e = ParseError::new(span.clone(), format!("unknown dtype `{s}`"))
                            .label(span, format!("expected one of: {}", names.join(", ")));
                        Err(self.push_error(e))
                    }
                }
            }
            _ => Err(self.unexpected("a dtype such as `f32`")),
        }
    }

    fn const_body(&mut self, key: &RefName, dtype: DType, shape: Vec<i64>) -> PResult<ConstData> {
        let name = ref_source_name(key);
        let n: usize = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .unwrap_or(usize::MAX);
        let (kw, kspan) = self.name("`dense`, `bytes`, `hash` or `external`")?;
        match kw.as_str() {
            "dense" => {
                self.expect_punct('<')?;
                let open = self.expect_punct('[')?;
                let storage = self.dense_elems(dtype)?;
                let close = self.expect_punct(']')?;
                self.expect_punct('>')?;
                let count = match &storage {
                    Storage::Strings(v) => v.len(),
                    Storage::Inline(b) => b.len() / dtype.bits().div_ceil(8).max(1),
                    _ => 0,
                };
                if count != n {
                    return Err(self.error(
                        open.start..close.end,
                        format!("expected {n} elements for the shape, found {count}"),
                    ));
                }
                Ok(ConstData::new(name, dtype, shape, storage))
            }
            "bytes" => {
                self.pos -= 1;
                let bytes = self.bytes_lit()?;
                Ok(ConstData::new(
                    name,
                    dtype,
                    shape,
                    Storage::Inline(Bytes::from(bytes)),
                ))
            }
            "hash" => {
                self.expect_punct('(')?;
                let h = self.hash_string()?;
                self.expect_punct(')')?;
                Ok(ConstData::new(name, dtype, shape, Storage::Absent).with_hash(h))
            }
            "external" => self.external(name, dtype, shape),
            _ => Err(self.error(
                kspan,
                format!("expected `dense`, `bytes`, `hash` or `external`, found `{kw}`"),
            )),
        }
    }

    /// `bytes<"hex">`.
    fn bytes_lit(&mut self) -> PResult<Vec<u8>> {
        self.expect_ident("bytes")?;
        self.expect_punct('<')?;
        let (hex, span) = self.string("a string of hex digits")?;
        self.expect_punct('>')?;
        decode_hex(&hex).ok_or_else(|| self.error(span, "expected an even number of hex digits"))
    }

    fn hash_string(&mut self) -> PResult<u64> {
        let (h, span) = self.string("a content hash in hex")?;
        if h.is_empty() || h.len() > 16 {
            return Err(self.error(span, "a content hash has 1 to 16 hex digits"));
        }
        u64::from_str_radix(&h, 16).map_err(|_| self.error(span, "a content hash is hex digits"))
    }

    fn external(
        &mut self,
        name: Option<String>,
        dtype: DType,
        shape: Vec<i64>,
    ) -> PResult<ConstData> {
        self.expect_punct('(')?;
        let (location, lspan) = self.string("the data file name")?;
        let (mut offset, mut length, mut hash) = (None, None, None);
        while self.eat_punct(',') {
            let (field, fspan) = self.name("`offset`, `length` or `hash`")?;
            self.expect_punct('=')?;
            match field.as_str() {
                "offset" => offset = Some(self.int("a byte offset")?),
                "length" => length = Some(self.int("a byte length")?),
                "hash" => hash = Some(self.hash_string()?),
                _ => {
                    return Err(self.error(
                        fspan,
                        format!("unknown field `{field}` (expected `offset`, `length` or `hash`)"),
                    ));
                }
            }
        }
        let close = self.expect_punct(')')?;
        let (Some((offset, ospan)), Some((len, _))) = (offset, length) else {
            return Err(self.error(
                lspan.start..close.end,
                "`external` needs `offset = N` and `length = N`",
            ));
        };
        if offset < 0 || len < 0 {
            return Err(self.error(ospan, "offset and length must not be negative"));
        }
        let (offset, len) = (offset as u64, len as u64);
        let Some(dir) = self.opts.data_dir.clone() else {
            let Some(h) = hash else {
                return Err(self.error(
                    lspan.start..close.end,
                    "`external` needs `hash = \"...\"` when no data directory is given",
                ));
            };
            return Ok(ConstData::new(name, dtype, shape, Storage::Absent).with_hash(h));
        };
        let file = match self.files.get(&location) {
            Some(f) => f.clone(),
            None => match ExternalFile::open_contained(&dir, &location) {
                Ok(f) => {
                    let f = Arc::new(f);
                    self.files.insert(location.clone(), f.clone());
                    f
                }
                Err(e) => {
                    let path = dir.join(&location);
                    return Err(self.error(
                        lspan,
                        format!("cannot open external data `{}`: {e}", path.display()),
                    ));
                }
            },
        };
        if offset.checked_add(len).is_none_or(|end| end > file.len()) {
            return Err(self.error(
                lspan.start..close.end,
                format!(
                    "bytes {offset}..{} are outside `{location}` ({} bytes)",
                    offset.saturating_add(len),
                    file.len()
                ),
            ));
        }
        let data = ConstData::new(name, dtype, shape, Storage::External { file, offset, len });
        // The stated hash must be the bytes' own: a swapped or edited data file is an error, not
        // a constant that claims another's identity.
        if let Some(h) = hash
            && data.content_hash() != h
        {
            return Err(self.error(
                lspan.start..close.end,
                format!(
                    "bytes {offset}..{} of `{location}` hash to {}, not the stated {h:012x} (the \
                     data file changed since the text was written)",
                    offset + len,
                    data.short_hash()
                ),
            ));
        }
        Ok(data)
    }

    /// The elements of `dense<[...]>`, as storage.
    fn dense_elems(&mut self, dtype: DType) -> PResult<Storage> {
        let mut bytes = Vec::new();
        let mut strings = Vec::new();
        if self.at_punct(']') {
            return Ok(if dtype == DType::String {
                Storage::Strings(Vec::new())
            } else {
                Storage::Inline(Bytes::new())
            });
        }
        loop {
            match dtype {
                DType::String => match self.tok().clone() {
                    Tok::Str(b) => {
                        self.bump();
                        strings.push(Bytes::from(b));
                    }
                    _ => return Err(self.unexpected("a string element")),
                },
                DType::F32 => {
                    let s = self.span().start;
                    let x = self.float_lit()?.to_f32();
                    let x = x.ok_or_else(|| self.error(s..self.prev_end(), "not a valid f32"))?;
                    bytes.extend_from_slice(&x.to_le_bytes());
                }
                DType::F64 => {
                    let s = self.span().start;
                    let x = self.float_lit()?.to_f64();
                    let x = x.ok_or_else(|| self.error(s..self.prev_end(), "not a valid f64"))?;
                    bytes.extend_from_slice(&x.to_le_bytes());
                }
                DType::Bool => {
                    let v = if self.at_ident("true") {
                        self.bump();
                        1
                    } else if self.at_ident("false") {
                        self.bump();
                        0
                    } else {
                        let (v, span) = self.int("`true` or `false`")?;
                        if !(0..=1).contains(&v) {
                            return Err(self.error(span, "a bool element is `true` or `false`"));
                        }
                        v as u8
                    };
                    bytes.push(v);
                }
                DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64 => {
                    let start = self.span().start;
                    let neg = self.eat_punct('-');
                    let Tok::Int(n) = *self.tok() else {
                        return Err(self.unexpected("an integer element"));
                    };
                    let end = self.bump().span.end;
                    let v: i128 = if neg { -(n as i128) } else { n as i128 };
                    let (lo, hi, width): (i128, i128, usize) = match dtype {
                        DType::I8 => (i8::MIN.into(), i8::MAX.into(), 1),
                        DType::I16 => (i16::MIN.into(), i16::MAX.into(), 2),
                        DType::I32 => (i32::MIN.into(), i32::MAX.into(), 4),
                        DType::I64 => (i64::MIN.into(), i64::MAX.into(), 8),
                        DType::U8 => (0, u8::MAX.into(), 1),
                        DType::U16 => (0, u16::MAX.into(), 2),
                        DType::U32 => (0, u32::MAX.into(), 4),
                        _ => (0, u64::MAX.into(), 8),
                    };
                    if v < lo || v > hi {
                        return Err(
                            self.error(start..end, format!("{v} is out of range for {dtype}"))
                        );
                    }
                    bytes.extend_from_slice(&(v as u64).to_le_bytes()[..width]);
                }
                _ => {
                    let span = self.span();
                    return Err(self.error(
                        span,
                        format!("`dense` has no literal syntax for {dtype}; write `bytes<\"...\">` (little-endian hex)"),
                    ));
                }
            }
            if !self.eat_punct(',') || self.at_punct(']') {
                break;
            }
        }
        Ok(if dtype == DType::String {
            Storage::Strings(strings)
        } else {
            Storage::Inline(Bytes::from(bytes))
        })
    }

    /// A float literal: a number, `inf`, `NaN`, or `nan(0x...)` (bits), with an optional `-`.
    fn float_lit(&mut self) -> PResult<FloatLit> {
        let start = self.span().start;
        let neg = self.eat_punct('-');
        let lit = match self.tok().clone() {
            Tok::Float(s) => {
                self.bump();
                FloatLit::Text(s)
            }
            Tok::Int(n) => {
                self.bump();
                FloatLit::Text(n.to_string())
            }
            Tok::Ident(s) if s == "inf" => {
                self.bump();
                FloatLit::Text(s)
            }
            Tok::Ident(s) if s == "NaN" => {
                self.bump();
                FloatLit::Text(s)
            }
            Tok::Ident(s) if s == "nan" => {
                self.bump();
                self.expect_punct('(')?;
                let Tok::Int(bits) = *self.tok() else {
                    return Err(self.unexpected("the NaN's bits in hex"));
                };
                self.bump();
                let close = self.expect_punct(')')?;
                if bits > u128::from(u64::MAX) {
                    return Err(self.error(start..close.end, "NaN bits do not fit in 64 bits"));
                }
                FloatLit::Bits(bits as u64, false)
            }
            _ => return Err(self.unexpected("a float")),
        };
        Ok(match (neg, lit) {
            (true, FloatLit::Text(s)) => FloatLit::Text(format!("-{s}")),
            (true, FloatLit::Bits(b, _)) => FloatLit::Bits(b, true),
            (false, l) => l,
        })
    }

    // ---- types and dims ----

    fn ty(&mut self) -> PResult<Type> {
        self.enter()?;
        let r = self.ty_inner();
        self.depth -= 1;
        r
    }

    fn ty_inner(&mut self) -> PResult<Type> {
        let wrapper = match self.tok() {
            Tok::Ident(k) if k == "unknown" => {
                self.bump();
                return Ok(Type::Unknown);
            }
            Tok::Ident(k)
                if matches!(k.as_str(), "seq" | "opt" | "map" | "sparse")
                    && *self.peek_tok(1) == Tok::Punct('<') =>
            {
                k.clone()
            }
            _ => return Ok(Type::Tensor(self.tensor_type()?)),
        };
        self.bump();
        self.expect_punct('<')?;
        let t = match wrapper.as_str() {
            "seq" => Type::Sequence(Box::new(self.ty()?)),
            "opt" => Type::Optional(Box::new(self.ty()?)),
            "sparse" => Type::SparseTensor(self.tensor_type()?),
            _ => {
                let k = self.dtype()?;
                self.expect_punct(',')?;
                Type::Map(k, Box::new(self.ty()?))
            }
        };
        self.expect_punct('>')?;
        Ok(t)
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let dtype = if self.eat_punct('?') {
            None
        } else if matches!(self.tok(), Tok::Ident(_)) {
            Some(self.dtype()?)
        } else {
            return Err(self.unexpected("a type such as `f32[2, 3]`"));
        };
        self.expect_punct('[')?;
        if self.eat_punct('*') {
            self.expect_punct(']')?;
            return Ok(TensorType { dtype, shape: None });
        }
        let mut dims = Vec::new();
        if !self.at_punct(']') {
            loop {
                dims.push(self.dim()?);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(']')?;
        Ok(TensorType {
            dtype,
            shape: Some(dims),
        })
    }

    fn dim(&mut self) -> PResult<Dim> {
        if self.eat_punct('?') {
            return Ok(Dim::Unknown);
        }
        Ok(Dim::Expr(self.dim_expr()?))
    }

    /// `["-"] term (("+" | "-") term)*`; a leading `-` negates the whole first term, so the
    /// printed `-x / 2` reads back as `-(x / 2)`.
    fn dim_expr(&mut self) -> PResult<DimExpr> {
        self.enter()?;
        let r = self.dim_expr_inner();
        self.depth -= 1;
        r
    }

    fn dim_expr_inner(&mut self) -> PResult<DimExpr> {
        let start = self.span().start;
        let mut acc = if self.at_punct('-') {
            if matches!(self.peek_tok(1), Tok::Int(_)) {
                // A negative literal (keeps `-9223372036854775808` representable).
                let (v, _) = self.int("an integer")?;
                self.dim_term_rest(DimExpr::constant(v), start)?
            } else {
                self.bump();
                let t = self.dim_term()?.scale(-1);
                self.checked_dim(t, start)?
            }
        } else {
            self.dim_term()?
        };
        loop {
            let sum = if self.eat_punct('+') {
                acc.add(&self.dim_term()?)
            } else if self.eat_punct('-') {
                acc.sub(&self.dim_term()?)
            } else {
                return Ok(acc);
            };
            acc = self.checked_dim(sum, start)?;
        }
    }

    /// The result of dim arithmetic from `start` to here; an error where a coefficient
    /// overflowed 64 bits (`n * 9223372036854775807 * 4` would otherwise wrap to `-4 * n`).
    fn checked_dim(&mut self, e: Option<DimExpr>, start: usize) -> PResult<DimExpr> {
        match e {
            Some(e) => Ok(e),
            None => {
                let span = start..self.prev_end();
                Err(self.error(span, "this dim expression overflows 64 bits"))
            }
        }
    }

    fn dim_term(&mut self) -> PResult<DimExpr> {
        let start = self.span().start;
        let f = self.dim_factor()?;
        self.dim_term_rest(f, start)
    }

    /// The rest of a term whose first factor, `acc`, began at `start`.
    fn dim_term_rest(&mut self, mut acc: DimExpr, start: usize) -> PResult<DimExpr> {
        loop {
            if self.eat_punct('*') {
                let product = acc.mul(&self.dim_factor()?);
                acc = self.checked_dim(product, start)?;
            } else if self.at_punct('/') {
                self.bump();
                let start = self.span().start;
                let rhs = self.dim_factor()?;
                let span = start..self.prev_end();
                // Reported without stopping: the expression keeps its left operand.
                match rhs.as_constant().map(|d| acc.floor_div(d)) {
                    Some(Some(e)) => acc = e,
                    Some(None) => {
                        self.error(span, "a dim can only be divided by a positive constant");
                    }
                    None => {
                        self.error(span, "a dim can only be divided by a constant");
                    }
                }
            } else {
                return Ok(acc);
            }
        }
    }

    fn dim_factor(&mut self) -> PResult<DimExpr> {
        match self.tok().clone() {
            Tok::Int(n) => {
                let span = self.bump().span;
                match i64::try_from(n) {
                    Ok(v) => Ok(DimExpr::constant(v)),
                    Err(_) => Err(self.error(span, "integer does not fit in 64 bits")),
                }
            }
            Tok::Ident(_) | Tok::Str(_) => {
                let (name, _) = self.name("a symbol")?;
                Ok(DimExpr::sym(self.m.symbol(&name)))
            }
            Tok::Punct('(') => {
                self.bump();
                let e = self.dim_expr()?;
                self.expect_punct(')')?;
                Ok(e)
            }
            _ => Err(self.unexpected("a dim (an integer, a symbol, `?` or an expression)")),
        }
    }

    // ---- graphs ----

    fn top_graph(&mut self) -> PResult<()> {
        let start = self.span().start;
        let (g, key, key_span, model) = self.graph(true)?;
        if let Some((_, first)) = self.entries.get(&key) {
            let e = ParseError::new(
                key_span,
                format!("graph `{}` is defined twice", ref_text('@', &key)),
            )
            .label(first.clone(), "first defined here");
            return Err(self.push_error(e));
        }
        self.entries.insert(key, (g, start..self.prev_end()));
        self.m.entries.push(Entry {
            graph: g,
            model: model.unwrap_or_default(),
        });
        Ok(())
    }

    /// `graph @name(params) -> (types) [doc "..."] [model {...}] { body }`. Scopes are pushed
    /// and popped here, also when an error stops the graph early.
    fn graph(&mut self, top: bool) -> PResult<(GraphId, RefName, Range<usize>, Option<ModelInfo>)> {
        self.enter()?;
        self.scopes.push(HashMap::new());
        let r = self.graph_inner(top);
        self.scopes.pop();
        self.depth -= 1;
        r
    }

    fn graph_inner(
        &mut self,
        top: bool,
    ) -> PResult<(GraphId, RefName, Range<usize>, Option<ModelInfo>)> {
        let kw = self.expect_ident("graph")?;
        let (key, key_span) = match self.tok().clone() {
            Tok::Graph(r) => (r, self.bump().span),
            _ => return Err(self.unexpected("a graph name such as `@main`")),
        };
        let name = match &key {
            RefName::Named(n, _) => n.clone(),
            RefName::Num(n) => n.to_string(),
        };
        let g = self.m.add_graph(&name, None);
        self.spans.insert(Entity::Graph(g), kw.start..key_span.end);
        self.expect_punct('(')?;
        if !self.at_punct(')') {
            loop {
                self.param(g)?;
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(')')?;
        if *self.tok() != Tok::Arrow {
            return Err(self.unexpected("`->` and the output types"));
        }
        self.bump();
        self.expect_punct('(')?;
        let mut out_types = Vec::new();
        if !self.at_punct(')') {
            loop {
                let s = self.span().start;
                let t = self.ty()?;
                out_types.push((t, s..self.prev_end()));
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(')')?;
        let mut model = None;
        loop {
            if self.at_ident("doc") {
                self.bump();
                let (doc, _) = self.string("a documentation string")?;
                self.m.graphs[g].doc = doc;
            } else if self.at_ident("model") {
                let span = self.bump().span;
                if !top {
                    return Err(self.error(span, "only a top-level graph carries `model` facts"));
                }
                model = Some(self.model_info()?);
            } else {
                break;
            }
        }
        self.expect_punct('{')?;
        self.body(g, &out_types)?;
        Ok((g, key, key_span, model))
    }

    fn param(&mut self, g: GraphId) -> PResult<()> {
        let (key, span) = match self.tok().clone() {
            Tok::Value(r) => (r, self.bump().span),
            _ => return Err(self.unexpected("an input such as `%x: f32[3]`")),
        };
        self.expect_punct(':')?;
        let ty = self.ty()?;
        let mut default = None;
        if self.eat_punct('=') {
            let (c, _) = self.const_handle()?;
            default = Some(c);
        }
        let v = self.m.add_input(g, ref_source_name(&key), ty);
        if let ValueDef::Input { default: d, .. } = &mut self.m.values[v].def {
            *d = default;
        }
        self.define(key, v, span)
    }

    fn define(&mut self, key: RefName, v: Value, span: Range<usize>) -> PResult<()> {
        self.spans.insert(Entity::Value(v), span.clone());
        if let Some((_, first)) = self.scopes.iter().rev().find_map(|s| s.get(&key)) {
            let e = ParseError::new(
                span,
                format!("value `{}` is already defined", ref_text('%', &key)),
            )
            .label(first.clone(), "first defined here");
            return Err(self.push_error(e));
        }
        if let Some(s) = self.scopes.last_mut() {
            s.insert(key, (v, span));
        }
        Ok(())
    }

    fn model_info(&mut self) -> PResult<ModelInfo> {
        let mut info = ModelInfo::default();
        self.expect_punct('{')?;
        while !self.at_punct('}') {
            let (field, fspan) = self.name("a model field")?;
            self.expect_punct('=')?;
            match field.as_str() {
                "ir_version" => info.ir_version = self.int("an integer")?.0,
                "model_version" => info.model_version = self.int("an integer")?.0,
                "producer_name" => info.producer_name = self.string("a string")?.0,
                "producer_version" => info.producer_version = self.string("a string")?.0,
                "domain" => info.domain = self.string("a string")?.0,
                "doc" => info.doc = self.string("a string")?.0,
                "source" => info.source = Some(self.string("a path")?.0.into()),
                "functions" => {
                    self.expect_punct('[')?;
                    while !self.at_punct(']') {
                        info.functions.push(Bytes::from(self.bytes_lit()?));
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    self.expect_punct(']')?;
                }
                "opsets" => {
                    self.expect_punct('{')?;
                    while !self.at_punct('}') {
                        let (d, _) = self.string("an opset domain string")?;
                        self.expect_punct('=')?;
                        let (v, _) = self.int("an opset version")?;
                        info.opsets.push((d, v));
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    self.expect_punct('}')?;
                }
                "metadata" => {
                    self.expect_punct('{')?;
                    while !self.at_punct('}') {
                        let (k, _) = self.string("a metadata key string")?;
                        self.expect_punct('=')?;
                        let (v, _) = self.string("a metadata value string")?;
                        info.metadata.push((k, v));
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    self.expect_punct('}')?;
                }
                _ => {
                    return Err(self.error(
                        fspan,
                        format!("unknown model field `{field}` (expected ir_version, opsets, producer_name, producer_version, domain, model_version, doc, metadata, functions or source)"),
                    ));
                }
            }
            if !self.eat_punct(',') {
                break;
            }
        }
        self.expect_punct('}')?;
        Ok(info)
    }

    /// Statements up to and including the closing `}`.
    fn body(&mut self, g: GraphId, out_types: &[(Type, Range<usize>)]) -> PResult<()> {
        let mut returned = false;
        loop {
            let start = self.pos;
            match self.tok() {
                Tok::Punct('}') => {
                    let close = self.bump().span;
                    if !returned && !out_types.is_empty() {
                        return Err(self.error(close, "graph body ends without `return`"));
                    }
                    return Ok(());
                }
                Tok::Eof => {
                    let span = self.span();
                    return Err(self.error(span, "unterminated graph body: expected `}`"));
                }
                Tok::Ident(k) if k == "return" => {
                    let kw = self.bump().span;
                    if returned {
                        self.error(kw.clone(), "a graph has only one `return`");
                    }
                    returned = true;
                    if self.ret(g, kw, out_types).is_err() {
                        self.recover(start, false);
                    }
                }
                _ => {
                    if self.statement(g).is_err() {
                        self.recover(start, false);
                    }
                }
            }
        }
    }

    fn ret(
        &mut self,
        g: GraphId,
        kw: Range<usize>,
        out_types: &[(Type, Range<usize>)],
    ) -> PResult<()> {
        let mut outs = Vec::new();
        if !self.at_punct('}') && !self.toks[self.pos.min(self.toks.len() - 1)].line_start {
            loop {
                let span = self.span();
                let v = self.operand_value()?;
                outs.push((v, span));
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        if outs.len() != out_types.len() {
            let end = self.prev_end();
            return Err(self.error(
                kw.start..end,
                format!(
                    "the signature declares {} outputs, `return` gives {}",
                    out_types.len(),
                    outs.len()
                ),
            ));
        }
        for ((v, span), (t, tspan)) in outs.iter().zip(out_types) {
            let actual = self.m.value_type(*v).clone();
            if actual != *t {
                let e = ParseError::new(
                    span.clone(),
                    "returned value's type differs from the signature".to_owned(),
                )
                .label(tspan.clone(), "declared here");
                self.push_error(e);
            }
        }
        self.m.graphs[g].outputs = outs.into_iter().map(|(v, _)| v).collect();
        Ok(())
    }

    fn const_handle(&mut self) -> PResult<(Const, Range<usize>)> {
        let Tok::Const(key) = self.tok().clone() else {
            return Err(self.unexpected("a constant such as `$w`"));
        };
        let span = self.bump().span;
        match self.consts.get(&key) {
            Some(&(c, _)) => Ok((c, span)),
            None if self.poisoned.contains(&key) => Err(Reported),
            None => Err(self.error(span, format!("unknown constant `{}`", ref_text('$', &key)))),
        }
    }

    /// `%v` or `$c` (the constant's value).
    fn operand_value(&mut self) -> PResult<Value> {
        match self.tok().clone() {
            Tok::Value(key) => {
                let span = self.bump().span;
                if let Some(&(v, _)) = self.scopes.iter().rev().find_map(|s| s.get(&key)) {
                    return Ok(v);
                }
                if self.defining.contains(&key) {
                    return Err(self.error(
                        span,
                        format!("`{}` is used in its own definition", ref_text('%', &key)),
                    ));
                }
                if self.poisoned.contains(&key) {
                    return Err(Reported);
                }
                Err(self.error(span, format!("unknown value `{}`", ref_text('%', &key))))
            }
            Tok::Const(_) => {
                let (c, span) = self.const_handle()?;
                match self.m.const_value(c) {
                    Some(v) => Ok(v),
                    None => Err(self.error(
                        span,
                        "this constant is declared with `tensor` (attributes only) and is not a value; declare it with `const`",
                    )),
                }
            }
            _ => Err(self.unexpected("a value such as `%x` or `$w`")),
        }
    }

    fn statement(&mut self, g: GraphId) -> PResult<()> {
        let depth = self.defining.len();
        let result = self.statement_inner(g);
        self.defining.truncate(depth);
        result
    }

    fn statement_inner(&mut self, g: GraphId) -> PResult<()> {
        let start = self.span().start;
        // Results.
        let mut results: Vec<Option<(RefName, Range<usize>)>> = Vec::new();
        let has_results = match self.tok() {
            Tok::Value(_) => true,
            Tok::Ident(k) if k == "_" => matches!(self.peek_tok(1), Tok::Punct(',' | '=')),
            _ => false,
        };
        if has_results {
            loop {
                match self.tok().clone() {
                    Tok::Value(r) => {
                        let span = self.bump().span;
                        results.push(Some((r, span)));
                    }
                    Tok::Ident(k) if k == "_" => {
                        self.bump();
                        results.push(None);
                    }
                    _ => return Err(self.unexpected("a result such as `%y` or `_`")),
                }
                if !self.eat_punct(',') {
                    break;
                }
            }
            for (r, _) in results.iter().flatten() {
                self.poisoned.insert(r.clone());
                self.defining.push(r.clone());
            }
            self.expect_punct('=')?;
        }
        // Op.
        let custom = match self.tok().clone() {
            Tok::Str(_) => {
                let (domain, _) = self.string("an op domain")?;
                self.expect_punct('.')?;
                let (op_type, _) = self.name("an op type")?;
                Some((domain, op_type))
            }
            Tok::Ident(_) => None,
            _ => {
                return Err(self.unexpected("an op such as `Add` or `\"com.microsoft\".Attention`"));
            }
        };
        let modeled = if custom.is_none() {
            let Tok::Ident(name) = self.tok().clone() else {
                return Err(self.unexpected("an op"));
            };
            let span = self.bump().span;
            if Op::attr_names("", &name).is_none() {
                let e = ParseError::new(span.clone(), format!("unknown op `{name}`")).label(
                    span,
                    format!("an op outside the modeled set is written with its domain, as in `\"\".{}` or `\"com.microsoft\".{}`", super::lexer::name_text(&name), super::lexer::name_text(&name)),
                );
                return Err(self.push_error(e));
            }
            Some((name, span))
        } else {
            None
        };
        // Operands.
        self.expect_punct('(')?;
        let mut inputs = Vec::new();
        let mut failed = false;
        if !self.at_punct(')') {
            loop {
                if self.at_ident("_") {
                    self.bump();
                    inputs.push(None);
                } else {
                    match self.operand_value() {
                        Ok(v) => inputs.push(Some(v)),
                        Err(Reported) => {
                            failed = true;
                            inputs.push(None);
                        }
                    }
                }
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(')')?;
        let node_span = start..self.prev_end();
        // Attributes.
        let attrs = if self.at_punct('{') {
            self.attrs()?
        } else {
            Vec::new()
        };
        // Result types.
        let mut types = Vec::new();
        let types_start = self.span().start;
        if self.eat_punct(':') {
            loop {
                types.push(self.ty()?);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        let present = results.iter().flatten().count();
        if types.len() != present {
            let span = types_start..self.prev_end().max(types_start);
            return Err(self.error(
                span,
                format!(
                    "{present} result(s) need {present} type(s) after `:`, found {}",
                    types.len()
                ),
            ));
        }
        // Source name.
        let mut name = None;
        if self.at_ident("loc") {
            self.bump();
            self.expect_punct('(')?;
            name = Some(self.string("a node name")?.0);
            self.expect_punct(')')?;
        }
        if !self.toks[self.pos.min(self.toks.len() - 1)].line_start && !self.at_punct('}') {
            return Err(self.unexpected("the end of the statement"));
        }
        // Build the op.
        let subgraphs: Vec<GraphId> = attrs
            .iter()
            .flat_map(|a| a.value.graphs().to_vec())
            .collect();
        let op = match (custom, modeled) {
            // Typed where the op table models the op and the attributes fit, as on import.
            (Some((domain, op_type)), _) => Op::from_parts(
                &domain,
                &op_type,
                attrs.into_iter().map(|a| (a.name, a.value)).collect(),
            ),
            (None, Some((op_type, span))) => self.modeled_op(&op_type, span, attrs)?,
            (None, None) => return Err(Reported),
        };
        if failed {
            return Err(Reported);
        }
        let mut types = types.into_iter();
        let outputs = results
            .iter()
            .map(|r| {
                r.as_ref()
                    .map(|(k, _)| (ref_source_name(k), types.next().unwrap_or(Type::Unknown)))
            })
            .collect();
        let node = self.m.add_node(g, op, inputs, outputs, name);
        self.spans.insert(Entity::Node(node), node_span);
        for sg in subgraphs {
            self.m.graphs[sg].parent = Some(node);
        }
        let outs = self.m.nodes[node].outputs.clone();
        let mut ok = true;
        for (r, v) in results.into_iter().zip(outs) {
            if let (Some((key, span)), Some(v)) = (r, v) {
                self.poisoned.remove(&key);
                ok &= self.define(key, v, span).is_ok();
            }
        }
        if ok { Ok(()) } else { Err(Reported) }
    }

    fn modeled_op(
        &mut self,
        op_type: &str,
        op_span: Range<usize>,
        attrs: Vec<ParsedAttr>,
    ) -> PResult<Op> {
        let valid = Op::attr_names("", op_type).unwrap_or(&[]);
        let mut reported = false;
        let mut seen: HashMap<&str, Range<usize>> = HashMap::new();
        for a in &attrs {
            if let Some(first) = seen.get(a.name.as_str()) {
                let e = ParseError::new(
                    a.name_span.clone(),
                    format!("attribute `{}` is given twice", a.name),
                )
                .label(first.clone(), "first given here");
                self.push_error(e);
                reported = true;
                continue;
            }
            seen.insert(&a.name, a.name_span.clone());
            if !valid.contains(&a.name.as_str()) {
                let hint = if valid.is_empty() {
                    format!("`{op_type}` takes no attributes")
                } else {
                    format!("`{op_type}` takes: {}", valid.join(", "))
                };
                let e = ParseError::new(
                    a.name_span.clone(),
                    format!("unknown attribute `{}` for `{op_type}`", a.name),
                )
                .label(op_span.clone(), hint);
                self.push_error(e);
                reported = true;
            } else if let Some(kind) = expected_kind(op_type, &a.name)
                && Op::from_parts("", op_type, vec![(a.name.clone(), a.value.clone())]).is_custom()
            {
                let e = ParseError::new(
                    a.value_span.clone(),
                    format!(
                        "attribute `{}` of `{op_type}` must be {kind}, found {}",
                        a.name,
                        attr_kind(&a.value)
                    ),
                );
                self.push_error(e);
                reported = true;
            }
        }
        if reported {
            return Err(Reported);
        }
        let op = Op::from_parts(
            "",
            op_type,
            attrs.into_iter().map(|a| (a.name, a.value)).collect(),
        );
        if op.is_custom() {
            return Err(self.error(op_span, format!("the attributes do not fit `{op_type}`")));
        }
        Ok(op)
    }

    fn attrs(&mut self) -> PResult<Vec<ParsedAttr>> {
        self.expect_punct('{')?;
        let mut out = Vec::new();
        while !self.at_punct('}') {
            let (name, name_span) = self.name("an attribute name")?;
            self.expect_punct('=')?;
            let vs = self.span().start;
            let value = self.attr_value()?;
            out.push(ParsedAttr {
                name,
                name_span,
                value,
                value_span: vs..self.prev_end(),
            });
            if !self.eat_punct(',') {
                break;
            }
        }
        self.expect_punct('}')?;
        Ok(out)
    }

    fn is_float_start(&self) -> bool {
        let t = if self.at_punct('-') {
            self.peek_tok(1)
        } else {
            self.tok()
        };
        match t {
            Tok::Float(_) => true,
            Tok::Ident(s) => s == "inf" || s == "NaN" || s == "nan",
            _ => false,
        }
    }

    fn attr_value(&mut self) -> PResult<Attr> {
        match self.tok().clone() {
            Tok::Punct('-') | Tok::Int(_) | Tok::Float(_) => self.scalar_number(),
            Tok::Ident(s) if s == "inf" || s == "NaN" || s == "nan" => self.scalar_number(),
            Tok::Str(_) => Ok(Attr::String(self.string("a string")?.0)),
            Tok::Const(_) => Ok(Attr::Tensor(self.const_handle()?.0)),
            Tok::Ident(s) if s == "graph" => Ok(Attr::Graph(self.graph(false)?.0)),
            Tok::Ident(s) if s == "type" => Ok(Attr::Type(self.type_attr()?)),
            Tok::Punct('[') => self.list(None),
            Tok::Ident(s)
                if matches!(
                    s.as_str(),
                    "ints" | "floats" | "strings" | "tensors" | "graphs" | "types"
                ) && *self.peek_tok(1) == Tok::Punct('[') =>
            {
                self.bump();
                self.list(Some(s))
            }
            _ => Err(self.unexpected("an attribute value")),
        }
    }

    fn scalar_number(&mut self) -> PResult<Attr> {
        if self.is_float_start() {
            let start = self.span().start;
            let lit = self.float_lit()?;
            return lit
                .to_f32()
                .map(Attr::Float)
                .ok_or_else(|| self.error(start..self.prev_end(), "not a valid float"));
        }
        Ok(Attr::Int(self.int("a number")?.0))
    }

    fn type_attr(&mut self) -> PResult<Type> {
        self.expect_ident("type")?;
        self.expect_punct('<')?;
        let t = self.ty()?;
        self.expect_punct('>')?;
        Ok(t)
    }

    /// `[...]` list; the kind comes from the prefix or the first element (ints become floats
    /// when any element is a float).
    fn list(&mut self, kind: Option<String>) -> PResult<Attr> {
        let open = self.expect_punct('[')?;
        enum Item {
            Int(i64),
            Float(f32),
            Str(String),
            Tensor(Const),
            Graph(GraphId),
            Type(Type),
        }
        let mut items = Vec::new();
        while !self.at_punct(']') {
            let s = self.span().start;
            let item = match self.tok().clone() {
                Tok::Str(_) => Item::Str(self.string("a string")?.0),
                Tok::Const(_) => Item::Tensor(self.const_handle()?.0),
                Tok::Ident(k) if k == "graph" => Item::Graph(self.graph(false)?.0),
                Tok::Ident(k) if k == "type" => Item::Type(self.type_attr()?),
                _ if self.is_float_start() => {
                    let lit = self.float_lit()?;
                    match lit.to_f32() {
                        Some(x) => Item::Float(x),
                        None => return Err(self.error(s..self.prev_end(), "not a valid float")),
                    }
                }
                Tok::Int(_) | Tok::Punct('-') => Item::Int(self.int("a number")?.0),
                _ => return Err(self.unexpected("a list element")),
            };
            items.push((item, s..self.prev_end()));
            if !self.eat_punct(',') {
                break;
            }
        }
        let close = self.expect_punct(']')?;
        let kind = kind.unwrap_or_else(|| {
            match items
                .iter()
                .find(|(i, _)| !matches!(i, Item::Int(_)))
                .or(items.first())
            {
                Some((Item::Int(_), _)) => "ints",
                Some((Item::Float(_), _)) => "floats",
                Some((Item::Str(_), _)) => "strings",
                Some((Item::Tensor(_), _)) => "tensors",
                Some((Item::Graph(_), _)) => "graphs",
                Some((Item::Type(_), _)) => "types",
                None => "",
            }
            .to_owned()
        });
        if kind.is_empty() {
            return Err(self.error(
                open.start..close.end,
                "an empty list needs its kind: `ints[]`, `floats[]`, `strings[]`, `tensors[]`, `graphs[]` or `types[]`",
            ));
        }
        let mut attr = match kind.as_str() {
            "ints" => Attr::Ints(Vec::new()),
            "floats" => Attr::Floats(Vec::new()),
            "strings" => Attr::Strings(Vec::new()),
            "tensors" => Attr::Tensors(Vec::new()),
            "graphs" => Attr::Graphs(Vec::new()),
            _ => Attr::Types(Vec::new()),
        };
        for (item, span) in items {
            match (&mut attr, item) {
                (Attr::Ints(v), Item::Int(x)) => v.push(x),
                (Attr::Floats(v), Item::Float(x)) => v.push(x),
                (Attr::Floats(v), Item::Int(x)) => v.push(x as f32),
                (Attr::Strings(v), Item::Str(x)) => v.push(x),
                (Attr::Tensors(v), Item::Tensor(x)) => v.push(x),
                (Attr::Graphs(v), Item::Graph(x)) => v.push(x),
                (Attr::Types(v), Item::Type(x)) => v.push(x),
                _ => {
                    return Err(self.error(
                        span,
                        format!("every element of this list must be of kind `{kind}`"),
                    ));
                }
            }
        }
        Ok(attr)
    }

    // ---- links ----

    fn link(&mut self) -> PResult<()> {
        self.bump();
        let from = self.link_end()?;
        if *self.tok() != Tok::Arrow {
            return Err(self.unexpected("`->`"));
        }
        self.bump();
        let to = self.link_end()?;
        self.links.push(PendingLink { from, to });
        Ok(())
    }

    fn link_end(&mut self) -> PResult<(RefName, Range<usize>, u32)> {
        let Tok::Graph(key) = self.tok().clone() else {
            return Err(self.unexpected("a graph such as `@vision`"));
        };
        let span = self.bump().span;
        self.expect_punct('[')?;
        let (i, ispan) = self.int("an output or input index")?;
        self.expect_punct(']')?;
        let i = u32::try_from(i).map_err(|_| self.error(ispan, "index out of range"))?;
        Ok((key, span, i))
    }

    fn resolve_links(&mut self) {
        for l in std::mem::take(&mut self.links) {
            let mut ends = Vec::new();
            for (key, span, _) in [&l.from, &l.to] {
                match self.entries.get(key) {
                    Some(&(g, _)) => ends.push(g),
                    None => {
                        self.error(
                            span.clone(),
                            format!("unknown graph `{}`", ref_text('@', key)),
                        );
                    }
                }
            }
            if let [from, to] = ends[..] {
                self.m.links.push(Link {
                    from: (from, l.from.2),
                    to: (to, l.to.2),
                });
            }
        }
    }
}

/// A float as written: text for `str::parse`, or the bits of `nan(0x...)` and whether a `-`
/// preceded it.
enum FloatLit {
    Text(String),
    Bits(u64, bool),
}

impl FloatLit {
    fn to_f32(&self) -> Option<f32> {
        match self {
            FloatLit::Text(s) => s.parse::<f32>().ok(),
            FloatLit::Bits(b, neg) => {
                let x = f32::from_bits(u32::try_from(*b).ok()?);
                Some(if *neg { -x } else { x })
            }
        }
    }

    fn to_f64(&self) -> Option<f64> {
        match self {
            FloatLit::Text(s) => s.parse::<f64>().ok(),
            FloatLit::Bits(b, neg) => {
                let x = f64::from_bits(*b);
                Some(if *neg { -x } else { x })
            }
        }
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}
