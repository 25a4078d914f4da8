//! Precision maps: ordered rules that choose a quantization scheme per node.
//!
//! A map is a TOML file:
//!
//! ```toml
//! # Settings for nodes that no rule matches (optional; the default is `scheme = "float"`).
//! [default]
//! scheme = "float"
//!
//! [[rule]]
//! name = "patch embedding"           # optional, shown in reports
//! nodes = ["/vision_model/embeddings/*"]  # node-name globs (any matches)
//! ops = ["Conv"]                     # op kinds (`MatMul`, `com.microsoft.Attention`, ...)
//! modality = "vision"                # or a list: vision, text, audio, fusion, shared
//! scheme = "fp8"                     # int8, int8-dynamic, int4, fp8, fp16, float
//! granularity = "per-tensor"         # per-tensor, per-channel, per-group
//! block = 32                         # per-group only: 16, 32, 64, 128 or 256
//! symmetric = true
//! calibration = "percentile:99.99"   # an observer: minmax, ema[:m], percentile[:p], entropy, mse
//! ```
//!
//! Rules are tried in order and the first whose selectors all hold gives the node its settings;
//! a selector that is left out holds for every node. Globs are `globset` globs on the node's
//! source name (`*` also crosses `/`); a node without a name is matched only by rules without
//! `nodes`. Modalities are those of [`mmq_ir::modality::analyze`].
//!
//! [`PrecisionMap::parse`] reports, with byte spans and 1-based lines: TOML syntax errors,
//! unknown keys, values of the wrong type, bad globs, unknown schemes, granularities or observers,
//! settings a scheme cannot have (`int4` is per group; `block` needs `per-group`; FP8 is
//! symmetric), and conflicting rules (a rule that an earlier rule shadows: the earlier rule matches
//! every node it could match, with different settings). Redundant rules (shadowed with the same
//! settings) and settings that a scheme ignores are warnings.
//!
//! [`PrecisionMap::plan`] resolves the map on a graph into a [`Plan`]: one [`NodePlan`] per node
//! with every setting filled in. The scheme passes take the nodes of their scheme from it through
//! their node filters ([`Plan::filter`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use globset::{Glob, GlobSet, GlobSetBuilder};
use mmq_ir::modality::{Labels, Modality};
use mmq_ir::{GraphId, Module, Node, Op};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::quant::calibrate::Observer;
use crate::quant::int8::ActGranularity;
use crate::quant::int8::NodeFilter;

/// A quantization scheme a node can be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// Static W8A8: weights per output channel, activations per tensor from calibration.
    Int8,
    /// INT8 weights, activations quantized at run time.
    Int8Dynamic,
    /// Weight-only INT4 per group (`com.microsoft.MatMulNBits`).
    Int4,
    /// FP8 E4M3 Q/DQ.
    Fp8,
    /// Half precision.
    Fp16,
    /// Left in the original precision.
    Float,
}

impl Scheme {
    /// Every scheme, in declaration order.
    pub const ALL: [Scheme; 6] = [
        Scheme::Int8,
        Scheme::Int8Dynamic,
        Scheme::Int4,
        Scheme::Fp8,
        Scheme::Fp16,
        Scheme::Float,
    ];

    /// The name a map spells (`int8`, `int8-dynamic`, `int4`, `fp8`, `fp16`, `float`).
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Int8 => "int8",
            Scheme::Int8Dynamic => "int8-dynamic",
            Scheme::Int4 => "int4",
            Scheme::Fp8 => "fp8",
            Scheme::Fp16 => "fp16",
            Scheme::Float => "float",
        }
    }

    /// Whether the scheme uses activation ranges from calibration.
    pub fn calibrated(self) -> bool {
        matches!(self, Scheme::Int8 | Scheme::Fp8)
    }

    /// Whether the scheme quantizes to integers with scales (granularity and symmetry apply).
    fn scaled(self) -> bool {
        matches!(
            self,
            Scheme::Int8 | Scheme::Int8Dynamic | Scheme::Int4 | Scheme::Fp8
        )
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = mmq_ir::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scheme::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| mmq_ir::UnknownName {
                what: "scheme",
                value: s.to_owned(),
                expected: Scheme::ALL.map(Scheme::name).join(", "),
            })
    }
}

/// How many scales a weight gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// One scale for the tensor.
    PerTensor,
    /// One scale per output channel.
    PerChannel,
    /// One scale per `block` consecutive elements along the reduction axis.
    PerGroup {
        /// Elements per group.
        block: u32,
    },
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Granularity::PerTensor => f.write_str("per-tensor"),
            Granularity::PerChannel => f.write_str("per-channel"),
            Granularity::PerGroup { block } => write!(f, "per-group:{block}"),
        }
    }
}

/// Settings as a rule (or `[default]`) wrote them; absent fields take the scheme's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The scheme.
    pub scheme: Scheme,
    /// Granularity, if given.
    pub granularity: Option<Granularity>,
    /// Symmetric quantization (no zero point), if given.
    pub symmetric: Option<bool>,
    /// Calibration method for activation ranges, if given.
    pub calibration: Option<Observer>,
    /// Run-time activation scales of `int8-dynamic` (`granularity = "per-token"` or
    /// `"per-patch"`; the weights stay per channel), if given.
    pub activations: Option<ActGranularity>,
}

impl Settings {
    /// Settings that leave nodes in their original precision.
    pub fn float() -> Settings {
        Settings {
            scheme: Scheme::Float,
            granularity: None,
            symmetric: None,
            calibration: None,
            activations: None,
        }
    }

    /// Fills in the scheme's defaults: INT8 per channel, INT4 per group of 32, FP8 per tensor,
    /// symmetric, `minmax` calibration for calibrated schemes.
    pub fn resolve(&self) -> NodePlan {
        let scaled = self.scheme.scaled();
        let granularity = match self.scheme {
            Scheme::Int8 | Scheme::Int8Dynamic => {
                Some(self.granularity.unwrap_or(Granularity::PerChannel))
            }
            Scheme::Int4 => Some(
                self.granularity
                    .unwrap_or(Granularity::PerGroup { block: 32 }),
            ),
            Scheme::Fp8 => Some(self.granularity.unwrap_or(Granularity::PerTensor)),
            Scheme::Fp16 | Scheme::Float => None,
        };
        NodePlan {
            scheme: self.scheme,
            granularity,
            symmetric: scaled && self.symmetric.unwrap_or(true),
            calibration: if self.scheme.calibrated() {
                Some(self.calibration.unwrap_or(Observer::MinMax))
            } else {
                None
            },
            activations: self.activations.unwrap_or_default(),
            rule: None,
        }
    }
}

