//! What a compilation is asked to do.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use mmq_ir::modality::Modality;
use mmq_kernels::cache::CacheFormat;
use mmq_passes::quant::calibrate::Observer;
use mmq_passes::quant::int8::ActGranularity;
use mmq_passes::quant::place::Placement;
use mmq_passes::quant::precision::PrecisionMap;
use mmq_passes::{DumpAfter, OptLevel, TargetRef};

use crate::calibration::CalibrationSource;

/// One quantization scheme for the whole model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// Static W8A8: weights per channel, activations calibrated per tensor.
    Int8,
    /// Weights INT8, activations quantized at run time.
    Int8Dynamic,
    /// Weight-only INT4 blocks (`MatMulNBits`).
    Int4,
    /// FP8 E4M3 weights; activations too when calibration samples are given.
    Fp8,
    /// Float16 weights widened by a `Cast` the runtime folds at load.
    Fp16,
}

impl QuantScheme {
    /// Every scheme, in the order help texts list them.
    pub const ALL: [QuantScheme; 5] = [
        QuantScheme::Int8,
        QuantScheme::Int8Dynamic,
        QuantScheme::Int4,
        QuantScheme::Fp8,
        QuantScheme::Fp16,
    ];

    /// The scheme's name as `--quant` takes it.
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::Int8 => "int8",
            QuantScheme::Int8Dynamic => "int8-dynamic",
            QuantScheme::Int4 => "int4",
            QuantScheme::Fp8 => "fp8",
            QuantScheme::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for QuantScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantScheme {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        QuantScheme::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown scheme '{s}' (expected {}, or a precision map)",
                    QuantScheme::ALL.map(QuantScheme::name).join(", ")
                )
            })
    }
}

/// The precision plan of a compilation: what `--quant`, `--precision-map` and `--auto` become.
#[derive(Clone, Debug, Default)]
pub enum Precision {
    /// No quantization.
    #[default]
    Float,
    /// One scheme for every node it applies to.
    Scheme(QuantScheme),
    /// Per-node schemes from a precision map (`--quant mixed --precision-map MAP.toml`).
    Map(Box<PrecisionMap>),
    /// The most compressed per-node schemes that keep the end-to-end cosine of the main output
    /// at or above `cosine` on the calibration samples; the chosen map is in the report.
    Auto {
        /// The target cosine, in `[0, 1]`.
        cosine: f64,
    },
}

impl Precision {
    /// Whether the plan quantizes anything.
    pub fn quantizes(&self) -> bool {
        !matches!(self, Precision::Float)
    }

