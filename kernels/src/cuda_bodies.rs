//! The CUDA kernel bodies (`kernels/cuda/mmq_blocks.cuh`), run on the host over every index a grid
//! covers (`host_check.cpp`), against [`crate::packed`]: binary16 and bfloat16 conversions bit for
//! bit over all codes and every rounding edge; quantization codes, scales and zero points bit for
//! bit for every input type, format and scale map (odd lengths, uneven groups, chunks that
//! straddle scales); dequantization bit for bit to f32 and within 1 ulp to binary16 / bfloat16;
//! the INT4 GEMV / GEMM within rounding; every KV append bit for bit.

#![allow(
    unsafe_code,
    reason = "the kernel bodies compiled for the host are C functions"
)]

use half::{bf16, f16};

use crate::cuda::{RawScaleMap, quant_plan};
use crate::packed::{self, Format, KV_BLOCK_BYTES, ScaleMap};

unsafe extern "C" {
    fn mmq_host_f32_to_f16(x: f32) -> u16;
    fn mmq_host_f16_to_f32(h: u16) -> f32;
    fn mmq_host_f32_to_bf16(x: f32) -> u16;
    fn mmq_host_bf16_to_f32(h: u16) -> f32;
    fn mmq_host_scale_map(
        mode: i64,
        axis_len: i64,
        inner: i64,
        row_len: i64,
        group: i64,
        n: i64,
    ) -> RawScaleMap;
    fn mmq_host_quantize(
        in_type: i32,
        fmt: i32,
        x: *const u8,
        n: i64,
        scales: *const f32,
        zeros: *const u8,
        map: RawScaleMap,
        saturate: i32,
        out: *mut u8,
    );
    fn mmq_host_dequantize(
        fmt: i32,
        out_type: i32,
        codes: *const u8,
        n: i64,
        scales: *const f32,
        zeros: *const u8,
        map: RawScaleMap,
        y: *mut u8,
    );
    fn mmq_host_quantize_dynamic(
        in_type: i32,
        fmt: i32,
        x: *const u8,
        rows: i64,
        row_len: i64,
        group: i64,
        symmetric: i32,
        scale_f16: i32,
        out: *mut u8,
        scales: *mut u8,
        zeros: *mut u8,
    );
    fn mmq_host_nbits_gemv(
        a: *const u16,
        m: i64,
        b: *const u8,
        scales: *const u16,
        zeros: *const u8,
        bias: *const u16,
        y: *mut u16,
        n: i64,
        k: i64,
        block: i64,
    );
    fn mmq_host_nbits_gemm(
        a: *const u16,
        m: i64,
        b: *const u8,
        scales: *const u16,
        zeros: *const u8,
        bias: *const u16,
        y: *mut u16,
        n: i64,
        k: i64,
        block: i64,
    );
    fn mmq_host_kv_append(
        in_type: i32,
        step: *const u8,
        bh: i64,
        head_dim: i64,
        max_blocks: i64,
        pos: i64,
        cache: *mut i8,
        scales: *mut f32,
    );
}

/// A deterministic pseudo-random stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Activations of one of the three input types, as bytes and as their exact f32 values.
#[derive(Clone, Copy, Debug)]
enum In {
    F32,
    F16,
    Bf16,
}

impl In {
    const ALL: [In; 3] = [In::F32, In::F16, In::Bf16];

    fn id(self) -> i32 {
        self as i32
    }