/// The settings one node ends up with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// The scheme.
    pub scheme: Scheme,
    /// Weight granularity (`None` for `fp16` and `float`).
    pub granularity: Option<Granularity>,
    /// Symmetric (always `false` for `fp16` and `float`).
    pub symmetric: bool,
    /// Calibration method (`Some` exactly for calibrated schemes: `int8`, `fp8`).
    pub calibration: Option<Observer>,
    /// Run-time activation scales (`int8-dynamic`).
    pub activations: ActGranularity,
    /// Index of the rule that matched, `None` for the map's default.
    pub rule: Option<usize>,
}

/// Node selectors of a rule.
#[derive(Clone, Debug)]
struct Selectors {
    globs: Vec<String>,
    glob_set: Option<GlobSet>,
    ops: Vec<String>,
    modality: Vec<Modality>,
}

impl Selectors {
    fn matches(&self, name: Option<&str>, op: &Op, label: Modality) -> bool {
        if let Some(set) = &self.glob_set {
            match name {
                Some(n) if set.is_match(n) => {}
                _ => return false,
            }
        }
        if !self.ops.is_empty() && !self.ops.iter().any(|o| op_matches(o, op)) {
            return false;
        }
        self.modality.is_empty() || self.modality.contains(&label)
    }

    /// Whether every node these selectors could match is also matched by `self` (a conservative
    /// check on the written selectors: equal or absent).
    fn covers(&self, later: &Selectors) -> bool {
        let sub = |a: &[String], b: &[String]| {
            a.is_empty() || (!b.is_empty() && b.iter().all(|x| a.contains(x)))
        };
        let globs = self.globs.is_empty()
            || self.globs.iter().any(|g| g == "*" || g == "**")
            || (!later.globs.is_empty() && later.globs.iter().all(|x| self.globs.contains(x)));
        globs
            && sub(&self.ops, &later.ops)
            && (self.modality.is_empty()
                || (!later.modality.is_empty()
                    && later.modality.iter().all(|x| self.modality.contains(x))))
    }
}

/// Earlier rules by one kind of selector: those that leave it open (no selector of the kind,
/// or a `*` glob), and those that name each value.
struct ByKind<K> {
    open: Vec<usize>,
    named: HashMap<K, Vec<usize>>,
}

impl<K: std::hash::Hash + Eq + Clone> ByKind<K> {
    fn new() -> Self {
        ByKind {
            open: Vec::new(),
            named: HashMap::new(),
        }
    }

    /// The earlier rules that can cover a rule whose selectors of this kind are `values`
    /// (`open`: it has none): the open ones, and those naming its first value; both ascending.
    fn candidates(&self, values: &[K], open: bool) -> (&[usize], &[usize]) {
        let named = match (open, values.first()) {
            (false, Some(v)) => self.named.get(v).map_or(&[][..], Vec::as_slice),
            _ => &[],
        };
        (&self.open, named)
    }

    fn add(&mut self, index: usize, values: &[K], open: bool) {
        if open {
            self.open.push(index);
        } else {
            for v in values {
                let list = self.named.entry(v.clone()).or_default();
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
    }
}

/// The smallest index of two ascending lists for which `ok` holds.
fn first_in_order(a: &[usize], b: &[usize], mut ok: impl FnMut(usize) -> bool) -> Option<usize> {
    let (mut x, mut y) = (0, 0);
    loop {
        let i = match (a.get(x), b.get(y)) {
            (Some(&p), Some(&q)) if p <= q => {
                x += 1;
                p
            }
            (_, Some(&q)) => {
                y += 1;
                q
            }
            (Some(&p), None) => {
                x += 1;
                p
            }
            (None, None) => return None,
        };
        if ok(i) {
            return Some(i);
        }
    }
}

/// For each rule, the first earlier rule that covers it ([`Selectors::covers`]), if any. An
/// earlier rule can cover a later one only if, for every kind of selector, it leaves the kind
/// open or names the later rule's first value of it; the candidates come from the smallest of
/// those three indexes, so a map of many narrow rules (an `--auto-map` of every node) is
/// checked in near-linear time instead of comparing every pair.
fn first_covering(rules: &[Rule]) -> Vec<Option<usize>> {
    let mut globs: ByKind<String> = ByKind::new();
    let mut ops: ByKind<String> = ByKind::new();
    let mut modality: ByKind<Modality> = ByKind::new();
    let mut out = Vec::with_capacity(rules.len());
    for (j, r) in rules.iter().enumerate() {
        let s = &r.selectors;
        let glob_open = s.globs.is_empty() || s.globs.iter().any(|g| g == "*" || g == "**");
        let kinds = [
            globs.candidates(&s.globs, s.globs.is_empty()),
            ops.candidates(&s.ops, s.ops.is_empty()),
            modality.candidates(&s.modality, s.modality.is_empty()),
        ];
        let (a, b) = kinds
            .into_iter()
            .min_by_key(|(a, b)| a.len() + b.len())
            .unwrap_or((&[], &[]));
        out.push(first_in_order(a, b, |i| rules[i].selectors.covers(s)));
        globs.add(j, &s.globs, glob_open);
        ops.add(j, &s.ops, s.ops.is_empty());
        modality.add(j, &s.modality, s.modality.is_empty());
    }
    out
}

fn op_matches(pattern: &str, op: &Op) -> bool {
    match pattern.rsplit_once('.') {
        Some((domain, ty)) => {
            let d = op.domain();
            ty == op.op_type()
                && (d == domain || (d.is_empty() && (domain == "ai.onnx" || domain.is_empty())))
        }
        None => pattern == op.op_type(),
    }
}

/// One rule of a map.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The rule's `name`, if given.
    pub name: Option<String>,
    /// The 1-based line of its `[[rule]]` header.
    pub line: usize,
    /// The settings it gives.
    pub settings: Settings,
    selectors: Selectors,
}

impl Rule {
    /// A rule built in code (line 0): node-name globs (none: every node), op kinds and
    /// modalities, as a map's `nodes`, `ops` and `modality` keys take them. Fails with the
    /// glob's error when a glob does not parse ([`escape_glob`] makes any name a valid glob).
    pub fn new(
        name: Option<String>,
        nodes: Vec<String>,
        ops: Vec<String>,
        modality: Vec<Modality>,
        settings: Settings,
    ) -> Result<Rule, globset::Error> {
        let glob_set = if nodes.is_empty() {
            None
        } else {
            let mut builder = GlobSetBuilder::new();
            for g in &nodes {
                builder.add(Glob::new(g)?);
            }
            Some(builder.build()?)
        };
        Ok(Rule {
            name,
            line: 0,
            settings,
            selectors: Selectors {
                globs: nodes,
                glob_set,
                ops,
                modality,
            },
        })
    }

