//! What a compilation is asked to do.
//!
//! [`Precision`] is the typed plan: each scheme with exactly the settings that apply to it, so a
//! setting that does not fit its scheme cannot be written. Front ends that take settings one by
//! one (flags, keywords) collect them in [`QuantFlags`], which becomes a `Precision` or an
//! [`OptionError`] naming the option; each front end words that error its own way through a
//! [`Spelling`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use mmq_ir::modality::Modality;
use mmq_kernels::cache::CacheFormat;
use mmq_passes::quant::calibrate::Observer;
use mmq_passes::quant::int8::ActGranularity;
use mmq_passes::quant::place::Placement;
use mmq_passes::quant::precision::PrecisionMap;
pub use mmq_passes::quant::precision::Scheme;
use mmq_passes::{DumpAfter, OptLevel, TargetRef};

use crate::calibration::CalibrationSource;

/// The value of `--quant` (Python `quant=`): one scheme for the whole model, or `mixed` with a
/// precision map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quant {
    /// One scheme (never [`Scheme::Float`]: no `--quant` means float).
    One(Scheme),
    /// Per-node schemes from a precision map.
    Mixed,
}

impl Quant {
    /// Every value, in the order help texts list them.
    pub const ALL: [Quant; 6] = [
        Quant::One(Scheme::Int8),
        Quant::One(Scheme::Int8Dynamic),
        Quant::One(Scheme::Int4),
        Quant::One(Scheme::Fp8),
        Quant::One(Scheme::Fp16),
        Quant::Mixed,
    ];

    /// The value's name.
    pub fn name(self) -> &'static str {
        match self {
            Quant::One(s) => s.name(),
            Quant::Mixed => "mixed",
        }
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Quant {
    type Err = mmq_ir::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quant::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| mmq_ir::UnknownName {
                what: "scheme",
                value: s.to_owned(),
                expected: format!(
                    "{}, or a precision map",
                    Quant::ALL.map(Quant::name).join(", ")
                ),
            })
    }
}

/// INT4 block settings (`--quant int4`, and the INT4 nodes of a precision map and `--auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int4Options {
    /// Block size along K: 32, 64 or 128 (16 and 256 also work).
    pub block: usize,
    /// Symmetric blocks (no zero points).
    pub symmetric: bool,
    /// `MatMulNBits`' `accuracy_level` (0 leaves it out); `None`: the target's choice.
    pub accuracy_level: Option<i64>,
}

impl Default for Int4Options {
    fn default() -> Self {
        Int4Options {
            block: 32,
            symmetric: true,
            accuracy_level: None,
        }
    }
}

/// The precision plan of a compilation: each scheme with the settings that apply to it.
#[derive(Clone, Debug, Default)]
pub enum Precision {
    /// No quantization.
    #[default]
    Float,
    /// Static W8A8: weights per channel, activations calibrated per tensor.
    Int8 {
        /// How activation ranges are chosen.
        observer: ObserverChoice,
        /// SmoothQuant strength (`None`: no SmoothQuant).
        smoothquant: Option<f32>,
    },
    /// Weights INT8, activations quantized at run time.
    Int8Dynamic {
        /// How many run-time scales an activation gets.
        granularity: ActGranularity,
        /// SmoothQuant strength (`None`: no SmoothQuant).
        smoothquant: Option<f32>,
    },
    /// Weight-only INT4 blocks (`MatMulNBits`).
    Int4 {
        /// Block settings.
        int4: Int4Options,
        /// AWQ scales searched on the calibration samples first.
        awq: bool,
    },
    /// FP8 E4M3 weights; activations too when calibration samples are given.
    Fp8 {
        /// How activation ranges are chosen.
        observer: Observer,
    },
    /// Float16 weights widened by a `Cast` the runtime folds at load.
    Fp16,
    /// Per-node schemes from a precision map (`--quant mixed --precision-map MAP.toml`).
    Map {
        /// The map.
        map: Box<PrecisionMap>,
        /// The observer of the calibrated nodes the map does not give one.
        observer: Observer,
        /// The INT4 settings of the INT4 nodes the map does not set.
        int4: Int4Options,
    },
    /// The most compressed per-node schemes that keep the end-to-end cosine of the main output
    /// at or above `cosine` on the calibration samples; the chosen map is in the report.
    Auto {
        /// The target cosine, in `[0, 1]`.
        cosine: f64,
        /// How activation ranges are chosen.
        observer: ObserverChoice,
        /// The INT4 candidates' block settings.
        int4: Int4Options,
    },
}

