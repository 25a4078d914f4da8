//! Where calibration samples come from: one [`CalibrationSource`] for every pass that needs
//! samples (static INT8, FP8 activations, SmoothQuant, AWQ, mixed precision, `--auto`, the
//! accuracy figures).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mmq_ir::{GraphId, Module};
use mmq_passes::quant::calibrate::{self, CalibError, Sample};

/// Samples drawn when no source is given.
pub const DEFAULT_RANDOM_SAMPLES: usize = 16;

/// The most random samples a calibration draws ([`CalibrationSource::check`]).
pub const MAX_RANDOM_SAMPLES: usize = 65_536;

/// The samples the passes calibrate on.
#[derive(Clone, Default)]
pub enum CalibrationSource {
    /// [`DEFAULT_RANDOM_SAMPLES`] random samples with seed 0: what a run that names no source
    /// gets.
    #[default]
    Default,
    /// A folder of `.npz` files, one sample each (arrays named after the graph inputs), read in
    /// name order, one at a time.
    Dir(PathBuf),
    /// `count` random samples drawn from the input types (see
    /// [`calibrate::random_samples`]) with generator seed `seed`.
    Random {
        /// How many.
        count: usize,
        /// The generator seed.
        seed: u64,
    },
    /// Samples from any iterator (a data reader). It is drained on first use and its samples
    /// are kept, so every pass that needs them sees the same ones.
    Stream(Arc<SampleStream>),
}

impl fmt::Debug for CalibrationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalibrationSource::Default => f.write_str("Default"),
            CalibrationSource::Dir(d) => f.debug_tuple("Dir").field(d).finish(),
            CalibrationSource::Random { count, seed } => f
                .debug_struct("Random")
                .field("count", count)
                .field("seed", seed)
                .finish(),
            CalibrationSource::Stream(_) => f.write_str("Stream(..)"),
        }
    }
}

/// A boxed iterator of samples.
pub type Samples<'m> = Box<dyn Iterator<Item = Result<Sample, CalibError>> + 'm>;

/// The iterator behind [`CalibrationSource::Stream`] and the samples it gave so far.
pub struct SampleStream {
    state: Mutex<StreamState>,
}

struct StreamState {
    rest: Option<Box<dyn Iterator<Item = Result<Sample, String>> + Send>>,
    seen: Vec<Sample>,
}

impl SampleStream {
    /// A stream over samples already in memory.
    pub fn of(samples: Vec<Sample>) -> SampleStream {
        SampleStream {
            state: Mutex::new(StreamState {
                rest: None,
                seen: samples,
            }),
        }
    }

    /// The sample at `index`, pulling from the iterator when it has not been reached yet.
    fn get(&self, index: usize) -> Option<Result<Sample, CalibError>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.seen.len() <= index {
            let next = st.rest.as_mut()?.next();
            match next {
                Some(Ok(s)) => st.seen.push(s),
                Some(Err(message)) => {
                    st.rest = None;
                    return Some(Err(CalibError::Module(format!(
                        "calibration sample {}: {message}",
                        st.seen.len()
                    ))));
                }
                None => {
                    st.rest = None;
                    return None;
                }
            }
        }
        Some(Ok(st.seen[index].clone()))
    }
}

impl CalibrationSource {
    /// A source over any iterator of samples (input name → value); an `Err` item stops
    /// calibration with its message.
    pub fn stream<I>(samples: I) -> CalibrationSource
    where
        I: IntoIterator<Item = Result<Sample, String>>,
        I::IntoIter: Send + 'static,
    {
        CalibrationSource::Stream(Arc::new(SampleStream {
            state: Mutex::new(StreamState {
                rest: Some(Box::new(samples.into_iter())),
                seen: Vec::new(),
            }),
        }))
    }

    /// Whether the caller named the samples (a folder, a count or an iterator) rather than
    /// leaving the default.
    pub fn is_given(&self) -> bool {
        !matches!(self, CalibrationSource::Default)
    }

    /// The option that gave the samples.
    pub fn option(&self) -> crate::Opt {
        match self {
            CalibrationSource::Random { .. } => crate::Opt::CalibRandom,
            _ => crate::Opt::Calib,
        }
    }

