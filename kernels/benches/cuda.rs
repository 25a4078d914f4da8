//! GPU benchmark of the CUDA kernels (`cargo bench -p mmq-kernels --bench cuda`): each
//! quantize / dequantize kernel's bandwidth against a device-to-device copy of the same bytes, and
//! the INT4 GEMV against binary16 GEMVs (mmq's dense kernel, and cuBLAS where libcublas loads) on
//! LLaMA-7B shapes at batch 1, 4 and 8, each call on weights outside the L2 cache. Per-call
//! medians of timed runs of calls queued back to back (CUDA events) after warm-up; prints
//! Markdown. Without a GPU it says why and exits 0.

#![allow(
    unsafe_code,
    reason = "the benchmark launches CUDA kernels and cuBLAS through their C APIs"
)]
#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{CudaStream, sys::CUevent_flags};
use half::f16;
use mmq_kernels::cuda::{Buffer, Device, Format, Gemv, GroupScales, NBits, QuantParams, ScaleMap};

const RUNS: usize = 30;
/// Calls queued back to back in one timed run: the per-call time excludes the host's launch
/// latency, as in a decode loop that keeps the stream busy.
const BATCH: usize = 20;

/// Median milliseconds per call of `f` over [`RUNS`] timed runs of [`BATCH`] calls each, after
/// three warm-up calls.
fn time(stream: &Arc<CudaStream>, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut t: Vec<f64> = (0..RUNS)
        .map(|_| {
            let a = stream.record_event(flags).expect("event");
            for _ in 0..BATCH {
                f();
            }
            let b = stream.record_event(flags).expect("event");
            f64::from(a.elapsed_ms(&b).expect("elapsed")) / BATCH as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[RUNS / 2]
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

fn main() {
    let mut dev = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("GPU benchmark not run: {e}");
            return;
        }
    };
    let (major, minor) = dev.capability();
    println!(
        "Device: {} (sm_{major}{minor}); kernels from {:?}; medians of {RUNS} runs of {BATCH} \
         calls queued back to back.\n",
        dev.name(),
        dev.code_source()
    );
    bandwidth(&dev);
    gemv(&mut dev);
}

/// Quantize / dequantize at 64 and 256 MiB of binary16 input, against a copy of the bytes each
/// kernel moves (read + written).
fn bandwidth(dev: &Device) {
    let s = dev.stream().expect("a GPU").clone();
    println!("| kernel | input | GB/s | copy GB/s | ratio |");
    println!("|---|---|---|---|---|");
    for mib in [64usize, 256] {
        let n = mib << 19; // binary16 elements in `mib` MiB
        let x: Vec<f16> = (0..n)
            .map(|i| f16::from_f32(((i * 7919) % 2001) as f32 / 1000.0 - 1.0))
            .collect();
        let d_x = dev.upload(&x).expect("upload");
        let rows = n / 4096;
        let per_channel = ScaleMap::Axis {
            axis_len: 4096,
            inner: 1,
        };
        let per_group = ScaleMap::Group {
            row_len: 4096,
            group: 128,
        };
        for (name, format, map) in [
            ("quantize f16→i8 per tensor", Format::I8, ScaleMap::Tensor),
            ("quantize f16→i8 per channel", Format::I8, per_channel),
            ("quantize f16→i4 per group 128", Format::I4, per_group),
            (
                "quantize f16→e4m3 per tensor",
                Format::E4M3,
                ScaleMap::Tensor,
            ),
        ] {
            let scales = dev.upload(&vec![0.01f32; map.count(n)]).expect("upload");
            let q = QuantParams {
                format,
                map,
                scales: &scales,
                zeros: None,
                saturate: true,
            };
            let mut out = dev.zeros::<u8>(format.bytes(n)).expect("alloc");
            let ms = time(&s, || dev.quantize(&d_x, &q, &mut out).expect("quantize"));
            let moved = 2 * n + format.bytes(n);
            report(dev, name, mib, moved, ms);
            let mut y = dev.zeros::<f16>(n).expect("alloc");
            let name = name.replace("quantize f16→", "dequantize ") + "→f16";
            let ms = time(&s, || dev.dequantize(&out, &q, &mut y).expect("dequantize"));
            report(dev, &name, mib, moved, ms);
        }
        let mut codes = dev.zeros::<u8>(n).expect("alloc");
        let mut scales = dev.zeros::<f32>(rows).expect("alloc");
        let ms = time(&s, || {
            dev.quantize_dynamic(
                &d_x,
                4096,
                4096,
                Format::I8,
                true,
                &mut codes,
                GroupScales::F32(&mut scales),
                None,
            )
            .expect("per token")
        });
        report(dev, "quantize f16→i8 per token (dynamic)", mib, 3 * n, ms);
        // Image features: INT4 groups of 64 with binary16 scales (the warp kernel).
        let mut codes = dev.zeros::<u8>(n / 2).expect("alloc");
        let mut scales = dev.zeros::<f16>(n / 64).expect("alloc");
        let ms = time(&s, || {
            dev.image_features_int4(&d_x, 4096, &mut codes, &mut scales)
                .expect("image features")
        });
        let moved = 2 * n + n / 2 + n / 32;
        report(
            dev,
            "quantize f16→i4 groups of 64 (dynamic)",
            mib,
            moved,
            ms,
        );
    }
    println!();
}

fn report(dev: &Device, name: &str, mib: usize, moved: usize, ms: f64) {
    let half = moved / 2;
    let mut src = dev.zeros::<u8>(half).expect("alloc");
    let mut dst = dev.zeros::<u8>(half).expect("alloc");
    let s = dev.stream().expect("a GPU").clone();
    let copy_ms = time(&s, || {
        s.memcpy_dtod(
            src.slice_mut().expect("a GPU"),
            dst.slice_mut().expect("a GPU"),
        )
        .expect("copy")
    });
    let (g, c) = (gbps(moved, ms), gbps(moved, copy_ms));
    println!(
        "| {name} | {mib} MiB | {g:.0} | {c:.0} | {:.0} % |",
        100.0 * g / c
    );
}

/// Copies of a buffer of `bytes` that together pass 256 MiB, so that the timed runs, which take
/// them in turn, read their weights from device memory and not from the L2 cache (60 MB on an
/// H200), as the layers of a decoded model do.
fn copies(bytes: usize) -> usize {
    (256usize << 20).div_ceil(bytes).max(2)
}

/// INT4 GEMV (block 128, no zero points) against binary16 GEMVs on LLaMA-7B shapes, every run on
/// weights outside the L2 cache ([`copies`]).
fn gemv(dev: &mut Device) {
    let s = dev.stream().expect("a GPU").clone();
    // SAFETY: only tries to load the library.
    let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
        CudaBlas::new(s.clone()).ok()
    } else {
        None
    };
    println!(
        "| N×K | block | batch | INT4 GEMV µs | INT4, first tensor-core kernel µs | \
         INT4, CUDA cores µs | f16 GEMV (mmq) µs | speed-up | cuBLAS f16 µs | speed-up |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // Blocks of 128 and of 32 (mmq's default; the lean kernel's small form, which the first
    // tensor-core kernel does not take).
    for (n, k, block) in [
        (4096usize, 4096usize, 128usize),
        (11008, 4096, 128),
        (4096, 11008, 128),
        (4096, 4096, 32),
        (4096, 11008, 32),
    ] {
        let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 31) as u8).collect();
        let count = copies(packed.len());
        let bs: Vec<Buffer<u8>> = (0..count)
            .map(|_| dev.upload(&packed).expect("upload"))
            .collect();
        let scales = vec![f16::from_f32(0.01); n * k / block];
        let scales: Vec<Buffer<f16>> = (0..count)
            .map(|_| dev.upload(&scales).expect("upload"))
            .collect();
        let dense = vec![f16::from_f32(0.01); n * k];
        let w16s: Vec<Buffer<f16>> = (0..copies(2 * n * k))
            .map(|_| dev.upload(&dense).expect("upload"))
            .collect();
        let ws: Vec<NBits<'_>> = bs
            .iter()
            .zip(&scales)
            .map(|(b, scales)| NBits {
                b,
                scales,
                zeros: None,
                n,
                k,
                block,
            })
            .collect();
        for m in [1usize, 4, 8] {
            let a: Buffer<f16> = dev
                .upload(&vec![f16::from_f32(0.5); m * k])
                .expect("upload");
            let mut y = dev.zeros::<f16>(m * n).expect("alloc");
            let mut turn = 0usize;
            let mut next = |len: usize| {
                turn += 1;
                turn % len
            };
            let t4 = time(&s, || {
                let w = &ws[next(ws.len())];
                dev.nbits_matmul(&a, w, None, &mut y).expect("gemv")
            });
            let chosen = dev.gemv();
            let mut other = |gemv: Gemv| {
                dev.set_gemv(gemv);
                time(&s, || {
                    let w = &ws[next(ws.len())];
                    dev.nbits_matmul(&a, w, None, &mut y).expect("gemv")
                })
            };
            let t4f = (block >= 128).then(|| other(Gemv::TensorCoresFirst));
            let t4c = other(Gemv::CudaCores);
            dev.set_gemv(chosen);
            let t16 = time(&s, || {
                let w16 = &w16s[next(w16s.len())];
                dev.dense_gemv(&a, w16, n, &mut y).expect("gemv")
            });
            let blas_cell = match &blas {
                Some(blas) => {
                    let cfg = GemmConfig {
                        transa: cublasOperation_t::CUBLAS_OP_T,
                        transb: cublasOperation_t::CUBLAS_OP_N,
                        m: n as i32,
                        n: m as i32,
                        k: k as i32,
                        alpha: f16::ONE,
                        lda: k as i32,
                        ldb: k as i32,
                        beta: f16::ZERO,
                        ldc: n as i32,
                    };
                    let tb = time(&s, || {
                        let w16 = &w16s[next(w16s.len())];
                        // SAFETY: W is [N, K], A [M, K] and Y [M, N], as the config says.
                        unsafe {
                            blas.gemm(
                                cfg,
                                w16.slice().expect("a GPU"),
                                a.slice().expect("a GPU"),
                                y.slice_mut().expect("a GPU"),
                            )
                        }
                        .expect("cuBLAS")
                    });
                    format!("{:.1} | {:.2}x", tb * 1e3, tb / t4)
                }
                None => "not run (no libcublas.so.13) | –".into(),
            };
            let first = t4f.map_or("–".into(), |t| format!("{:.1}", t * 1e3));
            println!(
                "| {n}×{k} | {block} | {m} | {:.1} | {first} | {:.1} | {:.1} | {:.2}x | {blas_cell} |",
                t4 * 1e3,
                t4c * 1e3,
                t16 * 1e3,
                t16 / t4
            );
        }
    }
}