impl Precision {
    /// `scheme` for the whole model with its default settings.
    pub fn of(scheme: Scheme) -> Precision {
        match scheme {
            Scheme::Float => Precision::Float,
            Scheme::Int8 => Precision::Int8 {
                observer: ObserverChoice::default(),
                smoothquant: None,
            },
            Scheme::Int8Dynamic => Precision::Int8Dynamic {
                granularity: ActGranularity::PerTensor,
                smoothquant: None,
            },
            Scheme::Int4 => Precision::Int4 {
                int4: Int4Options::default(),
                awq: false,
            },
            Scheme::Fp8 => Precision::Fp8 {
                observer: Observer::MinMax,
            },
            Scheme::Fp16 => Precision::Fp16,
        }
    }

    /// `--auto cosine` with the default observer and INT4 settings.
    pub fn auto(cosine: f64) -> Precision {
        Precision::Auto {
            cosine,
            observer: ObserverChoice::default(),
            int4: Int4Options::default(),
        }
    }

    /// A precision map with the default observer and INT4 settings.
    pub fn map(map: PrecisionMap) -> Precision {
        Precision::Map {
            map: Box::new(map),
            observer: Observer::MinMax,
            int4: Int4Options::default(),
        }
    }

    /// Whether the plan quantizes anything.
    pub fn quantizes(&self) -> bool {
        !matches!(self, Precision::Float)
    }

    /// The plan as `--quant` names it (`auto` for `--auto`); `None` for float.
    pub fn name(&self) -> Option<&'static str> {
        Some(match self {
            Precision::Float => return None,
            Precision::Int8 { .. } => "int8",
            Precision::Int8Dynamic { .. } => "int8-dynamic",
            Precision::Int4 { .. } => "int4",
            Precision::Fp8 { .. } => "fp8",
            Precision::Fp16 => "fp16",
            Precision::Map { .. } => "mixed",
            Precision::Auto { .. } => "auto",
        })
    }

    /// The observer, where the plan calibrates (minmax elsewhere).
    pub(crate) fn observer(&self) -> ObserverChoice {
        match self {
            Precision::Int8 { observer, .. } | Precision::Auto { observer, .. } => *observer,
            Precision::Fp8 { observer } | Precision::Map { observer, .. } => {
                ObserverChoice::Fixed(*observer)
            }
            _ => ObserverChoice::default(),
        }
    }

    /// The INT4 settings, where the plan has INT4 nodes (the defaults elsewhere).
    pub(crate) fn int4(&self) -> Int4Options {
        match self {
            Precision::Int4 { int4, .. }
            | Precision::Map { int4, .. }
            | Precision::Auto { int4, .. } => *int4,
            _ => Int4Options::default(),
        }
    }

    /// The run-time activation granularity of `int8-dynamic` (per tensor elsewhere).
    pub(crate) fn granularity(&self) -> ActGranularity {
        match self {
            Precision::Int8Dynamic { granularity, .. } => *granularity,
            _ => ActGranularity::PerTensor,
        }
    }

    /// The SmoothQuant strength of the INT8 schemes.
    pub(crate) fn smoothquant(&self) -> Option<f32> {
        match self {
            Precision::Int8 { smoothquant, .. } | Precision::Int8Dynamic { smoothquant, .. } => {
                *smoothquant
            }
            _ => None,
        }
    }
}

/// How activation ranges are chosen (`--observer`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ObserverChoice {
    /// One observer.
    Fixed(Observer),
    /// `auto`: the observer of [`ObserverChoice::MEASURED`] whose INT8 model measures best
    /// (main output's cosine on samples kept from the calibration; `--quant int8` and `--auto`).
    Measured,
}

impl ObserverChoice {
    /// The observers `auto` compares, in order of preference on a tie.
    pub const MEASURED: [Observer; 4] = [
        Observer::MinMax,
        Observer::Percentile { percentile: 99.99 },
        Observer::Entropy,
        Observer::Mse,
    ];
}