    /// `e` as a message that points at the data: a sample of a folder that does not fit the
    /// graph is named by its file, with the arrays the file holds and the inputs the graph
    /// reads.
    pub fn explain(&self, m: &Module, graph: GraphId, e: &CalibError) -> String {
        let (CalibrationSource::Dir(dir), CalibError::Run { index, message }) = (self, e) else {
            return e.to_string();
        };
        let files = calibrate::npz_paths(dir).unwrap_or_default();
        let Some(file) = files.get(*index) else {
            return e.to_string();
        };
        // The headers say what the file holds; its arrays need not be inflated again.
        let mut holds: Vec<String> = mmq_kernels::io::npz_headers(file)
            .map(|a| {
                a.into_iter()
                    .map(|h| format!("{} {}{:?}", h.name, h.dtype, h.shape))
                    .collect()
            })
            .unwrap_or_default();
        holds.sort();
        let reads: Vec<String> = m.graphs[graph]
            .inputs
            .iter()
            .filter_map(|&v| {
                let name = m.values[v].name.as_deref()?;
                Some(format!(
                    "{name} {}",
                    mmq_ir::text::type_text(m, m.value_type(v))
                ))
            })
            .collect();
        format!(
            "{}: {message}; the file holds {}; the graph reads {}",
            file.display(),
            if holds.is_empty() {
                "no arrays".to_owned()
            } else {
                holds.join(", ")
            },
            reads.join(", ")
        )
    }

    /// Checks what can be checked before the work: a count of zero, or more random samples
    /// than [`MAX_RANDOM_SAMPLES`] (calibration keeps them, so 2^64 of them would run until
    /// memory ran out).
    pub fn check(&self) -> Result<(), crate::OptionError> {
        let &CalibrationSource::Random { count, .. } = self else {
            return Ok(());
        };
        let expected = if count == 0 {
            "need at least one sample".to_owned()
        } else if count > MAX_RANDOM_SAMPLES {
            format!(
                "at most {MAX_RANDOM_SAMPLES} random samples (ranges settle within a few \
                 hundred; calibrate on more real data from files)"
            )
        } else {
            return Ok(());
        };
        Err(crate::OptionError::Value {
            option: crate::Opt::CalibRandom,
            value: count.to_string(),
            expected,
        })
    }

    /// How many samples the source gives, when known before reading them.
    pub fn len_hint(&self) -> Option<usize> {
        match self {
            CalibrationSource::Default => Some(DEFAULT_RANDOM_SAMPLES),
            CalibrationSource::Random { count, .. } => Some(*count),
            CalibrationSource::Dir(dir) => Some(npz_files(dir)),
            CalibrationSource::Stream(s) => {
                let st = s.state.lock().unwrap_or_else(|e| e.into_inner());
                st.rest.is_none().then_some(st.seen.len())
            }
        }
    }

    /// The samples for `graph` of `m`, streamed (a folder is read one file at a time).
    pub fn samples<'m>(&'m self, m: &'m Module, graph: GraphId) -> Result<Samples<'m>, CalibError> {
        Ok(match self {
            CalibrationSource::Default => Box::new(calibrate::random_samples(
                m,
                graph,
                DEFAULT_RANDOM_SAMPLES,
                0,
            )?),
            CalibrationSource::Random { count, seed } => {
                Box::new(calibrate::random_samples(m, graph, *count, *seed)?)
            }
            CalibrationSource::Dir(dir) => Box::new(calibrate::dir_samples(m, graph, dir)?),
            CalibrationSource::Stream(s) => {
                // Each sample is checked against the inputs as it arrives: an endless stream of
                // samples that do not fit stops at the first.
                let s = Arc::clone(s);
                let interp = mmq_kernels::Interpreter::new(m);
                Box::new((0..).map_while(move |i| {
                    let sample = s.get(i)?;
                    Some(sample.and_then(|sample| {
                        let given = sample.iter().filter_map(|(name, v)| {
                            let t = v.as_tensor()?;
                            Some((name.as_str(), t.dtype, &t.shape[..]))
                        });
                        interp
                            .check_shapes(graph, given)
                            .map_err(|e| CalibError::Run {
                                index: i,
                                message: e.to_string(),
                            })?;
                        Ok(sample)
                    }))
                }))
            }
        })
    }