    /// `values` rounded to the type: (bytes, exact f32 values).
    fn encode(self, values: &[f32]) -> (Vec<u8>, Vec<f32>) {
        match self {
            In::F32 => (
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                values.to_vec(),
            ),
            In::F16 => {
                let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
                (
                    h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|v| v.to_f32()).collect(),
                )
            }
            In::Bf16 => {
                let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
                (
                    h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|v| v.to_f32()).collect(),
                )
            }
        }
    }

    fn width(self) -> usize {
        if let In::F32 = self { 4 } else { 2 }
    }

    /// Decodes output bytes of this type to (f32 value, bits as u32).
    fn decode(self, bytes: &[u8]) -> Vec<(f32, u32)> {
        bytes
            .chunks_exact(self.width())
            .map(|c| match self {
                In::F32 => {
                    let b = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                    (f32::from_bits(b), b)
                }
                In::F16 => {
                    let b = u16::from_le_bytes(c.try_into().expect("2 bytes"));
                    (f16::from_bits(b).to_f32(), u32::from(b))
                }
                In::Bf16 => {
                    let b = u16::from_le_bytes(c.try_into().expect("2 bytes"));
                    (bf16::from_bits(b).to_f32(), u32::from(b))
                }
            })
            .collect()
    }

    /// The bits of `v` rounded once to this type.
    fn round_bits(self, v: f64) -> u32 {
        match self {
            In::F32 => (v as f32).to_bits(),
            In::F16 => u32::from(f16::from_f64(v).to_bits()),
            In::Bf16 => u32::from(bf16::from_f64(v).to_bits()),
        }
    }
}

/// f32 values around every binary16 / bfloat16 rounding edge: all f32 with the low 12 bits zero
/// (every sign, exponent and top-11 mantissa pattern) plus their neighbours.
fn conversion_edges() -> Vec<f32> {
    let mut v = Vec::with_capacity(3 << 20);
    for i in 0..1u32 << 20 {
        let b = i << 12;
        v.push(f32::from_bits(b));
        v.push(f32::from_bits(b | 1));
        v.push(f32::from_bits(b.wrapping_sub(1)));
    }
    v
}

#[test]
fn half_conversions_match_the_half_crate_on_every_edge() {
    for c in 0..=u16::MAX {
        let (h, b) = (f16::from_bits(c).to_f32(), bf16::from_bits(c).to_f32());
        // SAFETY: pure functions.
        let (gh, gb) = unsafe { (mmq_host_f16_to_f32(c), mmq_host_bf16_to_f32(c)) };
        assert!(
            gh.to_bits() == h.to_bits() || (gh.is_nan() && h.is_nan()),
            "f16 {c:#06x}"
        );
        assert!(
            gb.to_bits() == b.to_bits() || (gb.is_nan() && b.is_nan()),
            "bf16 {c:#06x}"
        );
    }
    for x in conversion_edges() {
        // SAFETY: pure functions.
        let (h, b) = unsafe { (mmq_host_f32_to_f16(x), mmq_host_f32_to_bf16(x)) };
        let (wh, wb) = (f16::from_f32(x), bf16::from_f32(x));
        if x.is_nan() {
            assert!(f16::from_bits(h).is_nan() && bf16::from_bits(b).is_nan());
        } else {
            assert_eq!(h, wh.to_bits(), "f16 of {x:e} ({:#010x})", x.to_bits());
            assert_eq!(b, wb.to_bits(), "bf16 of {x:e} ({:#010x})", x.to_bits());
        }
    }
}

/// Values at scale `s` with ties, saturation, signed zeros, NaN and infinities mixed in.
fn test_values(rng: &mut Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 11 {
            0 => (rng.below(40) as f32 - 20.0 + 0.5) * s,
            1 => rng.unit() * 600.0 * s,
            2 if i % 7 == 0 => [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 5],
            _ => rng.unit() * 130.0 * s,
        })
        .collect()
}

fn maps() -> Vec<(usize, ScaleMap)> {
    vec![
        (111, ScaleMap::Tensor),
        (
            120,
            ScaleMap::Axis {
                axis_len: 3,
                inner: 5,
            },
        ),
        (
            96,
            ScaleMap::Axis {
                axis_len: 4,
                inner: 8,
            },
        ),
        (
            160,
            ScaleMap::Group {
                row_len: 40,
                group: 16,
            },
        ),
        (
            111,
            ScaleMap::Group {
                row_len: 37,
                group: 10,
            },
        ),
        // Several axis steps inside one chunk.
        (
            105,
            ScaleMap::Axis {
                axis_len: 5,
                inner: 1,
            },
        ),
        (
            84,
            ScaleMap::Axis {
                axis_len: 7,
                inner: 3,
            },
        ),
    ]
}