impl ObserverChoice {
    /// The observer of a step that does not compare them (only [`Precision::Int8`] and
    /// [`Precision::Auto`] hold `Measured`): `Measured` stands for minmax.
    pub fn fixed(self) -> Observer {
        match self {
            ObserverChoice::Fixed(o) => o,
            ObserverChoice::Measured => Observer::MinMax,
        }
    }
}

impl Default for ObserverChoice {
    fn default() -> Self {
        ObserverChoice::Fixed(Observer::MinMax)
    }
}

impl fmt::Display for ObserverChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserverChoice::Fixed(o) => o.fmt(f),
            ObserverChoice::Measured => f.write_str("auto"),
        }
    }
}

impl FromStr for ObserverChoice {
    type Err = mmq_passes::quant::calibrate::CalibError;

    /// `auto`, or an [`Observer`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            Ok(ObserverChoice::Measured)
        } else {
            s.parse().map(ObserverChoice::Fixed)
        }
    }
}

/// How much accuracy measurement a compilation does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accuracy {
    /// None.
    Off,
    /// When the plan quantizes: the end-to-end cosine of the main output on the held-back
    /// quarter of the samples.
    #[default]
    EndToEnd,
    /// Per-layer SQNR and cosine plus the end-to-end figures (also when nothing is quantized).
    Full,
}

/// A progress event of a long step (calibration), for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress<'a> {
    /// A step starts; `total` samples when known.
    Start {
        /// What runs (`calibrating`).
        what: &'a str,
        /// How many samples.
        total: Option<usize>,
    },
    /// One more sample is done.
    Advance,
    /// The step ended.
    Finish,
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(Progress<'_>) + Send + Sync>;

/// Everything a compilation is asked to do.
#[derive(Clone)]
pub struct CompileOptions {
    /// The target.
    pub target: TargetRef,
    /// The optimization level.
    pub level: OptLevel,
    /// What is quantized, and how.
    pub precision: Precision,
    /// The samples calibration and accuracy measurement run on.
    pub calibration: CalibrationSource,
    /// Which INT8 and INT4 units stay integer.
    pub placement: Placement,
    /// A weight holding NaN or an infinity keeps its node in float (with a warning naming both)
    /// instead of failing the compile (`--skip-non-finite`).
    pub skip_non_finite: bool,
    /// Modality overrides (input name, label) for precision maps and `--auto`.
    pub modality: Vec<(String, Modality)>,
    /// Accuracy measurement after compiling.
    pub accuracy: Accuracy,
    /// Quantized KV-cache inputs and outputs (`--kv-cache`).
    pub kv_cache: Option<CacheFormat>,
    /// Vision feature outputs as INT4 groups (`--image-cache int4`).
    pub image_cache: Option<CacheFormat>,
    /// Split a merged multimodal graph into a vision encoder and a language graph before
    /// anything else (`--split`; implied by `image_cache`). See [`mmq_passes::split`].
    pub split: bool,
    /// Keep the module text after the selected passes in the report.
    pub dump_after: Option<DumpAfter>,
    /// Verify the module before the first pass and after each one (on in debug builds).
    pub verify: bool,
    /// Called as calibration advances.
    pub progress: Option<ProgressFn>,
    /// The output the accuracy figures and `--auto` measure (`--main-output`); `None`: the
    /// first floating-point output named like logits, an embedding or a pooled output, else
    /// the first floating-point one ([`mmq_passes::quant::report::main_output`]).
    pub main_output: Option<String>,
    /// Once set, the compilation stops at its next check (between passes, before each
    /// calibration sample) with [`crate::CompileError::Interrupted`].
    pub interrupt: Option<mmq_passes::Interrupt>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            target: TargetRef::ORT,
            level: OptLevel::O2,
            precision: Precision::Float,
            calibration: CalibrationSource::Default,
            placement: Placement::Cost,
            skip_non_finite: false,
            modality: Vec::new(),
            accuracy: Accuracy::EndToEnd,
            kv_cache: None,
            image_cache: None,
            split: false,
            dump_after: None,
            verify: cfg!(debug_assertions),
            progress: None,
            main_output: None,
            interrupt: None,
        }
    }
}

