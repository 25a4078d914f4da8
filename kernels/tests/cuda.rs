//! The CUDA layer. Without a GPU (every run): the driver's absence is a clear error, not a panic;
//! the embedded source compiles under NVRTC and names every kernel the launchers use; the fatbin
//! holds SASS for every SM and PTX; bad arguments are errors. Every kernel against
//! [`mmq_kernels::packed`] (quantize bit for bit, dequantize within 1 ulp, the INT4 products within
//! rounding, KV appends bit for bit), through the launchers, on every device there is: the CPU
//! emulator ([`Device::emulated`]) in every run, and the GPU where there is one. The GPU part
//! prints why it skips; `REQUIRE_GPU=1` turns that skip into a failure (and leaves the emulator
//! out: that run is about the device), `MMQ_REQUIRE_CUDA_TOOLS=1` (set by tools/test.sh, which
//! installs nvcc and NVRTC) does the same for the nvcc and NVRTC checks.

use std::io::Write;

use half::{bf16, f16};
use mmq_kernels::cuda::{
    self, CudaError, Device, Format, Gemv, GroupScales, KvCache, NBits, QuantParams, ScaleMap,
};
use mmq_kernels::packed;

/// Prints past the test harness's capture, so skips are visible in every run.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// The GPU, or `None` with the reason printed (a failure under `REQUIRE_GPU=1`).
fn gpu(test: &str) -> Option<Device> {
    match Device::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(!required("REQUIRE_GPU"), "{test}: REQUIRE_GPU=1 but {e}");
            say(&format!("{test}: no GPU part ({e})"));
            None
        }
    }
}

/// The devices a kernel test runs on: the CPU emulator (always, except under `REQUIRE_GPU=1`),
/// then the GPU if there is one.
fn devices(test: &str) -> Vec<Device> {
    let mut all = Vec::new();
    if !required("REQUIRE_GPU") {
        all.push(Device::emulated().expect("the CPU emulator is built wherever the tests build"));
    }
    all.extend(gpu(test));
    all
}

#[test]
fn without_a_driver_opening_a_device_is_an_error_not_a_panic() {
    match Device::new(0) {
        Ok(d) => say(&format!(
            "device 0: {} (sm_{}{}), code from {:?}",
            d.name(),
            d.capability().0,
            d.capability().1,
            d.code_source()
        )),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(e, CudaError::NoDriver | CudaError::Driver { .. }),
                "{msg}"
            );
            if matches!(e, CudaError::NoDriver) {
                assert!(
                    msg.contains("no CUDA driver") && msg.contains("libcuda"),
                    "{msg}"
                );
            }
        }
    }
}