#[test]
fn the_scale_map_of_the_launchers_is_the_map_of_quant_plan() {
    let big = (1usize << 32) + 4096;
    let mut cases = maps();
    cases.extend([
        (
            big,
            ScaleMap::Axis {
                axis_len: 4096,
                inner: 1,
            },
        ),
        (
            big,
            ScaleMap::Group {
                row_len: 4096,
                group: 128,
            },
        ),
        (big, ScaleMap::Tensor),
    ]);
    for (n, map) in cases {
        let raw = quant_plan(n, Format::I8, &map, map.count(n), None, n).unwrap();
        let (mode, a, i, r, g) = match map {
            ScaleMap::Tensor => (0, 0, 0, 0, 0),
            ScaleMap::Axis { axis_len, inner } => (1, axis_len, inner, 0, 0),
            ScaleMap::Group { row_len, group } => (2, 0, 0, row_len, group),
        };
        // SAFETY: plain values in, a plain struct out.
        let c =
            unsafe { mmq_host_scale_map(mode, a as i64, i as i64, r as i64, g as i64, n as i64) };
        assert_eq!(raw, c, "{n} elements, {map:?}");
    }
}

fn zeros_for(rng: &mut Rng, format: Format, count: usize) -> Option<Vec<u8>> {
    let (lo, hi) = format.range()?;
    let codes: Vec<u8> = (0..count)
        .map(|_| ((lo + rng.below((hi - lo + 1) as u64) as i32) & 0xff) as u8)
        .map(|c| if format.bits() == 4 { c & 0xf } else { c })
        .collect();
    Some(packed::pack(format, &codes))
}

#[test]
fn quantize_and_dequantize_bodies_match_the_reference() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (n, map) in maps() {
        for format in Format::ALL {
            for with_zeros in [false, true] {
                let count = map.count(n);
                let scales: Vec<f32> = (0..count).map(|j| 0.013 * (1.0 + j as f32)).collect();
                let zeros = if with_zeros {
                    zeros_for(&mut rng, format, count)
                } else {
                    None
                };
                if with_zeros && zeros.is_none() {
                    continue;
                }
                let zp = zeros.as_ref().map_or(std::ptr::null(), |z| z.as_ptr());
                // The map the launcher passes: the bodies run with what `quant_plan` builds.
                let plan = quant_plan(
                    n,
                    format,
                    &map,
                    scales.len(),
                    zeros.as_ref().map(Vec::len),
                    format.bytes(n),
                )
                .expect("a valid plan");
                let values = test_values(&mut rng, n, 0.02);
                // With the 32-bit divisions (every index here fits) and with 64-bit ones.
                for (input, raw) in In::ALL
                    .into_iter()
                    .flat_map(|i| [(i, plan), (i, plan.with_64_bit_indices())])
                {
                    let (bytes, exact) = input.encode(&values);
                    for saturate in [true, false] {
                        let want = packed::quantize(
                            &exact,
                            &map,
                            &scales,
                            zeros.as_deref(),
                            format,
                            saturate,
                        );
                        let mut got = vec![0xa5u8; format.bytes(n)];
                        // SAFETY: buffers sized as the kernel body reads and writes them.
                        unsafe {
                            mmq_host_quantize(
                                input.id(),
                                format.id(),
                                bytes.as_ptr(),
                                n as i64,
                                scales.as_ptr(),
                                zp,
                                raw,
                                i32::from(saturate),
                                got.as_mut_ptr(),
                            )
                        };
                        assert_eq!(got, want, "{input:?} {format:?} {map:?} zeros {with_zeros}");
                    }
                    // Dequantize every code pattern to this type.
                    let codes: Vec<u8> = (0..format.bytes(n)).map(|_| rng.next() as u8).collect();
                    let want =
                        packed::dequantize(&codes, n, &map, &scales, zeros.as_deref(), format);
                    let mut out = vec![0u8; n * input.width()];
                    // SAFETY: as above.
                    unsafe {
                        mmq_host_dequantize(
                            format.id(),
                            input.id(),
                            codes.as_ptr(),
                            n as i64,
                            scales.as_ptr(),
                            zp,
                            raw,
                            out.as_mut_ptr(),
                        )
                    };
                    for (i, ((g, gb), w)) in input.decode(&out).into_iter().zip(&want).enumerate() {
                        let wb = input.round_bits(*w);
                        let ulps = (i64::from(gb) - i64::from(wb)).abs();
                        let ok = match input {
                            In::F32 => gb == wb,
                            _ => ulps <= 1,
                        } || (g.is_nan() && w.is_nan());
                        assert!(ok, "{input:?} {format:?} {map:?} element {i}: {g} vs {w}");
                    }
                }
            }
        }
    }
}