impl fmt::Debug for CompileOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompileOptions")
            .field("target", &self.target)
            .field("level", &self.level)
            .field("precision", &self.precision)
            .field("calibration", &self.calibration)
            .field("placement", &self.placement)
            .field("skip_non_finite", &self.skip_non_finite)
            .field("modality", &self.modality)
            .field("accuracy", &self.accuracy)
            .field("kv_cache", &self.kv_cache)
            .field("image_cache", &self.image_cache)
            .field("split", &self.split)
            .field("dump_after", &self.dump_after)
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

/// The quantization settings as a front end takes them, one by one (flags, keywords): what was
/// given, each independent of the others. [`QuantFlags::precision`] turns them into the
/// [`Precision`] they name, refusing a setting its scheme does not take.
#[derive(Clone, Debug, Default)]
pub struct QuantFlags {
    /// `--quant`.
    pub quant: Option<Quant>,
    /// `--precision-map` (loaded; implies `--quant mixed`).
    pub map: Option<PrecisionMap>,
    /// `--auto COSINE`.
    pub auto: Option<f64>,
    /// `--observer`.
    pub observer: Option<ObserverChoice>,
    /// `--smoothquant ALPHA`.
    pub smoothquant: Option<f32>,
    /// `--awq`.
    pub awq: bool,
    /// `--block`.
    pub block: Option<usize>,
    /// `--asym`.
    pub asym: bool,
    /// `--int4-accuracy-level`.
    pub int4_accuracy_level: Option<i64>,
    /// `--granularity`.
    pub granularity: Option<ActGranularity>,
}

impl QuantFlags {
    /// The precision plan the settings name.
    pub fn precision(self) -> Result<Precision, OptionError> {
        let plan = match (self.auto, self.quant, self.map) {
            (Some(_), Some(_), _) => {
                return Err(OptionError::Conflict {
                    option: Opt::Auto,
                    with: Opt::Quant,
                });
            }
            (Some(_), None, Some(_)) => {
                return Err(OptionError::Conflict {
                    option: Opt::Auto,
                    with: Opt::PrecisionMap,
                });
            }
            (Some(cosine), None, None) => Plan::Auto(cosine),
            (None, Some(Quant::Mixed), None) => return Err(OptionError::MixedWithoutMap),
            (None, Some(Quant::One(s)), Some(_)) => return Err(OptionError::MapWithScheme(s)),
            (None, _, Some(map)) => Plan::Map(Box::new(map)),
            (None, Some(Quant::One(s)), None) => Plan::One(s),
            (None, None, None) => Plan::One(Scheme::Float),
        };
        let given = plan.name();
        let refuse = |option: Opt, value: Option<String>, takes: &'static [Takes]| {
            Err(OptionError::NotFor {
                option,
                value,
                takes,
                given,
            })
        };
        let int4_plan = matches!(plan, Plan::One(Scheme::Int4) | Plan::Map(_) | Plan::Auto(_));
        const INT8: &[Takes] = &[Takes::Quant("int8"), Takes::Quant("int8-dynamic")];
        const INT4: &[Takes] = &[Takes::Quant("int4"), Takes::Quant("mixed"), Takes::Auto];
        if self.smoothquant.is_some()
            && !matches!(plan, Plan::One(Scheme::Int8 | Scheme::Int8Dynamic))
        {
            return refuse(Opt::SmoothQuant, None, INT8);
        }
        if self.awq && !matches!(plan, Plan::One(Scheme::Int4)) {
            return refuse(Opt::Awq, None, &[Takes::Quant("int4")]);
        }
        for (option, given) in [
            (Opt::Block, self.block.map(|b| b.to_string())),
            (Opt::Asym, self.asym.then(String::new)),
            (
                Opt::Int4AccuracyLevel,
                self.int4_accuracy_level.map(|l| l.to_string()),
            ),
        ] {
            if given.is_some() && !int4_plan {
                return refuse(option, given.filter(|v| !v.is_empty()), INT4);
            }
        }
        if let Some(g) = self.granularity
            && !matches!(plan, Plan::One(Scheme::Int8Dynamic))
        {
            return refuse(
                Opt::Granularity,
                Some(g.to_string()),
                &[Takes::Quant("int8-dynamic")],
            );
        }
        match self.observer {
            Some(ObserverChoice::Measured)
                if !matches!(plan, Plan::One(Scheme::Int8) | Plan::Auto(_)) =>
            {
                return refuse(
                    Opt::Observer,
                    Some("auto".to_owned()),
                    &[Takes::Quant("int8"), Takes::Auto],
                );
            }
            Some(o)
                if !matches!(
                    plan,
                    Plan::One(Scheme::Int8 | Scheme::Fp8) | Plan::Map(_) | Plan::Auto(_)
                ) =>
            {
                return refuse(
                    Opt::Observer,
                    Some(o.to_string()),
                    &[
                        Takes::Quant("int8"),
                        Takes::Quant("fp8"),
                        Takes::Quant("mixed"),
                        Takes::Auto,
                    ],
                );
            }
            _ => {}
        }
        let observer = self.observer.unwrap_or_default();
        let int4 = Int4Options {
            block: self.block.unwrap_or(Int4Options::default().block),
            symmetric: !self.asym,
            accuracy_level: self.int4_accuracy_level,
        };
        Ok(match plan {
            Plan::One(Scheme::Float) => Precision::Float,
            Plan::One(Scheme::Int8) => Precision::Int8 {
                observer,
                smoothquant: self.smoothquant,
            },
            Plan::One(Scheme::Int8Dynamic) => Precision::Int8Dynamic {
                granularity: self.granularity.unwrap_or_default(),
                smoothquant: self.smoothquant,
            },
            Plan::One(Scheme::Int4) => Precision::Int4 {
                int4,
                awq: self.awq,
            },
            Plan::One(Scheme::Fp8) => Precision::Fp8 {
                observer: observer.fixed(),
            },
            Plan::One(Scheme::Fp16) => Precision::Fp16,
            Plan::Map(map) => Precision::Map {
                map,
                observer: observer.fixed(),
                int4,
            },
            Plan::Auto(cosine) => Precision::Auto {
                cosine,
                observer,
                int4,
            },
        })
    }
}