    /// [`CalibrationSource::samples`], all read.
    pub fn collect(&self, m: &Module, graph: GraphId) -> Result<Vec<Sample>, CalibError> {
        self.samples(m, graph)?.collect()
    }
}

/// The `.npz` files in `dir` (0 when it cannot be read: reading the samples says why).
fn npz_files(dir: &Path) -> usize {
    calibrate::npz_paths(dir).map_or(0, |f| f.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmq_kernels::{RtValue, Tensor};

    fn sample(x: f32) -> Sample {
        let t = Tensor::from_f32(vec![1], vec![x]).expect("tensor");
        [("x".to_owned(), RtValue::from(t))].into_iter().collect()
    }

    /// A module whose graph takes the samples' input `x: f32[1]`.
    fn module() -> (Module, GraphId) {
        let (m, _) = mmq_ir::text::parse(
            "graph @g(%x: f32[1]) -> (f32[1]) {\n  %y = Relu(%x) : f32[1]\n  return %y\n}\n",
        )
        .expect("parses");
        let g = m.entries[0].graph;
        (m, g)
    }

    #[test]
    fn a_stream_is_read_once_and_replayed() {
        let pulled = Arc::new(Mutex::new(0usize));
        let p = Arc::clone(&pulled);
        let src = CalibrationSource::stream((0..3).map(move |i| {
            *p.lock().expect("lock") += 1;
            Ok(sample(i as f32))
        }));
        assert_eq!(src.len_hint(), None);
        let (m, g) = module();
        let first: Vec<Sample> = src.collect(&m, g).expect("samples");
        let second: Vec<Sample> = src.collect(&m, g).expect("samples");
        assert_eq!(first.len(), 3);
        assert_eq!(second.len(), 3);
        assert_eq!(
            *pulled.lock().expect("lock"),
            3,
            "the iterator is drained once"
        );
        assert_eq!(src.len_hint(), Some(3));
        let xs = |v: &[Sample]| -> Vec<f32> {
            v.iter()
                .map(|s| s["x"].as_tensor().expect("tensor").to_f32().expect("f32")[0])
                .collect()
        };
        assert_eq!(xs(&first), [0.0, 1.0, 2.0]);
        assert_eq!(xs(&second), xs(&first));
    }

    #[test]
    fn a_failing_item_stops_with_its_message() {
        let src = CalibrationSource::stream(vec![Ok(sample(1.0)), Err("bad shape".to_owned())]);
        let (m, g) = module();
        let err = src.collect(&m, g).expect_err("fails");
        assert!(err.to_string().contains("sample 1: bad shape"), "{err}");
    }

    #[test]
    fn a_sample_that_does_not_fit_stops_the_stream_at_once() {
        let pulled = Arc::new(Mutex::new(0usize));
        let p = Arc::clone(&pulled);
        let wide = || {
            let t = Tensor::from_f32(vec![2], vec![0.0, 0.0]).expect("tensor");
            [("x".to_owned(), RtValue::from(t))].into_iter().collect()
        };
        // Endless: only the first is read.
        let src = CalibrationSource::stream(std::iter::repeat_with(move || {
            *p.lock().expect("lock") += 1;
            Ok(wide())
        }));
        let (m, g) = module();
        let err = src.collect(&m, g).expect_err("fails");
        assert!(
            err.to_string()
                .starts_with("sample 0: input x: dim 0 is 2 but must be 1"),
            "{err}"
        );
        assert_eq!(*pulled.lock().expect("lock"), 1);
    }

    #[test]
    fn zero_random_samples_is_refused() {
        let src = CalibrationSource::Random { count: 0, seed: 0 };
        assert!(src.check().is_err());
        assert!(CalibrationSource::Default.check().is_ok());
        let most = |count| CalibrationSource::Random { count, seed: 0 }.check();
        assert!(most(MAX_RANDOM_SAMPLES).is_ok());
        let err = most(usize::MAX).expect_err("2^64 - 1 samples");
        assert!(err.to_string().contains("at most 65536"), "{err}");
    }
}