    /// How reports call the rule: its name, else `rule at line N` (a rule built in code has
    /// no line: `rule 'NAME'`, or its first glob).
    pub fn label(&self) -> String {
        match (&self.name, self.line) {
            (Some(n), 0) => format!("rule '{n}'"),
            (Some(n), line) => format!("rule '{n}' (line {line})"),
            (None, 0) => match self.selectors.globs.first() {
                Some(g) => format!("rule for '{g}'"),
                None => "rule built in code".to_owned(),
            },
            (None, line) => format!("rule at line {line}"),
        }
    }

    /// The rule's node-name globs (empty: every node).
    pub fn nodes(&self) -> &[String] {
        &self.selectors.globs
    }

    /// The rule's op kinds (empty: every op).
    pub fn ops(&self) -> &[String] {
        &self.selectors.ops
    }

    /// The rule's modalities (empty: every modality).
    pub fn modality(&self) -> &[Modality] {
        &self.selectors.modality
    }
}

/// A glob that matches exactly `name`: each glob metacharacter (`*`, `?`, `[`, `]`, `{`, `}`,
/// `\`) becomes a one-character class.
pub fn escape_glob(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '*' | '?' | '[' | ']' | '{' | '}' | '\\' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

/// `s` as a TOML basic string (quoted, with `"`, `\` and control characters escaped).
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `key = [ "a", "b" ]` for a list of strings.
fn toml_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.map(toml_string).collect();
    format!("[{}]", items.join(", "))
}

impl Settings {
    /// The settings' keys as TOML lines (`scheme`, then what is given of `granularity`,
    /// `block`, `symmetric`, `calibration`).
    fn to_toml(&self, out: &mut String) {
        out.push_str(&format!("scheme = {}\n", toml_string(self.scheme.name())));
        match self.granularity {
            Some(Granularity::PerTensor) => out.push_str("granularity = \"per-tensor\"\n"),
            Some(Granularity::PerChannel) => out.push_str("granularity = \"per-channel\"\n"),
            Some(Granularity::PerGroup { block }) => {
                out.push_str(&format!("granularity = \"per-group\"\nblock = {block}\n"));
            }
            None => {}
        }
        if let Some(a) = self.activations.filter(|a| a.per_row()) {
            out.push_str(&format!("granularity = \"{a}\"\n"));
        }
        if let Some(s) = self.symmetric {
            out.push_str(&format!("symmetric = {s}\n"));
        }
        if let Some(c) = self.calibration {
            out.push_str(&format!("calibration = {}\n", toml_string(&c.to_string())));
        }
    }
}

/// A parsed precision map.
#[derive(Clone, Debug)]
pub struct PrecisionMap {
    /// Settings of nodes no rule matches.
    pub default: Settings,
    /// The rules in order.
    pub rules: Vec<Rule>,
}

/// How serious a [`MapDiagnostic`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The map is rejected.
    Error,
    /// The map is used; something in it has no effect.
    Warning,
}

/// A problem in a precision map, located in its text.
#[derive(Clone, Debug, PartialEq)]
pub struct MapDiagnostic {
    /// Error or warning.
    pub level: Level,
    /// What is wrong.
    pub message: String,
    /// Byte range of the offending text.
    pub span: Range<usize>,
    /// 1-based line of `span.start`.
    pub line: usize,
    /// What the primary span shows.
    pub label: String,
    /// Other places that explain it (an earlier conflicting rule).
    pub related: Vec<(Range<usize>, String)>,
    /// Hints.
    pub notes: Vec<String>,
}

impl fmt::Display for MapDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Error => "error",
            Level::Warning => "warning",
        };
        write!(f, "{level}: line {}: {}", self.line, self.message)
    }
}

const RULE_KEYS: &[&str] = &[
    "name",
    "nodes",
    "ops",
    "modality",
    "scheme",
    "granularity",
    "block",
    "symmetric",
    "calibration",
];
const DEFAULT_KEYS: &[&str] = &["scheme", "granularity", "block", "symmetric", "calibration"];

struct Parser<'a> {
    src: &'a str,
    /// Offsets of the source's newlines, for line numbers in logarithmic time (a map may have
    /// tens of thousands of rules).
    newlines: Vec<usize>,
    diags: Vec<MapDiagnostic>,
}

type Entry<'i> = (
    &'i Spanned<toml::de::DeString<'i>>,
    &'i Spanned<DeValue<'i>>,
);