/// What [`QuantFlags`] name before their settings are attached.
enum Plan {
    One(Scheme),
    Map(Box<PrecisionMap>),
    Auto(f64),
}

impl Plan {
    fn name(&self) -> Option<&'static str> {
        match self {
            Plan::One(Scheme::Float) => None,
            Plan::One(s) => Some(s.name()),
            Plan::Map(_) => Some("mixed"),
            Plan::Auto(_) => Some("auto"),
        }
    }
}

/// An option, for the front ends to name in their own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opt {
    /// `--target`.
    Target,
    /// `--quant`.
    Quant,
    /// `--precision-map`.
    PrecisionMap,
    /// `--auto`.
    Auto,
    /// `--calib`.
    Calib,
    /// `--calib-random`.
    CalibRandom,
    /// `--observer`.
    Observer,
    /// `--smoothquant`.
    SmoothQuant,
    /// `--awq`.
    Awq,
    /// `--block`.
    Block,
    /// `--asym`.
    Asym,
    /// `--int4-accuracy-level`.
    Int4AccuracyLevel,
    /// `--granularity`.
    Granularity,
    /// `--kv-cache`.
    KvCache,
    /// `--image-cache`.
    ImageCache,
    /// `--main-output`.
    MainOutput,
    /// `--dump-after`.
    DumpAfter,
    /// `--report`.
    Report,
    /// `--auto-map`.
    AutoMap,
    /// `--qparams`.
    Qparams,
    /// `--symbol`.
    Symbol,
    /// `--package`.
    Package,
    /// `--generation-config`.
    GenerationConfig,
    /// `--tokenizer`.
    Tokenizer,
}

impl Opt {
    /// The command line's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Opt::Target => "--target",
            Opt::Quant => "--quant",
            Opt::PrecisionMap => "--precision-map",
            Opt::Auto => "--auto",
            Opt::Calib => "--calib",
            Opt::CalibRandom => "--calib-random",
            Opt::Observer => "--observer",
            Opt::SmoothQuant => "--smoothquant",
            Opt::Awq => "--awq",
            Opt::Block => "--block",
            Opt::Asym => "--asym",
            Opt::Int4AccuracyLevel => "--int4-accuracy-level",
            Opt::Granularity => "--granularity",
            Opt::KvCache => "--kv-cache",
            Opt::ImageCache => "--image-cache",
            Opt::MainOutput => "--main-output",
            Opt::DumpAfter => "--dump-after",
            Opt::Report => "--report",
            Opt::AutoMap => "--auto-map",
            Opt::Qparams => "--qparams",
            Opt::Symbol => "--symbol",
            Opt::Package => "--package",
            Opt::GenerationConfig => "--generation-config",
            Opt::Tokenizer => "--tokenizer",
        }
    }
}