#[test]
fn nvrtc_compiles_the_embedded_source_with_every_kernel() {
    for arch in ["compute_80", "compute_90"] {
        let ptx = match cuda::compile_with_nvrtc(arch) {
            Ok(p) => p,
            Err(CudaError::NoNvrtc(why)) => {
                assert!(
                    !required("MMQ_REQUIRE_CUDA_TOOLS"),
                    "MMQ_REQUIRE_CUDA_TOOLS=1 but NVRTC is missing: {why}"
                );
                say(&format!(
                    "skipping the NVRTC compile check: no NVRTC ({why})"
                ));
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let text = String::from_utf8_lossy(ptx.as_bytes().expect("NVRTC output")).into_owned();
        for name in cuda::kernel_names() {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "{arch}: no kernel {name}"
            );
        }
    }
}

#[test]
fn the_fatbin_holds_sass_for_every_sm_and_ptx() {
    if cuda::FATBIN.is_empty() {
        assert!(
            !required("MMQ_REQUIRE_CUDA_TOOLS"),
            "MMQ_REQUIRE_CUDA_TOOLS=1 but the build had no nvcc (set MMQ_NVCC)"
        );
        say("skipping the fatbin check: built without nvcc (kernels come from NVRTC)");
        return;
    }
    let entries = cuda::fatbin_entries(cuda::FATBIN).expect("a fatbin");
    for (kind, arch) in [(2, 80), (2, 89), (2, 90), (1, 90)] {
        assert!(
            entries.contains(&(kind, arch)),
            "no {} for {arch} in {entries:?}",
            if kind == 1 { "PTX" } else { "SASS" }
        );
    }
    assert_eq!(cuda::FATBIN_ARCHS, ["sm_80", "sm_89", "sm_90"]);
    assert!(
        cuda::NVCC.is_some_and(|v| v.contains("cuda_13")),
        "{:?}",
        cuda::NVCC
    );
    assert_eq!(cuda::fatbin_entries(b"not a fatbin"), None);
}

#[test]
fn arguments_that_do_not_fit_are_errors() {
    let e = cuda::quant_plan(100, Format::I8, &ScaleMap::Tensor, 2, None, 100).unwrap_err();
    assert!(e.to_string().contains("2 scales given, 1 needed"), "{e}");
    let e = cuda::quant_plan(101, Format::I4, &ScaleMap::Tensor, 1, None, 50).unwrap_err();
    assert!(e.to_string().contains("51 needed for 101 i4 codes"), "{e}");
    let e = cuda::quant_plan(64, Format::E4M3, &ScaleMap::Tensor, 1, Some(1), 64).unwrap_err();
    assert!(e.to_string().contains("no zero points"), "{e}");
    let map = ScaleMap::Axis {
        axis_len: 3,
        inner: 5,
    };
    let e = cuda::quant_plan(100, Format::U8, &map, 3, None, 100).unwrap_err();
    assert!(e.to_string().contains("does not fit 100 elements"), "{e}");
    let e = cuda::dynamic_plan(90, 45, 45, Format::I4, 45, 2, None).unwrap_err();
    assert!(e.to_string().contains("must be even"), "{e}");
    let e = cuda::nbits_plan(64, 8, 64, 16, 256, 32, None, None, 8).unwrap_err();
    assert!(e.to_string().contains("block 16"), "{e}");
    let e = cuda::nbits_plan(64, 8, 64, 32, 256, 16, None, None, 7).unwrap_err();
    assert!(e.to_string().contains("7 Y values given, 8 needed"), "{e}");
    assert_eq!(
        cuda::nbits_plan(192, 8, 64, 32, 256, 16, Some(8), Some(8), 24).unwrap(),
        3
    );
}

// ---- GPU tests ----

/// A deterministic pseudo-random stream.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn byte(&mut self) -> u8 {
        (self.unit().to_bits() >> 3) as u8
    }
}

fn values(rng: &mut Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 9 {
            0 => ((i % 40) as f32 - 20.0 + 0.5) * s,
            1 => rng.unit() * 600.0 * s,
            _ => rng.unit() * 130.0 * s,
        })
        .collect()
}