impl Parser<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.src.len());
        self.newlines.partition_point(|&n| n < end) + 1
    }

    fn diag(&mut self, level: Level, span: Range<usize>, message: String, label: &str) {
        let line = self.line(span.start);
        self.diags.push(MapDiagnostic {
            level,
            message,
            span,
            line,
            label: label.to_owned(),
            related: Vec::new(),
            notes: Vec::new(),
        });
    }

    fn error(&mut self, span: Range<usize>, message: String, label: &str) {
        self.diag(Level::Error, span, message, label);
    }

    fn unknown_key(&mut self, key: &Spanned<toml::de::DeString<'_>>, known: &[&str], at: &str) {
        let k: &str = key.get_ref();
        let hint = known
            .iter()
            .min_by_key(|c| edit_distance(c, k))
            .filter(|c| edit_distance(c, k) <= 2);
        self.error(
            key.span(),
            format!("unknown key '{k}' in {at}"),
            "unknown key",
        );
        if let Some(last) = self.diags.last_mut() {
            last.notes.push(match hint {
                Some(h) => format!("did you mean '{h}'?"),
                None => format!("expected one of: {}", known.join(", ")),
            });
        }
    }

    fn string<'v>(&mut self, v: &'v Spanned<DeValue<'_>>, key: &str) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.error(
                    v.span(),
                    format!("'{key}' must be a string, found {}", other.type_str()),
                    "expected a string",
                );
                None
            }
        }
    }

    /// A string or an array of strings, each with its span.
    fn strings(&mut self, v: &Spanned<DeValue<'_>>, key: &str) -> Vec<(String, Range<usize>)> {
        match v.get_ref() {
            DeValue::String(s) => vec![(s.to_string(), v.span())],
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for item in items.iter() {
                    if let Some(s) = self.string(item, key) {
                        out.push((s.to_owned(), item.span()));
                    }
                }
                out
            }
            other => {
                self.error(
                    v.span(),
                    format!(
                        "'{key}' must be a string or an array of strings, found {}",
                        other.type_str()
                    ),
                    "expected a string or an array",
                );
                Vec::new()
            }
        }
    }

    /// Parses the settings keys of a table; `None` when a required or malformed value makes
    /// them unusable (already reported).
    fn settings(
        &mut self,
        entries: &[Entry<'_>],
        table_span: Range<usize>,
        what: &str,
    ) -> Option<Settings> {
        let get = |k: &str| {
            entries
                .iter()
                .find(|(key, _)| key.get_ref() == k)
                .map(|e| e.1)
        };
        let Some(scheme_v) = get("scheme") else {
            self.error(
                table_span,
                format!("{what} has no 'scheme'"),
                "missing `scheme = \"...\"`",
            );
            if let Some(last) = self.diags.last_mut() {
                last.notes.push(format!(
                    "schemes: {}",
                    Scheme::ALL.map(Scheme::name).join(", ")
                ));
            }
            return None;
        };
        let scheme_span = scheme_v.span();
        let scheme = match self.string(scheme_v, "scheme")?.parse::<Scheme>() {
            Ok(s) => s,
            Err(e) => {
                self.error(scheme_span, e.to_string(), "unknown scheme");
                return None;
            }
        };
        let mut ok = true;
        let mut granularity = None;
        let mut activations = None;
        let mut gran_span = None;
        if let Some(v) = get("granularity") {
            gran_span = Some(v.span());
            match self.string(v, "granularity") {
                Some(a @ ("per-token" | "per-patch")) if scheme == Scheme::Int8Dynamic => {
                    activations = a.parse().ok();
                }
                Some(a @ ("per-token" | "per-patch")) => {
                    self.error(
                        v.span(),
                        format!(
                            "'{a}' activation scales are computed at run time: they need scheme \
                             \"int8-dynamic\", not \"{scheme}\""
                        ),
                        "run-time scales",
                    );
                    ok = false;
                }
                Some("per-tensor") => granularity = Some(Granularity::PerTensor),
                Some("per-channel") => granularity = Some(Granularity::PerChannel),
                Some("per-group") => granularity = Some(Granularity::PerGroup { block: 32 }),
                Some(other) => {
                    self.error(
                        v.span(),
                        format!(
                            "unknown granularity '{other}' (expected per-tensor, per-channel, per-group, \
                             or per-token / per-patch with int8-dynamic)"
                        ),
                        "unknown granularity",
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        if let Some(v) = get("block") {
            let block = match v.get_ref() {
                DeValue::Integer(i) => {
                    i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok()
                }
                _ => None,
            };
            match block {
                Some(b) if [16, 32, 64, 128, 256].contains(&b) => match granularity {
                    Some(Granularity::PerGroup { .. }) | None if scheme == Scheme::Int4 => {
                        granularity = Some(Granularity::PerGroup { block: b as u32 });
                    }
                    Some(Granularity::PerGroup { .. }) => {
                        granularity = Some(Granularity::PerGroup { block: b as u32 });
                    }
                    _ => {
                        self.error(
                            v.span(),
                            "'block' needs granularity = \"per-group\"".to_owned(),
                            "block size without per-group granularity",
                        );
                        ok = false;
                    }
                },
                _ => {
                    self.error(
                        v.span(),
                        "'block' must be 16, 32, 64, 128 or 256".to_owned(),
                        "bad block size",
                    );
                    ok = false;
                }
            }
        }
        let mut symmetric = None;
        if let Some(v) = get("symmetric") {
            match v.get_ref() {
                DeValue::Boolean(b) => symmetric = Some(*b),
                other => {
                    self.error(
                        v.span(),
                        format!(
                            "'symmetric' must be true or false, found {}",
                            other.type_str()
                        ),
                        "expected a boolean",
                    );
                    ok = false;
                }
            }
        }
        let mut calibration = None;
        if let Some(v) = get("calibration") {
            match self.string(v, "calibration").map(str::parse::<Observer>) {
                Some(Ok(o)) => calibration = Some(o),
                Some(Err(e)) => {
                    self.error(v.span(), e.to_string(), "unknown calibration method");
                    ok = false;
                }
                None => ok = false,
            }
        }
        // What each scheme can have.
        match (scheme, granularity) {
            (Scheme::Int4, Some(g @ (Granularity::PerTensor | Granularity::PerChannel))) => {
                self.error(
                    gran_span.clone().unwrap_or(scheme_span.clone()),
                    format!("int4 is weight-only per group (MatMulNBits); '{g}' is not supported"),
                    "use per-group",
                );
                ok = false;
            }
            (
                Scheme::Int8 | Scheme::Int8Dynamic | Scheme::Fp8,
                Some(Granularity::PerGroup { .. }),
            ) => {
                self.error(
                    gran_span.clone().unwrap_or(scheme_span.clone()),
                    format!("{scheme} has no per-group form (only int4 is quantized per group)"),
                    "use per-tensor or per-channel",
                );
                ok = false;
            }
            _ => {}
        }
        if scheme == Scheme::Fp8 && symmetric == Some(false) {
            let span = get("symmetric").map_or(scheme_span.clone(), |v| v.span());
            self.error(
                span,
                "fp8 is symmetric (an FP8 zero point must be 0)".to_owned(),
                "remove `symmetric = false`",
            );
            ok = false;
        }
        let ignored: &[(&str, bool)] = &[
            ("granularity", !scheme.scaled()),
            ("symmetric", !scheme.scaled()),
            ("block", !scheme.scaled()),
            ("calibration", !scheme.calibrated()),
        ];
        for &(key, is_ignored) in ignored {
            if let Some(v) = get(key).filter(|_| is_ignored) {
                self.diag(
                    Level::Warning,
                    v.span(),
                    format!("'{key}' has no effect with scheme '{scheme}'"),
                    "ignored",
                );
            }
        }
        ok.then_some(Settings {
            scheme,
            granularity,
            symmetric,
            calibration,
            activations,
        })
    }

    fn rule(&mut self, table: &Spanned<DeValue<'_>>) -> Option<Rule> {
        let DeValue::Table(t) = table.get_ref() else {
            self.error(
                table.span(),
                "each [[rule]] must be a table".to_owned(),
                "expected a table",
            );
            return None;
        };
        let entries = sorted_entries(t);
        let mut ok = true;
        for (k, _) in &entries {
            if !RULE_KEYS.contains(&k.get_ref().as_ref()) {
                self.unknown_key(k, RULE_KEYS, "[[rule]]");
                ok = false;
            }
        }
        let get = |k: &str| {
            entries
                .iter()
                .find(|(key, _)| key.get_ref() == k)
                .map(|e| e.1)
        };
        let name = match get("name") {
            Some(v) => self.string(v, "name").map(str::to_owned),
            None => None,
        };
        let mut globs = Vec::new();
        let mut builder = GlobSetBuilder::new();
        if let Some(v) = get("nodes") {
            let list = self.strings(v, "nodes");
            if list.is_empty() {
                self.error(v.span(), "'nodes' is empty".to_owned(), "no globs");
                ok = false;
            }
            for (g, span) in list {
                match Glob::new(&g) {
                    Ok(glob) => {
                        builder.add(glob);
                        globs.push(g);
                    }
                    Err(e) => {
                        self.error(span, format!("bad glob '{g}': {}", e.kind()), "bad glob");
                        ok = false;
                    }
                }
            }
        }
        let glob_set = if globs.is_empty() {
            None
        } else {
            match builder.build() {
                Ok(s) => Some(s),
                Err(e) => {
                    self.error(table.span(), format!("bad globs: {e}"), "bad globs");
                    ok = false;
                    None
                }
            }
        };
        let mut ops = Vec::new();
        if let Some(v) = get("ops") {
            for (o, span) in self.strings(v, "ops") {
                // A bare op type matches in every domain.
                let known = || Op::MODELED.iter().map(|&(_, t)| t);
                if !o.contains('.') && !known().any(|t| t == o) {
                    let near = known()
                        .find(|m| m.eq_ignore_ascii_case(&o))
                        .or_else(|| known().find(|m| edit_distance(m, &o) <= 1));
                    self.diag(
                        Level::Warning,
                        span,
                        format!("op '{o}' is not a known ONNX op; the rule matches only custom ops of that type"),
                        "unknown op",
                    );
                    if let (Some(n), Some(last)) = (near, self.diags.last_mut()) {
                        last.notes.push(format!("did you mean '{n}'?"));
                    }
                }
                ops.push(o);
            }
        }
        let mut modality = Vec::new();
        if let Some(v) = get("modality") {
            for (s, span) in self.strings(v, "modality") {
                match s.parse::<Modality>() {
                    Ok(m) => modality.push(m),
                    Err(e) => {
                        self.error(span, e.to_string(), "unknown modality");
                        ok = false;
                    }
                }
            }
        }
        let settings = self.settings(&entries, table.span(), "[[rule]]");
        Some(Rule {
            name,
            line: self.line(table.span().start),
            settings: settings.filter(|_| ok)?,
            selectors: Selectors {
                globs,
                glob_set,
                ops,
                modality,
            },
        })
    }
}

fn sorted_entries<'i>(t: &'i DeTable<'i>) -> Vec<Entry<'i>> {
    let mut v: Vec<Entry<'i>> = t.iter().collect();
    v.sort_by_key(|(k, _)| k.span().start);
    v
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(!ca.eq_ignore_ascii_case(&cb));
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl PrecisionMap {
    /// Parses a map. On success returns it with its warnings; otherwise every error found (and
    /// the warnings), in source order.
    pub fn parse(src: &str) -> Result<(PrecisionMap, Vec<MapDiagnostic>), Vec<MapDiagnostic>> {
        let mut p = Parser {
            src,
            newlines: src
                .bytes()
                .enumerate()
                .filter_map(|(i, b)| (b == b'\n').then_some(i))
                .collect(),
            diags: Vec::new(),
        };
        let root = match DeTable::parse(src) {
            Ok(t) => t,
            Err(e) => {
                let span = e.span().unwrap_or(0..0);
                p.error(span, e.message().trim().to_owned(), "TOML syntax error");
                return Err(p.diags);
            }
        };
        let mut default = Settings::float();
        let mut rules = Vec::new();
        let mut rule_spans = Vec::new();
        for (key, value) in sorted_entries(root.get_ref()) {
            match key.get_ref().as_ref() {
                "default" => match value.get_ref() {
                    DeValue::Table(t) => {
                        let entries = sorted_entries(t);
                        let mut ok = true;
                        for (k, _) in &entries {
                            if !DEFAULT_KEYS.contains(&k.get_ref().as_ref()) {
                                p.unknown_key(k, DEFAULT_KEYS, "[default]");
                                ok = false;
                            }
                        }
                        if let Some(s) = p.settings(&entries, key.span(), "[default]")
                            && ok
                        {
                            default = s;
                        }
                    }
                    _ => p.error(
                        value.span(),
                        "'default' must be a table".to_owned(),
                        "expected [default]",
                    ),
                },
                "rule" => match value.get_ref() {
                    DeValue::Array(items) => {
                        for item in items.iter() {
                            if let Some(r) = p.rule(item) {
                                rules.push(r);
                                rule_spans.push(item.span());
                            }
                        }
                    }
                    _ => p.error(
                        value.span(),
                        "'rule' must be an array of tables ([[rule]])".to_owned(),
                        "expected [[rule]]",
                    ),
                },
                _ => p.unknown_key(key, &["default", "rule"], "the map"),
            }
        }
        // Conflicting rules: a later rule that an earlier one shadows.
        let covering = first_covering(&rules);
        for j in 0..rules.len() {
            if let Some(i) = covering[j] {
                let same = rules[i].settings == rules[j].settings;
                let (level, message) = if same {
                    (
                        Level::Warning,
                        format!(
                            "redundant rule: {} already gives every node it matches the same settings",
                            rules[i].label()
                        ),
                    )
                } else {
                    (
                        Level::Error,
                        format!(
                            "conflicting rules: {} matches every node this rule matches and gives '{}' instead of '{}'",
                            rules[i].label(),
                            rules[i].settings.scheme,
                            rules[j].settings.scheme
                        ),
                    )
                };
                p.diag(
                    level,
                    rule_spans[j].clone(),
                    message,
                    "this rule never applies",
                );
                if let Some(last) = p.diags.last_mut() {
                    last.related
                        .push((rule_spans[i].clone(), "the earlier rule".to_owned()));
                    last.notes.push(
                        "rules apply in order, first match wins: put the narrower rule first"
                            .to_owned(),
                    );
                }
            }
        }
        p.diags.sort_by_key(|d| d.span.start);
        if p.diags.iter().any(|d| d.level == Level::Error) {
            Err(p.diags)
        } else {
            Ok((PrecisionMap { default, rules }, p.diags))
        }
    }

    /// Resolves the map on top-level graph `graph` (and its subgraphs) with the modality labels
    /// of [`mmq_ir::modality::analyze`].
    pub fn plan(&self, m: &Module, graph: GraphId, labels: &Labels) -> Plan {
        let mut nodes = BTreeMap::new();
        let mut hits = vec![0usize; self.rules.len()];
        // Rules whose globs are all plain names (an `--auto-map` names every node) can match
        // only a node of one of those names: found by the name, not tried on every node.
        let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut others: Vec<usize> = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let globs = &r.selectors.globs;
            let plain = !globs.is_empty()
                && globs
                    .iter()
                    .all(|g| !g.contains(['*', '?', '[', ']', '{', '}', '\\']));
            if plain {
                for g in globs {
                    let list = by_name.entry(g.as_str()).or_default();
                    if list.last() != Some(&i) {
                        list.push(i);
                    }
                }
            } else {
                others.push(i);
            }
        }
        for g in m.graph_tree(graph) {
            for &n in m.graphs[g].nodes() {
                let node = &m.nodes[n];
                let label = labels.node(n);
                let named = node
                    .name
                    .as_deref()
                    .and_then(|name| by_name.get(name))
                    .map_or(&[][..], Vec::as_slice);
                let found = first_in_order(named, &others, |i| {
                    self.rules[i]
                        .selectors
                        .matches(node.name.as_deref(), &node.op, label)
                });
                let plan = match found {
                    Some(i) => {
                        hits[i] += 1;
                        NodePlan {
                            rule: Some(i),
                            ..self.rules[i].settings.resolve()
                        }
                    }
                    None => self.default.resolve(),
                };
                nodes.insert(n, plan);
            }
        }
        Plan { nodes, hits }
    }
}

impl PrecisionMap {
    /// A map built in code.
    pub fn new(default: Settings, rules: Vec<Rule>) -> PrecisionMap {
        PrecisionMap { default, rules }
    }

    /// The map as TOML text that [`PrecisionMap::parse`] reads back to the same map (rule
    /// lines aside): `[default]`, then one `[[rule]]` per rule.
    pub fn to_toml(&self) -> String {
        self.to_toml_with(|_| None)
    }

    /// [`PrecisionMap::to_toml`] with a comment line before rule `i` where `comment(i)` gives
    /// one (control characters in it, line breaks included, become spaces).
    pub fn to_toml_with(&self, comment: impl Fn(usize) -> Option<String>) -> String {
        let mut out = String::from("[default]\n");
        self.default.to_toml(&mut out);
        for (i, r) in self.rules.iter().enumerate() {
            out.push('\n');
            if let Some(c) = comment(i) {
                let c: String = c
                    .chars()
                    .map(|ch| if ch.is_control() { ' ' } else { ch })
                    .collect();
                out.push_str(&format!("# {c}\n"));
            }
            out.push_str("[[rule]]\n");
            if let Some(n) = &r.name {
                out.push_str(&format!("name = {}\n", toml_string(n)));
            }
            let sel = &r.selectors;
            if !sel.globs.is_empty() {
                let list = toml_list(sel.globs.iter().map(String::as_str));
                out.push_str(&format!("nodes = {list}\n"));
            }
            if !sel.ops.is_empty() {
                let list = toml_list(sel.ops.iter().map(String::as_str));
                out.push_str(&format!("ops = {list}\n"));
            }
            if !sel.modality.is_empty() {
                let list = toml_list(sel.modality.iter().map(|m| m.name()));
                out.push_str(&format!("modality = {list}\n"));
            }
            r.settings.to_toml(&mut out);
        }
        out
    }
}

/// The settings of every node of a graph tree (see [`PrecisionMap::plan`]).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    nodes: BTreeMap<Node, NodePlan>,
    hits: Vec<usize>,
}

impl Plan {
    /// The settings of node `n` (`None` for nodes outside the planned graph tree).
    pub fn get(&self, n: Node) -> Option<&NodePlan> {
        self.nodes.get(&n)
    }

    /// Every planned node with its settings, in handle order.
    pub fn iter(&self) -> impl Iterator<Item = (Node, &NodePlan)> + '_ {
        self.nodes.iter().map(|(&n, p)| (n, p))
    }

    /// The nodes given `scheme`.
    pub fn nodes_with(&self, scheme: Scheme) -> BTreeSet<Node> {
        self.iter()
            .filter(|(_, p)| p.scheme == scheme)
            .map(|(n, _)| n)
            .collect()
    }

    /// A node filter for a scheme pass ([`crate::quant::int8::NodeFilter`]): true for the nodes
    /// given `scheme`. Nodes that a pass creates later are not in the plan and are rejected, so
    /// running several scheme passes one after another never quantizes a node twice.
    pub fn filter(&self, scheme: Scheme) -> NodeFilter {
        self.filter_where(move |p| p.scheme == scheme)
    }

    /// A node filter accepting the planned nodes whose settings satisfy `pred`.
    pub fn filter_where(&self, pred: impl Fn(&NodePlan) -> bool) -> NodeFilter {
        let set: BTreeSet<Node> = self
            .iter()
            .filter(|(_, p)| pred(p))
            .map(|(n, _)| n)
            .collect();
        Box::new(move |_, n| set.contains(&n))
    }

    /// Number of nodes per scheme, schemes in declaration order, absent ones left out.
    pub fn counts(&self) -> Vec<(Scheme, usize)> {
        Scheme::ALL
            .into_iter()
            .map(|s| (s, self.iter().filter(|(_, p)| p.scheme == s).count()))
            .filter(|&(_, c)| c > 0)
            .collect()
    }

    /// Indices of the rules that matched no node.
    pub fn unused_rules(&self) -> Vec<usize> {
        (0..self.hits.len())
            .filter(|&i| self.hits[i] == 0)
            .collect()
    }

    /// How many nodes rule `i` matched.
    pub fn hits(&self, i: usize) -> usize {
        self.hits.get(i).copied().unwrap_or(0)
    }

    /// A text table: per rule its nodes and settings, then the totals per scheme.
    pub fn describe(&self, map: &PrecisionMap) -> String {
        let mut s = String::new();
        let setting = |p: &NodePlan| {
            let mut parts = vec![p.scheme.name().to_owned()];
            if let Some(g) = p.granularity {
                parts.push(g.to_string());
            }
            if p.scheme.scaled() {
                parts.push(
                    if p.symmetric {
                        "symmetric"
                    } else {
                        "asymmetric"
                    }
                    .to_owned(),
                );
            }
            if let Some(c) = p.calibration {
                parts.push(format!("calibration {c}"));
            }
            parts.join(", ")
        };
        for (i, r) in map.rules.iter().enumerate() {
            let mut p = r.settings.resolve();
            p.rule = Some(i);
            s.push_str(&format!(
                "{}: {} nodes -> {}\n",
                r.label(),
                self.hits(i),
                setting(&p)
            ));
        }
        let default_nodes = self.iter().filter(|(_, p)| p.rule.is_none()).count();
        s.push_str(&format!(
            "default: {default_nodes} nodes -> {}\n",
            setting(&map.default.resolve())
        ));
        let totals: Vec<String> = self
            .counts()
            .iter()
            .map(|(sc, c)| format!("{sc} {c}"))
            .collect();
        s.push_str(&format!("nodes by scheme: {}\n", totals.join(", ")));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmq_ir::{DType, Dim, Type};

    fn errors(src: &str) -> Vec<MapDiagnostic> {
        match PrecisionMap::parse(src) {
            Ok(_) => panic!("map parsed:\n{src}"),
            Err(d) => d.into_iter().filter(|d| d.level == Level::Error).collect(),
        }
    }

    #[test]
    fn parses_rules_in_order_with_defaults() {
        let src = r#"
[default]
scheme = "int8"

[[rule]]
name = "norms"
ops = ["LayerNormalization"]
scheme = "fp16"

[[rule]]
nodes = ["/vision/*", "/text/*"]
ops = "MatMul"
modality = ["vision", "text"]
scheme = "int4"
block = 64
symmetric = false
"#;
        let (map, warnings) = PrecisionMap::parse(src).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(map.default.scheme, Scheme::Int8);
        assert_eq!(map.rules.len(), 2);
        assert_eq!(map.rules[0].line, 5);
        assert_eq!(map.rules[1].line, 10);
        let p = map.rules[1].settings.resolve();
        assert_eq!(p.granularity, Some(Granularity::PerGroup { block: 64 }));
        assert!(!p.symmetric);
        assert_eq!(p.calibration, None);
        let d = map.default.resolve();
        assert_eq!(d.granularity, Some(Granularity::PerChannel));
        assert_eq!(d.calibration, Some(Observer::MinMax));
    }

    #[test]
    fn unknown_keys_have_lines_and_hints() {
        let src = "[[rule]]\nscheme = \"int8\"\ngranulrity = \"per-tensor\"\n\n[defaults]\n";
        let e = errors(src);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(e[0].line, 3);
        assert_eq!(e[0].message, "unknown key 'granulrity' in [[rule]]");
        assert_eq!(e[0].notes, vec!["did you mean 'granularity'?".to_owned()]);
        assert_eq!(&src[e[0].span.clone()], "granulrity");
        assert_eq!(e[1].line, 5);
        assert!(e[1].message.contains("'defaults'"));
    }

    #[test]
    fn bad_globs_and_values_are_errors() {
        let src = "[[rule]]\nnodes = [\"ok/*\", \"a[b\"]\nscheme = \"int9\"\n";
        let e = errors(src);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].message.starts_with("bad glob 'a[b'"),
            "{}",
            e[0].message
        );
        assert_eq!(e[0].line, 2);
        assert_eq!(&src[e[0].span.clone()], "\"a[b\"");
        assert!(e[1].message.contains("unknown scheme 'int9'"));
        let e = errors("[[rule]]\nscheme = \"int4\"\ngranularity = \"per-channel\"\n");
        assert!(e[0].message.contains("int4 is weight-only per group"));
        let e = errors("[[rule]]\nscheme = \"int8\"\nblock = 32\n");
        assert!(e[0].message.contains("'block' needs"));
        let e = errors("[[rule]]\nscheme = \"fp8\"\nsymmetric = false\n");
        assert!(e[0].message.contains("fp8 is symmetric"));
        let e = errors("[[rule]]\nscheme = \"int8\"\ncalibration = \"kl\"\n");
        assert!(e[0].message.contains("unknown observer 'kl'"));
        let e = errors("[[rule]]\nops = [\"MatMul\"]\n");
        assert!(e[0].message.contains("has no 'scheme'"));
        let e = errors("[[rule]\nscheme = 1\n");
        assert_eq!(e[0].line, 1);
        assert_eq!(e[0].label, "TOML syntax error");
    }

    #[test]
    fn conflicting_and_redundant_rules() {
        let src = r#"[[rule]]
ops = ["MatMul"]
scheme = "int8"

[[rule]]
ops = ["MatMul"]
modality = "vision"
scheme = "int4"
"#;
        let e = errors(src);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].line, 5);
        assert!(
            e[0].message
                .starts_with("conflicting rules: rule at line 1")
        );
        assert_eq!(e[0].related[0].0.start, 0);
        // The narrower rule first is fine.
        let swapped = r#"[[rule]]
ops = ["MatMul"]
modality = "vision"
scheme = "int4"

[[rule]]
ops = ["MatMul"]
scheme = "int8"
"#;
        assert!(PrecisionMap::parse(swapped).is_ok());
        // Same settings twice: a warning.
        let dup = "[[rule]]\nscheme = \"fp16\"\n[[rule]]\nops = [\"Add\"]\nscheme = \"fp16\"\n";
        let (_, w) = PrecisionMap::parse(dup).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].message.starts_with("redundant rule"));
        // Settings a scheme ignores, and unknown ops, are warnings.
        let src = "[[rule]]\nops = [\"Matmul\"]\nscheme = \"fp16\"\nsymmetric = true\n";
        let (_, w) = PrecisionMap::parse(src).unwrap();
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(w[0].notes, vec!["did you mean 'MatMul'?".to_owned()]);
        assert!(w[1].message.contains("no effect"));
    }

    #[test]
    fn plan_matches_names_ops_and_modality() {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        let t = Type::tensor(
            DType::F32,
            vec![Dim::known(1), Dim::known(3), Dim::known(4), Dim::known(4)],
        );
        let px = m.add_input(g, Some("pixel_values".into()), t.clone());
        let ids = m.add_input(
            g,
            Some("input_ids".into()),
            Type::tensor(DType::I64, vec![Dim::known(1), Dim::known(4)]),
        );
        let mut node = |op: &str, ins: Vec<mmq_ir::Value>, name: &str| {
            let n = m.add_node(
                g,
                Op::from_parts("", op, vec![]),
                ins.into_iter().map(Some).collect(),
                vec![Some((Some(format!("{name}_out")), t.clone()))],
                Some(name.to_owned()),
            );
            (n, m.nodes[n].outputs[0].unwrap())
        };
        let (conv, a) = node("Conv", vec![px], "/vision/patch_embed/Conv");
        let (vmm, a) = node("MatMul", vec![a], "/vision/layer0/MatMul");
        let (gather, b) = node("Gather", vec![ids], "/text/embed/Gather");
        let (tmm, b) = node("MatMul", vec![b], "/text/layer0/MatMul");
        let (fuse, _) = node("MatMul", vec![a, b], "/head/MatMul");
        m.entries.push(mmq_ir::Entry {
            graph: g,
            model: Default::default(),
        });
        let labels = mmq_ir::modality::analyze(&m, g, &[]).unwrap();
        let src = r#"
[[rule]]
nodes = ["*patch_embed*"]
scheme = "fp8"

[[rule]]
ops = ["MatMul"]
modality = "vision"
scheme = "int4"

[[rule]]
ops = ["MatMul"]
modality = "text"
scheme = "int8"
granularity = "per-tensor"

[[rule]]
ops = ["Softmax"]
scheme = "fp16"
"#;
        let (map, _) = PrecisionMap::parse(src).unwrap();
        let plan = map.plan(&m, g, &labels);
        let scheme = |n| plan.get(n).unwrap().scheme;
        assert_eq!(scheme(conv), Scheme::Fp8);
        assert_eq!(scheme(vmm), Scheme::Int4);
        assert_eq!(scheme(tmm), Scheme::Int8);
        assert_eq!(
            plan.get(tmm).unwrap().granularity,
            Some(Granularity::PerTensor)
        );
        assert_eq!(scheme(gather), Scheme::Float);
        assert_eq!(scheme(fuse), Scheme::Float, "fusion MatMul matches no rule");
        assert_eq!(plan.unused_rules(), vec![3]);
        let f = plan.filter(Scheme::Int4);
        assert!(f(&m, vmm) && !f(&m, tmm));
        assert_eq!(
            plan.counts(),
            vec![
                (Scheme::Int8, 1),
                (Scheme::Int4, 1),
                (Scheme::Fp8, 1),
                (Scheme::Float, 2)
            ]
        );
        let d = plan.describe(&map);
        assert!(
            d.contains("rule at line 2: 1 nodes -> fp8, per-tensor, symmetric, calibration minmax"),
            "{d}"
        );
    }

    #[test]
    fn escaped_globs_match_exactly_their_name() {
        let names = [
            "/blocks.0/attn/MatMul",
            "a*b",
            "w[0]",
            "x?y",
            "{p,q}",
            "back\\slash",
            "node_MatMul_30",
        ];
        for name in names {
            let g = escape_glob(name);
            let set = GlobSetBuilder::new()
                .add(Glob::new(&g).unwrap_or_else(|e| panic!("{name}: {g}: {e}")))
                .build()
                .expect("glob set");
            assert!(set.is_match(name), "{name} via {g}");
            for other in names.iter().filter(|o| **o != name) {
                assert!(!set.is_match(other), "{g} matches {other}");
            }
        }
        assert!(!Glob::new("a*b").unwrap().compile_matcher().is_match("a*bc"));
        assert_eq!(escape_glob("a*b"), "a[*]b");
    }

    #[test]
    fn a_map_built_in_code_prints_as_toml_that_parses_back() {
        let int4 = Settings {
            scheme: Scheme::Int4,
            granularity: Some(Granularity::PerGroup { block: 64 }),
            symmetric: Some(false),
            calibration: None,
            activations: None,
        };
        let int8 = Settings {
            scheme: Scheme::Int8,
            granularity: Some(Granularity::PerTensor),
            symmetric: None,
            calibration: Some(Observer::Percentile { percentile: 99.9 }),
            activations: None,
        };
        let weird = "say \"hi\"\\ [x]*\ttab";
        let rules = vec![
            Rule::new(
                Some("first \"one\"".into()),
                vec![escape_glob(weird)],
                vec![],
                vec![],
                int4.clone(),
            )
            .expect("rule"),
            Rule::new(
                None,
                vec!["/text/*".into(), escape_glob("a{b}")],
                vec!["MatMul".into(), "com.microsoft.Attention".into()],
                vec![Modality::Text, Modality::Fusion],
                int8.clone(),
            )
            .expect("rule"),
            Rule::new(None, vec![], vec!["Conv".into()], vec![], Settings::float()).expect("rule"),
        ];
        let map = PrecisionMap::new(
            Settings {
                scheme: Scheme::Fp8,
                ..Settings::float()
            },
            rules,
        );
        assert_eq!(map.rules[0].label(), "rule 'first \"one\"'");
        assert_eq!(map.rules[2].label(), "rule built in code");
        let text = map.to_toml_with(|i| (i == 1).then(|| "two\nlines".to_owned()));
        assert!(text.contains("# two lines\n[[rule]]"), "{text}");
        let (back, warnings) =
            PrecisionMap::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        assert!(warnings.is_empty(), "{warnings:?}\n{text}");
        assert_eq!(back.default, map.default);
        assert_eq!(back.rules.len(), 3);
        for (a, b) in map.rules.iter().zip(&back.rules) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.settings, b.settings);
            assert_eq!(a.nodes(), b.nodes());
            assert_eq!(a.ops(), b.ops());
            assert_eq!(a.modality(), b.modality());
            assert!(b.line > 0);
        }
        // The escaped name still selects exactly the node it names.
        let sel = &back.rules[0].selectors;
        let op = Op::from_parts("", "MatMul", vec![]);
        assert!(sel.matches(Some(weird), &op, Modality::Text));
        assert!(!sel.matches(Some("say"), &op, Modality::Text));
        assert_eq!(back.to_toml(), map.to_toml());
    }

    /// Random rules from small pools of globs (plain names, `*`, patterns), ops and modalities.
    fn random_rules(seed: u64, n: usize) -> Vec<Rule> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move |k: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % k
        };
        let globs = ["a", "b", "c", "*", "enc*", "a/b"];
        let ops = ["MatMul", "Gemm", "Conv"];
        let mods = [Modality::Vision, Modality::Text];
        (0..n)
            .map(|_| {
                let pick = |pool: &[&str], k: u64, next: &mut dyn FnMut(u64) -> u64| {
                    (0..k)
                        .map(|_| pool[next(pool.len() as u64) as usize].to_owned())
                        .collect::<Vec<_>>()
                };
                let g = pick(&globs, next(3), &mut next);
                let o = pick(&ops, next(3), &mut next);
                let m: Vec<Modality> = (0..next(2)).map(|_| mods[next(2) as usize]).collect();
                Rule::new(None, g, o, m, Settings::float()).expect("rule")
            })
            .collect()
    }

    #[test]
    fn indexed_shadowing_equals_the_pairwise_check() {
        for seed in 0..200 {
            let rules = random_rules(seed, 30);
            let naive: Vec<Option<usize>> = (0..rules.len())
                .map(|j| (0..j).find(|&i| rules[i].selectors.covers(&rules[j].selectors)))
                .collect();
            assert_eq!(first_covering(&rules), naive, "seed {seed}");
        }
    }

    #[test]
    fn plans_by_name_equal_a_scan_of_every_rule() {
        use mmq_ir::{GraphId, Module};
        let mut m = Module::new();
        let g: GraphId = m.add_graph("g", None);
        let ty = Type::tensor(DType::F32, vec![Dim::known(2)]);
        let x = m.add_input(g, Some("x".into()), ty.clone());
        for (i, name) in ["a", "b", "c", "a/b", "enc1", "z"].iter().enumerate() {
            let op = [
                Op::MatMul {},
                Op::Relu {},
                Op::Gemm {
                    alpha: None,
                    beta: None,
                    trans_a: None,
                    trans_b: None,
                },
            ][i % 3]
                .clone();
            m.add_node(
                g,
                op,
                vec![Some(x)],
                vec![Some((None, ty.clone()))],
                Some((*name).into()),
            );
        }
        let labels = mmq_ir::modality::analyze(&m, g, &[]).expect("labels");
        for seed in 0..100 {
            let map = PrecisionMap::new(Settings::float(), random_rules(seed, 12));
            let plan = map.plan(&m, g, &labels);
            for &n in m.graphs[g].nodes() {
                let node = &m.nodes[n];
                let want = map.rules.iter().position(|r| {
                    r.selectors
                        .matches(node.name.as_deref(), &node.op, labels.node(n))
                });
                let got = plan.iter().find(|(k, _)| *k == n).and_then(|(_, p)| p.rule);
                assert_eq!(got, want, "seed {seed}, node {:?}", node.name);
            }
        }
    }
}