/// How a front end writes options and their values in messages.
pub trait Spelling {
    /// The option's name (`--smoothquant`, `smoothquant`).
    fn option(&self, o: Opt) -> String;
    /// The option set to `value` (`--quant int8`, `quant="int8"`).
    fn setting(&self, o: Opt, value: &str) -> String;
    /// Another value of the option just named (`int8-dynamic`, `"int8-dynamic"`).
    fn value(&self, value: &str) -> String;
}

/// The command line's spelling: flags (`--quant int8`). [`OptionError`]'s `Display` uses it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flags;

impl Spelling for Flags {
    fn option(&self, o: Opt) -> String {
        o.flag().to_owned()
    }

    fn setting(&self, o: Opt, value: &str) -> String {
        format!("{} {value}", o.flag())
    }

    fn value(&self, value: &str) -> String {
        value.to_owned()
    }
}

/// What an option applies to, in [`OptionError::NotFor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// `--quant` with this value.
    Quant(&'static str),
    /// `--auto`.
    Auto,
}

/// Options that do not fit together, or a value an option does not take.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionError {
    /// A setting given with a plan it does not apply to.
    NotFor {
        /// The setting.
        option: Opt,
        /// Its value, where the message names it.
        value: Option<String>,
        /// The plans that take it.
        takes: &'static [Takes],
        /// The plan given (`None`: float), as `--quant` names it (`auto` for `--auto`).
        given: Option<&'static str>,
    },
    /// Two options that exclude each other.
    Conflict {
        /// The option.
        option: Opt,
        /// The one it excludes.
        with: Opt,
    },
    /// An option a kind of output does not take yet.
    Unsupported {
        /// The option.
        option: Opt,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// `--quant mixed` without a map.
    MixedWithoutMap,
    /// A precision map with one scheme for the whole model.
    MapWithScheme(Scheme),
    /// A value out of the option's range.
    Value {
        /// The option.
        option: Opt,
        /// The value given.
        value: String,
        /// What it takes.
        expected: String,
    },
    /// The target has no form for what the option asks.
    Target {
        /// The option.
        option: Opt,
        /// Its value, where the message names it.
        value: Option<String>,
        /// The target.
        target: &'static str,
        /// What the target lacks, and what to do instead (may name [`Opt`]s by their flags;
        /// see [`OptionError::message`]).
        why: TargetLacks,
    },
    /// Samples were given that nothing reads.
    SamplesUnread(Opt),
    /// An output was asked for whose content would be empty.
    NothingQuantized(Opt),
    /// An option that needs another.
    Needs {
        /// The option.
        option: Opt,
        /// What it does (the reason it needs the other).
        does: &'static str,
        /// The option it needs.
        needs: Opt,
        /// The value it needs that option set to, if one.
        value: Option<&'static str>,
    },
    /// `--main-output` names no output.
    NoSuchOutput {
        /// The name given.
        name: String,
        /// The model's outputs.
        outputs: Vec<String>,
    },
    /// `--dump-after` names no pass of the run.
    NoSuchPass {
        /// The name given.
        name: String,
        /// The level's digit.
        level: char,
        /// The passes the run has.
        passes: Vec<String>,
    },
}

/// What a target lacks, in [`OptionError::Target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetLacks {
    /// No `MatMulNBits` (`--int4-accuracy-level`).
    MatMulNBits,
    /// Asymmetric INT4 (`--asym`).
    AsymmetricInt4,
    /// Run-time activation quantization (`--quant int8-dynamic`) but per-row scales.
    DynamicActivations,
    /// INT4 image features (`--image-cache`).
    ImageCache,
    /// Other than INT8 KV caches (`--kv-cache`).
    KvCacheFormat,
}