#[test]
fn dynamic_group_and_token_bodies_match_the_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // (rows, row_len, group): per token, groups of 64 (the image cache), uneven groups.
    for (rows, row_len, group) in [(5, 40, 40), (3, 128, 64), (4, 30, 8), (2, 26, 10)] {
        let n = rows * row_len;
        for format in Format::ALL {
            for symmetric in [true, false] {
                for scale_f16 in [false, true] {
                    let mut values = test_values(&mut rng, n, 0.05);
                    // A group of zeros and a group of one sign.
                    for v in &mut values[..group.min(row_len)] {
                        *v = 0.0;
                    }
                    for v in &mut values[row_len..row_len + group.min(row_len)] {
                        *v = v.abs() + 0.25;
                    }
                    for input in In::ALL {
                        let (bytes, exact) = input.encode(&values);
                        let want = packed::quantize_dynamic(
                            &exact, row_len, group, format, symmetric, scale_f16,
                        );
                        let groups = want.scales.len();
                        let mut codes = vec![0xa5u8; format.bytes(n)];
                        let mut scales = vec![0u8; groups * if scale_f16 { 2 } else { 4 }];
                        let mut zeros = vec![0u8; groups];
                        // SAFETY: buffers sized as the body writes them.
                        unsafe {
                            mmq_host_quantize_dynamic(
                                input.id(),
                                format.id(),
                                bytes.as_ptr(),
                                rows as i64,
                                row_len as i64,
                                group as i64,
                                i32::from(symmetric),
                                i32::from(scale_f16),
                                codes.as_mut_ptr(),
                                scales.as_mut_ptr(),
                                zeros.as_mut_ptr(),
                            )
                        };
                        let what = format!(
                            "{input:?} {format:?} rows {rows}×{row_len} group {group} \
                             symmetric {symmetric} f16 scales {scale_f16}"
                        );
                        let got_scales: Vec<f32> = if scale_f16 {
                            In::F16.decode(&scales).iter().map(|p| p.0).collect()
                        } else {
                            In::F32.decode(&scales).iter().map(|p| p.0).collect()
                        };
                        assert_eq!(got_scales, want.scales, "scales of {what}");
                        assert_eq!(zeros, want.zeros, "zero points of {what}");
                        assert_eq!(codes, want.codes, "codes of {what}");
                    }
                }
            }
        }
    }
}

/// A random MatMulNBits weight: (B, scales as binary16 bits, packed zero points).
fn nbits_weight(rng: &mut Rng, n: usize, k: usize, block: usize) -> (Vec<u8>, Vec<u16>, Vec<u8>) {
    let b: Vec<u8> = (0..n * k / 2).map(|_| rng.next() as u8).collect();
    let scales: Vec<u16> = (0..n * (k / block))
        .map(|_| f16::from_f32(0.01 + 0.02 * rng.unit().abs()).to_bits())
        .collect();
    let zeros: Vec<u8> = (0..n * (k / block).div_ceil(2))
        .map(|_| rng.next() as u8)
        .collect();
    (b, scales, zeros)
}