    /// The single scheme, for the checks that pair options with one.
    fn name(&self) -> Option<&'static str> {
        match self {
            Precision::Float => None,
            Precision::Scheme(s) => Some(s.name()),
            Precision::Map(_) => Some("mixed"),
            Precision::Auto { .. } => Some("auto"),
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
    /// The observer of a scheme that does not compare them: `Measured` is refused there by
    /// [`CompileOptions::check`], and stands for minmax.
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

/// INT4 block settings (`--quant int4`, `--awq`, and the INT4 candidates of `--auto`).
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
    /// How activation ranges are chosen.
    pub observer: ObserverChoice,
    /// Which INT8 units stay integer.
    pub placement: Placement,
    /// SmoothQuant strength before INT8 (`None`: no SmoothQuant).
    pub smoothquant: Option<f32>,
    /// AWQ scales before INT4.
    pub awq: bool,
    /// INT4 block settings.
    pub int4: Int4Options,
    /// Run-time activation scales of `int8-dynamic` (`--granularity`).
    pub granularity: ActGranularity,
    /// A weight holding NaN or an infinity keeps its node in float (with a warning naming both)
    /// instead of failing the compile (`--skip-non-finite`; `--quant int8`, `int8-dynamic`,
    /// `int4`, `fp8`).
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
            observer: ObserverChoice::default(),
            placement: Placement::Cost,
            smoothquant: None,
            awq: false,
            int4: Int4Options::default(),
            granularity: ActGranularity::PerTensor,
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
            .field("observer", &self.observer)
            .field("placement", &self.placement)
            .field("smoothquant", &self.smoothquant)
            .field("awq", &self.awq)
            .field("int4", &self.int4)
            .field("granularity", &self.granularity)
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

impl CompileOptions {
    /// Checks that the options fit together; the message names the command-line flags (the
    /// Python keywords have the same names).
    pub fn check(&self) -> Result<(), String> {
        self.calibration.check()?;
        // Samples are read to quantize, and by the full report's per-layer analysis.
        if self.calibration.is_given()
            && !self.precision.quantizes()
            && self.accuracy != Accuracy::Full
        {
            return Err(format!(
                "{}: nothing is quantized (no --quant, --precision-map or --auto) and no --report \
                 analyses the activations, so the samples would not be read; add --quant int8 \
                 (or another scheme), or leave it out",
                self.calibration.flag()
            ));
        }
        let scheme = self.precision.name();
        let named = |s: Option<&str>| s.map_or("no --quant".to_owned(), |s| format!("--quant {s}"));
        if let Some(alpha) = self.smoothquant {
            if !(0.0..=1.0).contains(&alpha) {
                return Err(format!(
                    "--smoothquant {alpha}: alpha must be in [0, 1] (0.5 is usual)"
                ));
            }
            if !matches!(scheme, Some("int8" | "int8-dynamic")) {
                return Err(format!(
                    "--smoothquant needs --quant int8 or int8-dynamic, not {}",
                    named(scheme)
                ));
            }
        }
        if self.observer == ObserverChoice::Measured && !matches!(scheme, Some("int8" | "auto")) {
            return Err(format!(
                "--observer auto compares the observers on an INT8 model: it needs --quant int8 \
                 or --auto, not {}",
                named(scheme)
            ));
        }
        if self.awq && scheme != Some("int4") {
            return Err(format!("--awq needs --quant int4, not {}", named(scheme)));
        }
        let int4 = matches!(
            self.precision,
            Precision::Scheme(QuantScheme::Int4) | Precision::Auto { .. }
        );
        if int4 && !matches!(self.int4.block, 16 | 32 | 64 | 128 | 256) {
            return Err(format!(
                "--block {}: expected 32, 64 or 128 (16 and 256 also work)",
                self.int4.block
            ));
        }
        if let Some(level) = self.int4.accuracy_level
            && !(0..=4).contains(&level)
        {
            return Err(format!(
                "--int4-accuracy-level {level}: expected 0 (left out), 1 (f32), 2 (f16), 3 (bf16) or 4 (int8)"
            ));
        }
        if self.int4.accuracy_level.is_some_and(|l| l != 0)
            && !self.target.qdq_rules().int4_matmul_nbits
        {
            return Err(format!(
                "--int4-accuracy-level is an attribute of ONNX Runtime's MatMulNBits; target {} has none",
                self.target.name()
            ));
        }
        if matches!(self.precision, Precision::Scheme(QuantScheme::Fp8)) && !self.int4.symmetric {
            return Err("--asym applies to --quant int4 only".to_owned());
        }
        let rules = self.target.qdq_rules();
        let int4_anywhere = matches!(
            self.precision,
            Precision::Scheme(QuantScheme::Int4) | Precision::Auto { .. }
        );
        if int4_anywhere && !rules.int4_matmul_nbits && !rules.plugins && !self.int4.symmetric {
            return Err(format!(
                "--asym: target {} takes symmetric INT4 only (a blockwise DequantizeLinear \
                 without zero points)",
                self.target
            ));
        }
        if matches!(self.precision, Precision::Scheme(QuantScheme::Int8Dynamic))
            && !rules.dynamic_activations
            && !(rules.plugins && self.granularity.per_row())
        {
            return Err(format!(
                "--quant int8-dynamic: target {} has no run-time activation quantization but \
                 per-row scales (--granularity per-token or per-patch, through its plugin); use \
                 --quant int8 with --calib or --calib-random",
                self.target
            ));
        }
        if self.granularity.per_row()
            && !matches!(self.precision, Precision::Scheme(QuantScheme::Int8Dynamic))
        {
            return Err(format!(
                "--granularity {}: activation scales per row are computed at run time; they need \
                 --quant int8-dynamic, not {}",
                self.granularity,
                named(scheme)
            ));
        }
        if let Some(f) = self.image_cache
            && f != CacheFormat::Int4
        {
            return Err(format!(
                "--image-cache {f}: image features are cached as int4 (groups of 64)"
            ));
        }
        if !rules.cache_io {
            if self.image_cache.is_some() {
                return Err(format!(
                    "--image-cache: target {} has no plugin for INT4 image features yet; \
                     compile the vision model for ort",
                    self.target
                ));
            }
            if let Some(f) = self.kv_cache
                && !(rules.plugins && f == CacheFormat::Int8)
            {
                return Err(format!(
                    "--kv-cache {f}: target {} writes KV caches as int8 blocks through its \
                     plugins (--kv-cache int8)",
                    self.target
                ));
            }
        }
        if let Precision::Auto { cosine } = self.precision
            && !(0.0..=1.0).contains(&cosine)
        {
            return Err(format!(
                "--auto {cosine}: not a cosine in [0, 1] (for example 0.99)"
            ));
        }
        Ok(())
    }
}