impl OptionError {
    /// The message, with options spelled by `s`.
    pub fn message(&self, s: &dyn Spelling) -> String {
        let named = |o: Opt, value: &Option<String>| match value {
            Some(v) => s.setting(o, v),
            None => s.option(o),
        };
        let plan = |given: Option<&str>| match given {
            None => format!("no {}", s.option(Opt::Quant)),
            Some("auto") => s.option(Opt::Auto),
            Some(q) => s.setting(Opt::Quant, q),
        };
        match self {
            OptionError::NotFor {
                option,
                value,
                takes,
                given,
            } => {
                let mut parts: Vec<String> = Vec::new();
                let mut quants = 0;
                for t in *takes {
                    parts.push(match t {
                        Takes::Quant(q) if quants == 0 => {
                            quants += 1;
                            s.setting(Opt::Quant, q)
                        }
                        Takes::Quant(q) => s.value(q),
                        Takes::Auto => s.option(Opt::Auto),
                    });
                }
                let list = match parts.split_last() {
                    Some((last, rest)) if !rest.is_empty() => {
                        format!("{} or {last}", rest.join(", "))
                    }
                    _ => parts.join(""),
                };
                format!(
                    "{} needs {list}, not {}",
                    named(*option, value),
                    plan(*given)
                )
            }
            OptionError::Conflict { option, with } => format!(
                "{} cannot be used with {}",
                s.option(*option),
                s.option(*with)
            ),
            OptionError::Unsupported { option, why } => format!("{} {why}", s.option(*option)),
            OptionError::MixedWithoutMap => format!(
                "{} needs {}",
                s.setting(Opt::Quant, "mixed"),
                s.option(Opt::PrecisionMap)
            ),
            OptionError::MapWithScheme(q) => format!(
                "{} needs {} (or no {}), not {}",
                s.option(Opt::PrecisionMap),
                s.setting(Opt::Quant, "mixed"),
                s.option(Opt::Quant),
                s.setting(Opt::Quant, q.name())
            ),
            OptionError::Value {
                option,
                value,
                expected,
            } => format!("{}: {expected}", s.setting(*option, value)),
            OptionError::Target {
                option,
                value,
                target,
                why,
            } => {
                let what = named(*option, value);
                match why {
                    TargetLacks::MatMulNBits => format!(
                        "{what} is an attribute of ONNX Runtime's MatMulNBits; target {target} \
                         has none"
                    ),
                    TargetLacks::AsymmetricInt4 => format!(
                        "{what}: target {target} takes symmetric INT4 only (a blockwise \
                         DequantizeLinear without zero points)"
                    ),
                    TargetLacks::DynamicActivations => format!(
                        "{what}: target {target} has no run-time activation quantization but \
                         per-row scales ({} or {}, through its plugin); use {} with {} or {}",
                        s.setting(Opt::Granularity, "per-token"),
                        s.value("per-patch"),
                        s.setting(Opt::Quant, "int8"),
                        s.option(Opt::Calib),
                        s.option(Opt::CalibRandom)
                    ),
                    TargetLacks::ImageCache => format!(
                        "{what}: target {target} has no plugin for INT4 image features yet; \
                         compile the vision model for ort"
                    ),
                    TargetLacks::KvCacheFormat => format!(
                        "{what}: target {target} writes KV caches as int8 blocks through its \
                         plugins ({})",
                        s.setting(Opt::KvCache, "int8")
                    ),
                }
            }
            OptionError::SamplesUnread(o) => format!(
                "{}: nothing is quantized (no {}, {} or {}) and no {} analyses the activations, \
                 so the samples would not be read; add {} (or another scheme), or leave it out",
                s.option(*o),
                s.option(Opt::Quant),
                s.option(Opt::PrecisionMap),
                s.option(Opt::Auto),
                s.option(Opt::Report),
                s.setting(Opt::Quant, "int8")
            ),
            OptionError::NothingQuantized(o) => format!(
                "{}: nothing is quantized (no {}, {} or {}), so the table would be empty; add {} \
                 (or another scheme), or leave it out",
                s.option(*o),
                s.option(Opt::Quant),
                s.option(Opt::PrecisionMap),
                s.option(Opt::Auto),
                s.setting(Opt::Quant, "int8")
            ),
            OptionError::Needs {
                option,
                does,
                needs,
                value,
            } => format!(
                "{} {does}; it needs {}",
                s.option(*option),
                match value {
                    Some(v) => s.setting(*needs, v),
                    None => s.option(*needs),
                }
            ),
            OptionError::NoSuchOutput { name, outputs } => format!(
                "{}: the model has no output of that name (outputs: {})",
                s.setting(Opt::MainOutput, name),
                outputs.join(", ")
            ),
            OptionError::NoSuchPass {
                name,
                level,
                passes,
            } => {
                let known = if passes.is_empty() {
                    format!("-O{level} runs no passes")
                } else {
                    format!("passes at -O{level}: {}", passes.join(", "))
                };
                format!(
                    "{}: no such pass ({known}, or all)",
                    s.setting(Opt::DumpAfter, name)
                )
            }
        }
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message(&Flags))
    }
}