#[test]
fn int4_gemv_and_gemm_bodies_match_the_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for (k, n, block) in [(256usize, 24usize, 32usize), (2048, 8, 128), (192, 5, 64)] {
        let (b, scales, zeros) = nbits_weight(&mut rng, n, k, block);
        let scales_f: Vec<f32> = scales.iter().map(|&s| f16::from_bits(s).to_f32()).collect();
        let bias: Vec<u16> = (0..n)
            .map(|_| f16::from_f32(rng.unit()).to_bits())
            .collect();
        let bias_f: Vec<f32> = bias.iter().map(|&s| f16::from_bits(s).to_f32()).collect();
        for m in [1usize, 3, 8, 9, 70] {
            let a: Vec<u16> = (0..m * k)
                .map(|_| f16::from_f32(rng.unit()).to_bits())
                .collect();
            let a_f: Vec<f32> = a.iter().map(|&s| f16::from_bits(s).to_f32()).collect();
            for (with_zeros, with_bias) in [(false, false), (true, true)] {
                let z = with_zeros.then_some(&zeros[..]);
                let w = packed::nbits_weights(&b, &scales_f, z, n, k, block);
                let want = packed::nbits_matmul(&a_f, m, &w, n, with_bias.then_some(&bias_f[..]));
                let mut y = vec![0u16; m * n];
                let body = if m <= 8 {
                    mmq_host_nbits_gemv
                } else {
                    mmq_host_nbits_gemm
                };
                // SAFETY: buffers sized as the body reads and writes them.
                unsafe {
                    body(
                        a.as_ptr(),
                        m as i64,
                        b.as_ptr(),
                        scales.as_ptr(),
                        z.map_or(std::ptr::null(), |z| z.as_ptr()),
                        if with_bias {
                            bias.as_ptr()
                        } else {
                            std::ptr::null()
                        },
                        y.as_mut_ptr(),
                        n as i64,
                        k as i64,
                        block as i64,
                    )
                };
                let norm: f64 =
                    (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
                for (i, (g, w)) in y.iter().zip(&want).enumerate() {
                    let g = f64::from(f16::from_bits(*g).to_f32());
                    // binary16 output rounding plus f32 accumulation over K.
                    let tol = w.abs() * 2f64.powi(-10) + norm * 1e-5 + 1e-6;
                    assert!(
                        (g - w).abs() <= tol,
                        "m {m} k {k} n {n} block {block} zeros {with_zeros} output {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn kv_append_body_matches_the_reference_step_by_step() {
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    for head_dim in [64usize, 128, 512] {
        let (bh, tokens) = (3usize, 3 * KV_BLOCK_BYTES / head_dim + 1);
        let max_blocks = tokens.div_ceil(KV_BLOCK_BYTES / head_dim);
        for input in In::ALL {
            let mut cache_ref = vec![0i8; bh * max_blocks * KV_BLOCK_BYTES];
            let mut scales_ref = vec![0f32; bh * max_blocks];
            let mut cache = cache_ref.clone();
            let mut scales = scales_ref.clone();
            for pos in 0..tokens {
                // Magnitudes that grow, shrink and vanish, so scales both stay and grow.
                let amp = [0.5f32, 2.0, 0.1, 0.0, 7.5][pos % 5] * (1.0 + pos as f32 / 8.0);
                let step: Vec<f32> = (0..bh * head_dim).map(|_| rng.unit() * amp).collect();
                let (bytes, exact) = input.encode(&step);
                packed::kv_append(
                    &mut cache_ref,
                    &mut scales_ref,
                    &exact,
                    head_dim,
                    max_blocks,
                    pos,
                );
                // SAFETY: the cache and scales have the geometry passed.
                unsafe {
                    mmq_host_kv_append(
                        input.id(),
                        bytes.as_ptr(),
                        bh as i64,
                        head_dim as i64,
                        max_blocks as i64,
                        pos as i64,
                        cache.as_mut_ptr(),
                        scales.as_mut_ptr(),
                    )
                };
                assert_eq!(
                    scales, scales_ref,
                    "{input:?} head_dim {head_dim} step {pos}"
                );
                assert_eq!(cache, cache_ref, "{input:?} head_dim {head_dim} step {pos}");
            }
        }
    }
}