#[test]
fn quantize_and_dequantize_match_the_reference() {
    for dev in devices("quantize_and_dequantize_match_the_reference") {
        let mut rng = Rng(7);
        // A multiple of every map's period (40 and 15) a little under 2^20.
        let n = 120 * 8739;
        for map in [
            ScaleMap::Tensor,
            ScaleMap::Axis {
                axis_len: 5,
                inner: 8,
            },
            ScaleMap::Axis {
                axis_len: 3,
                inner: 5,
            },
            // Channels along the last axis: eight consecutive scales per chunk, and not.
            ScaleMap::Axis {
                axis_len: 40,
                inner: 1,
            },
            ScaleMap::Axis {
                axis_len: 15,
                inner: 1,
            },
            ScaleMap::Group {
                row_len: 40,
                group: 16,
            },
            ScaleMap::Group {
                row_len: 40,
                group: 6,
            },
        ] {
            let x = values(&mut rng, n, 0.01);
            let count = map.count(n);
            let scales: Vec<f32> = (0..count).map(|j| 0.01 * (1.0 + (j % 13) as f32)).collect();
            let d_scales = dev.upload(&scales).unwrap();
            let d_x32 = dev.upload(&x).unwrap();
            let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let d_x16 = dev.upload(&xh).unwrap();
            for format in Format::ALL {
                let zeros: Option<Vec<u8>> = format.range().map(|(lo, hi)| {
                    let codes: Vec<u8> = (0..count)
                        .map(|j| ((lo + (j as i32 % (hi - lo + 1))) & 0xff) as u8)
                        .map(|c| if format.bits() == 4 { c & 0xf } else { c })
                        .collect();
                    packed::pack(format, &codes)
                });
                let d_zeros = zeros.as_ref().map(|z| dev.upload(z).unwrap());
                let q = QuantParams {
                    format,
                    map,
                    scales: &d_scales,
                    zeros: d_zeros.as_ref(),
                    saturate: true,
                };
                let what = format!("{}: {format:?} {map:?}", dev.name());
                let mut out = dev.zeros::<u8>(format.bytes(n)).unwrap();
                dev.quantize(&d_x32, &q, &mut out).unwrap();
                let got = dev.download(&out).unwrap();
                let want = packed::quantize(&x, &map, &scales, zeros.as_deref(), format, true);
                assert!(got == want, "f32 → {what}: codes differ");
                let xh32: Vec<f32> = xh.iter().map(|v| v.to_f32()).collect();
                dev.quantize(&d_x16, &q, &mut out).unwrap();
                let want16 = packed::quantize(&xh32, &map, &scales, zeros.as_deref(), format, true);
                assert!(
                    dev.download(&out).unwrap() == want16,
                    "f16 → {what}: codes differ"
                );
                // Dequantize the codes back, to f32 (bit for bit) and binary16 (1 ulp).
                let exact = packed::dequantize(&want, n, &map, &scales, zeros.as_deref(), format);
                let mut y = dev.zeros::<f32>(n).unwrap();
                dev.dequantize(&out_of(&dev, &want), &q, &mut y).unwrap();
                let y = dev.download(&y).unwrap();
                for (i, (g, w)) in y.iter().zip(&exact).enumerate() {
                    assert!(
                        g.to_bits() == (*w as f32).to_bits() || (g.is_nan() && w.is_nan()),
                        "{what} → f32 element {i}: {g} vs {w}"
                    );
                }
                let mut yh = dev.zeros::<f16>(n).unwrap();
                dev.dequantize(&out_of(&dev, &want), &q, &mut yh).unwrap();
                for (i, (g, w)) in dev.download(&yh).unwrap().iter().zip(&exact).enumerate() {
                    let wb = f16::from_f64(*w).to_bits();
                    let ulps = (i32::from(g.to_bits()) - i32::from(wb)).abs();
                    assert!(
                        ulps <= 1 || (g.is_nan() && w.is_nan()),
                        "{what} → f16 element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// Scales past the range where the kernels divide through a reciprocal (2^-60 ..= 2^60), at its
/// ends and inside it, each with values around it (codes away from 0 and from saturation), per
/// tensor and per chunk of channels: the kernels divide there, and must still match.
#[test]
fn scales_out_of_the_reciprocal_range_match_the_reference() {
    // A subnormal scale's reciprocal overflows: only the division gets its codes right.
    let extremes = [
        f32::from_bits(0x0004_0000),
        2f32.powi(-61),
        2f32.powi(-60),
        0.37,
        2f32.powi(60),
        2f32.powi(61),
        3e25,
        -2f32.powi(-70),
    ];
    for dev in devices("scales_out_of_the_reciprocal_range_match_the_reference") {
        for (map, channels) in [
            (ScaleMap::Tensor, 1),
            (
                ScaleMap::Axis {
                    axis_len: 8,
                    inner: 8,
                },
                8,
            ),
        ] {
            for (i, &s) in extremes.iter().enumerate() {
                let scales: Vec<f32> = (0..channels).map(|c| extremes[(i + c) % 8]).collect();
                let n = 8 * 8 * 12;
                let x: Vec<f32> = (0..n)
                    .map(|e| {
                        let ch = if channels == 1 { 0 } else { e / 8 % 8 };
                        ((e % 97) as f32 - 48.0 + 0.5 * (e % 2) as f32) * scales[ch]
                    })
                    .collect();
                let d_scales = dev.upload(&scales).unwrap();
                let d_x = dev.upload(&x).unwrap();
                for format in Format::ALL {
                    let q = QuantParams {
                        format,
                        map,
                        scales: &d_scales,
                        zeros: None,
                        saturate: true,
                    };
                    let mut out = dev.zeros::<u8>(format.bytes(n)).unwrap();
                    dev.quantize(&d_x, &q, &mut out).unwrap();
                    let want = packed::quantize(&x, &map, &scales, None, format, true);
                    assert!(
                        dev.download(&out).unwrap() == want,
                        "{}: {format:?} {map:?} scale {s:e}: codes differ",
                        dev.name()
                    );
                }
            }
        }
        // Groups of tiny and of huge values: their dynamic scales are out of the range too.
        let x: Vec<f32> = (0..4 * 64)
            .map(|e| {
                let v = (e % 31) as f32 - 15.0;
                [1e-28f32, 1e25, 0.02, 3e-20][e / 64] * v
            })
            .collect();
        let d_x = dev.upload(&x).unwrap();
        for format in Format::ALL {
            let want = packed::quantize_dynamic(&x, 64, 64, format, true, false);
            let mut codes = dev.zeros::<u8>(format.bytes(x.len())).unwrap();
            let mut scales = dev.zeros::<f32>(4).unwrap();
            dev.quantize_dynamic(
                &d_x,
                64,
                64,
                format,
                true,
                &mut codes,
                GroupScales::F32(&mut scales),
                None,
            )
            .unwrap();
            assert_eq!(dev.download(&scales).unwrap(), want.scales, "{format:?}");
            assert!(
                dev.download(&codes).unwrap() == want.codes,
                "{}: {format:?}: dynamic codes differ",
                dev.name()
            );
        }
    }
}

/// A buffer of one device given to another (the GPU's to the emulator and the other way round) is
/// an error, not a panic or a host pointer in a GPU kernel.
#[test]
fn buffers_of_another_device_are_errors() {
    let Some(gpu) = gpu("buffers_of_another_device_are_errors") else {
        return;
    };
    let emu = Device::emulated().unwrap();
    for (run, other) in [(&gpu, &emu), (&emu, &gpu)] {
        let x = other.upload(&[1.0f32; 64]).unwrap();
        let scales = run.upload(&[0.5f32]).unwrap();
        let mut out = run.zeros::<u8>(64).unwrap();
        let q = QuantParams {
            format: Format::I8,
            map: ScaleMap::Tensor,
            scales: &scales,
            zeros: None,
            saturate: true,
        };
        let e = run.quantize(&x, &q, &mut out).unwrap_err().to_string();
        assert!(e.contains("another device"), "{e}");
        assert!(run.download(&x).is_err());
    }
}

fn out_of(dev: &Device, codes: &[u8]) -> cuda::Buffer<u8> {
    dev.upload(codes).unwrap()
}

/// One dynamic quantization of `x` (as `T`) on `dev` against the reference.
#[allow(
    clippy::too_many_arguments,
    reason = "one case of the dynamic quantization table"
)]
fn check_dynamic<T: cuda::Float>(
    dev: &Device,
    x: &[f32],
    to: impl Fn(f32) -> T,
    back: impl Fn(T) -> f32,
    row_len: usize,
    group: usize,
    format: Format,
    symmetric: bool,
) {
    let xt: Vec<T> = x.iter().map(|&v| to(v)).collect();
    let exact: Vec<f32> = xt.iter().map(|&v| back(v)).collect();
    let want = packed::quantize_dynamic(&exact, row_len, group, format, symmetric, false);
    let groups = want.scales.len();
    let mut codes = dev.zeros::<u8>(format.bytes(x.len())).unwrap();
    let mut scales = dev.zeros::<f32>(groups).unwrap();
    let mut zeros = dev.zeros::<u8>(groups).unwrap();
    dev.quantize_dynamic(
        &dev.upload(&xt).unwrap(),
        row_len,
        group,
        format,
        symmetric,
        &mut codes,
        GroupScales::F32(&mut scales),
        Some(&mut zeros),
    )
    .unwrap();
    let what = format!(
        "{}: {} {format:?} {} values, rows of {row_len}, group {group}, symmetric {symmetric}",
        dev.name(),
        T::NAME,
        x.len()
    );
    assert_eq!(dev.download(&scales).unwrap(), want.scales, "{what}");
    assert_eq!(dev.download(&zeros).unwrap(), want.zeros, "{what}");
    assert!(dev.download(&codes).unwrap() == want.codes, "{what}: codes");
}

#[test]
fn dynamic_per_token_and_image_features_match_the_reference() {
    for dev in devices("dynamic_per_token_and_image_features_match_the_reference") {
        let mut rng = Rng(11);
        // Groups of up to 256 values go to lanes of a warp (1 to 32 lanes a group, the last lane
        // partly or not at all used, rows ending in a short group); longer ones to a block, held
        // in registers up to 64 bytes a thread (16384 binary16 or 8192 f32 values) and read twice
        // beyond (9000 f32 values). The emulator's grid is two blocks, so every block strides
        // over many groups.
        for (rows, row_len, group) in [
            (577, 1024, 1024),
            (64, 4096, 64),
            (33, 30, 10),
            (21, 75, 25),
            (40, 256, 256),
            (9, 1000, 136),
            (6, 600, 300),
            (5, 1000, 300),
            (2, 9000, 9000),
            (3, 16, 2),
        ] {
            let x = values(&mut rng, rows * row_len, 0.03);
            for format in Format::ALL {
                if format.bits() == 4 && (row_len % 2 == 1 || group % 2 == 1) {
                    continue;
                }
                for symmetric in [true, false] {
                    let (r, g) = (row_len, group);
                    check_dynamic(&dev, &x, |v| v, |v| v, r, g, format, symmetric);
                    if symmetric {
                        let (h, hb) = (f16::from_f32, f16::to_f32);
                        check_dynamic(&dev, &x, h, hb, r, g, format, symmetric);
                    } else {
                        let (b, bb) = (bf16::from_f32, bf16::to_f32);
                        check_dynamic(&dev, &x, b, bb, r, g, format, symmetric);
                    }
                }
            }
        }
        // The image cache: [576 patches, 4096] → INT4 groups of 64, binary16 scales.
        let x = values(&mut rng, 576 * 4096, 0.02);
        let want = packed::quantize_dynamic(&x, 4096, 64, Format::I4, true, true);
        let mut codes = dev.zeros::<u8>(x.len() / 2).unwrap();
        let mut scales = dev.zeros::<f16>(x.len() / 64).unwrap();
        dev.image_features_int4(&dev.upload(&x).unwrap(), 4096, &mut codes, &mut scales)
            .unwrap();
        let got: Vec<f32> = dev
            .download(&scales)
            .unwrap()
            .iter()
            .map(|s| s.to_f32())
            .collect();
        assert_eq!(got, want.scales);
        assert!(dev.download(&codes).unwrap() == want.codes);
    }
}

#[test]
fn int4_gemv_and_gemm_match_the_reference() {
    for mut dev in devices("int4_gemv_and_gemm_match_the_reference") {
        let mut rng = Rng(13);
        // Blocks of 32 and 64 take the lean kernel's small form where K is a multiple of 128,
        // CUDA cores otherwise (K of 96); 40 columns leave a partial group of 16 for the tensor
        // cores; K of 384 leaves warps without a step.
        for (n, k, block) in [
            (96usize, 4096usize, 128usize),
            (40, 1024, 32),
            (24, 96, 32),
            (40, 1024, 256),
            (16, 384, 128),
            (40, 2048, 64),
            (16, 384, 32),
        ] {
            let b: Vec<u8> = (0..n * k / 2).map(|_| rng.byte()).collect();
            let scales: Vec<f16> = (0..n * k / block)
                .map(|_| f16::from_f32(0.005 + 0.01 * rng.unit().abs()))
                .collect();
            let zeros: Vec<u8> = (0..n * (k / block).div_ceil(2))
                .map(|_| rng.byte())
                .collect();
            let bias: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.unit())).collect();
            let scales_f: Vec<f32> = scales.iter().map(|s| s.to_f32()).collect();
            let bias_f: Vec<f32> = bias.iter().map(|s| s.to_f32()).collect();
            let (d_b, d_s, d_z, d_bias) = (
                dev.upload(&b).unwrap(),
                dev.upload(&scales).unwrap(),
                dev.upload(&zeros).unwrap(),
                dev.upload(&bias).unwrap(),
            );
            for with_zeros in [false, true] {
                let w = NBits {
                    b: &d_b,
                    scales: &d_s,
                    zeros: with_zeros.then_some(&d_z),
                    n,
                    k,
                    block,
                };
                let weights = packed::nbits_weights(
                    &b,
                    &scales_f,
                    with_zeros.then_some(&zeros[..]),
                    n,
                    k,
                    block,
                );
                for m in [1usize, 2, 5, 8, 9, 100] {
                    let a: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.unit())).collect();
                    let a_f: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
                    let want = packed::nbits_matmul(&a_f, m, &weights, n, Some(&bias_f));
                    let norm = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
                    // Both tensor-core GEMVs (where the device has them), then the CUDA-core one.
                    for gemv in [Gemv::TensorCores, Gemv::TensorCoresFirst, Gemv::CudaCores] {
                        dev.set_gemv(gemv);
                        let mut y = dev.zeros::<f16>(m * n).unwrap();
                        dev.nbits_matmul(&dev.upload(&a).unwrap(), &w, Some(&d_bias), &mut y)
                            .unwrap();
                        for (i, (g, w)) in dev.download(&y).unwrap().iter().zip(&want).enumerate() {
                            let g = f64::from(g.to_f32());
                            let tol = w.abs() * 2f64.powi(-10) + norm * 1e-4;
                            assert!(
                                (g - w).abs() <= tol,
                                "{}: m {m} n {n} k {k} zeros {with_zeros} {gemv:?} \
                                 output {i}: {g} vs {w}",
                                dev.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn kv_append_matches_the_reference_step_by_step() {
    for dev in devices("kv_append_matches_the_reference_step_by_step") {
        let mut rng = Rng(17);
        for head_dim in [64usize, 128] {
            let (bh, tokens) = (2 * 32usize, 40usize);
            let mut cache = KvCache::new(&dev, bh, head_dim, tokens).unwrap();
            let mut codes_ref = vec![0i8; bh * cache.max_blocks * packed::KV_BLOCK_BYTES];
            let mut scales_ref = vec![0f32; bh * cache.max_blocks];
            for pos in 0..tokens {
                let amp = [0.5f32, 2.0, 0.1, 0.0, 7.5][pos % 5];
                let step: Vec<f16> = (0..bh * head_dim)
                    .map(|_| f16::from_f32(rng.unit() * amp))
                    .collect();
                let exact: Vec<f32> = step.iter().map(|v| v.to_f32()).collect();
                packed::kv_append(
                    &mut codes_ref,
                    &mut scales_ref,
                    &exact,
                    head_dim,
                    cache.max_blocks,
                    pos,
                );
                dev.kv_append(&dev.upload(&step).unwrap(), &mut cache, pos)
                    .unwrap();
                assert_eq!(
                    dev.download(&cache.scales).unwrap(),
                    scales_ref,
                    "step {pos}"
                );
                assert!(
                    dev.download(&cache.codes).unwrap() == codes_ref,
                    "head_dim {head_dim} step {pos}: codes differ"
                );
            }
            let e = dev
                .kv_append(
                    &dev.upload(&vec![f16::ZERO; bh * head_dim]).unwrap(),
                    &mut cache,
                    10_000,
                )
                .unwrap_err();
            assert!(e.to_string().contains("past the cache"), "{e}");
        }
    }
}

#[test]
fn cache_pool_keeps_the_plan_offsets_on_the_device() {
    use mmq_kernels::cache::CacheFormat;
    use mmq_kernels::cache::plan::{KvTensor, PlanRequest, plan};
    use mmq_kernels::cache::pool::CachePool;
    let kv = (0..4)
        .map(|i| KvTensor {
            name: format!("t{i}"),
            heads: 2,
            head_dim: 64,
        })
        .collect();
    let p = plan(PlanRequest {
        kv,
        kv_format: CacheFormat::Int8,
        kv_static_scales: false,
        image: None,
        images: 0,
        budget: 1 << 16,
    })
    .expect("plan");
    let mut pool = CachePool::new(p).expect("pool");
    let pages: Vec<_> = (0..2).map(|_| pool.alloc_page().expect("page")).collect();
    for pos in 0..12 {
        let step: Vec<f32> = (0..128)
            .map(|i| (i as f32 - 60.0) * 0.01 * (pos + 1) as f32)
            .collect();
        pool.append_kv(&pages, 1, pos, &step).expect("append");
    }
    for dev in devices("cache_pool_keeps_the_plan_offsets_on_the_device") {
        let buf = pool.to_device(&dev).expect("upload");
        let back = dev.download(&buf).expect("download");
        assert_eq!(back, pool.bytes());
    }
}