impl std::error::Error for OptionError {}

impl CompileOptions {
    /// Checks that the options fit together and that each value is in its range.
    pub fn check(&self) -> Result<(), OptionError> {
        self.calibration.check()?;
        // Samples are read to quantize, and by the full report's per-layer analysis.
        if self.calibration.is_given()
            && !self.precision.quantizes()
            && self.accuracy != Accuracy::Full
        {
            return Err(OptionError::SamplesUnread(self.calibration.option()));
        }
        let target = self.target.name();
        let rules = self.target.qdq_rules();
        if let Some(alpha) = self.precision.smoothquant()
            && !(0.0..=1.0).contains(&alpha)
        {
            return Err(OptionError::Value {
                option: Opt::SmoothQuant,
                value: alpha.to_string(),
                expected: "alpha must be in [0, 1] (0.5 is usual)".to_owned(),
            });
        }
        if let Precision::Int4 { int4, .. }
        | Precision::Map { int4, .. }
        | Precision::Auto { int4, .. } = &self.precision
        {
            // A map's INT4 settings are defaults its rules may override (the map checks its own).
            let whole_plan = !matches!(self.precision, Precision::Map { .. });
            if whole_plan && !matches!(int4.block, 16 | 32 | 64 | 128 | 256) {
                return Err(OptionError::Value {
                    option: Opt::Block,
                    value: int4.block.to_string(),
                    expected: "expected 32, 64 or 128 (16 and 256 also work)".to_owned(),
                });
            }
            if let Some(level) = int4.accuracy_level {
                if !(0..=4).contains(&level) {
                    return Err(OptionError::Value {
                        option: Opt::Int4AccuracyLevel,
                        value: level.to_string(),
                        expected: "expected 0 (left out), 1 (f32), 2 (f16), 3 (bf16) or 4 (int8)"
                            .to_owned(),
                    });
                }
                if level != 0 && !rules.int4_matmul_nbits {
                    return Err(OptionError::Target {
                        option: Opt::Int4AccuracyLevel,
                        value: None,
                        target,
                        why: TargetLacks::MatMulNBits,
                    });
                }
            }
            if whole_plan && !rules.int4_matmul_nbits && !rules.plugins && !int4.symmetric {
                return Err(OptionError::Target {
                    option: Opt::Asym,
                    value: None,
                    target,
                    why: TargetLacks::AsymmetricInt4,
                });
            }
        }
        if let Precision::Int8Dynamic { granularity, .. } = self.precision
            && !rules.dynamic_activations
            && !(rules.plugins && granularity.per_row())
        {
            return Err(OptionError::Target {
                option: Opt::Quant,
                value: Some("int8-dynamic".to_owned()),
                target,
                why: TargetLacks::DynamicActivations,
            });
        }
        if let Some(f) = self.image_cache
            && f != CacheFormat::Int4
        {
            return Err(OptionError::Value {
                option: Opt::ImageCache,
                value: f.to_string(),
                expected: "image features are cached as int4 (groups of 64)".to_owned(),
            });
        }
        if !rules.cache_io {
            if self.image_cache.is_some() {
                return Err(OptionError::Target {
                    option: Opt::ImageCache,
                    value: None,
                    target,
                    why: TargetLacks::ImageCache,
                });
            }
            if let Some(f) = self.kv_cache
                && !(rules.plugins && f == CacheFormat::Int8)
            {
                return Err(OptionError::Target {
                    option: Opt::KvCache,
                    value: Some(f.to_string()),
                    target,
                    why: TargetLacks::KvCacheFormat,
                });
            }
        }
        if let Precision::Auto { cosine, .. } = self.precision
            && !(0.0..=1.0).contains(&cosine)
        {
            return Err(OptionError::Value {
                option: Opt::Auto,
                value: cosine.to_string(),
                expected: "not a cosine in [0, 1] (for example 0.99)".to_owned(),
            });
        }
        Ok(())
    }
}
