//! The packed layouts of mmq's CUDA kernels, defined on the CPU: quantized codes (8-bit, or two
//! 4-bit codes per byte with the first in the low nibble), scales and zero points per tensor, per
//! axis or per group, dynamic per-group and per-token quantization, the INT4 weights of
//! `MatMulNBits`, and the INT8 KV-cache blocks. Every function here is the definition the kernels
//! (`kernels/cuda`) are checked against, built on the interpreter's element math
//! ([`crate::quant`], [`crate::numeric`]).

use half::f16;
use mmq_ir::DType;

use crate::numeric::{self, round_half_even};
use crate::quant::{dequantize_value, integer_range, quantize_float, quantize_value};

/// The code format of a quantized tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    I8,
    U8,
    /// Signed 4-bit, two codes per byte, the first in the low nibble.
    I4,
    /// Unsigned 4-bit, packed as [`Format::I4`].
    U4,
    /// FP8 E4M3FN (largest finite ±448; no zero point).
    E4M3,
}

impl Format {
    /// Every format, in the order of their kernel numbers.
    pub const ALL: [Format; 5] = [Format::I8, Format::U8, Format::I4, Format::U4, Format::E4M3];

    /// The IR element type of the codes.
    pub fn dtype(self) -> DType {
        match self {
            Format::I8 => DType::I8,
            Format::U8 => DType::U8,
            Format::I4 => DType::I4,
            Format::U4 => DType::U4,
            Format::E4M3 => DType::F8E4M3FN,
        }
    }

    /// Bits per code.
    pub fn bits(self) -> usize {
        match self {
            Format::I4 | Format::U4 => 4,
            _ => 8,
        }
    }

    /// Bytes holding `n` codes.
    pub fn bytes(self, n: usize) -> usize {
        (n * self.bits()).div_ceil(8)
    }

    /// The integer code range; `None` for FP8.
    pub fn range(self) -> Option<(i32, i32)> {
        integer_range(self.dtype())
    }

    /// The name the kernels use (`i8`, `u8`, `i4`, `u4`, `e4m3`).
    pub fn name(self) -> &'static str {
        match self {
            Format::I8 => "i8",
            Format::U8 => "u8",
            Format::I4 => "i4",
            Format::U4 => "u4",
            Format::E4M3 => "e4m3",
        }
    }

    /// The number of the format in the kernels (`MMQ_FMT_*`).
    pub fn id(self) -> i32 {
        match self {
            Format::I8 => 0,
            Format::U8 => 1,
            Format::I4 => 2,
            Format::U4 => 3,
            Format::E4M3 => 4,
        }
    }
}

/// Which scale and zero point each element of a row-major tensor uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleMap {
    /// One for the whole tensor.
    Tensor,
    /// One per index of an axis of length `axis_len` followed by `inner` elements.
    Axis { axis_len: usize, inner: usize },
    /// One per group of `group` consecutive elements of each row of `row_len` (the last group of a
    /// row may be shorter); scales are `[rows, ceil(row_len / group)]`.
    Group { row_len: usize, group: usize },
}

impl ScaleMap {
    /// The scale index of element `i`.
    pub fn index(&self, i: usize) -> usize {
        match *self {
            ScaleMap::Tensor => 0,
            ScaleMap::Axis { axis_len, inner } => (i / inner) % axis_len,
            ScaleMap::Group { row_len, group } => {
                (i / row_len) * row_len.div_ceil(group) + (i % row_len) / group
            }
        }
    }

    /// The number of scales a tensor of `n` elements needs.
    pub fn count(&self, n: usize) -> usize {
        match *self {
            ScaleMap::Tensor => 1,
            ScaleMap::Axis { axis_len, .. } => axis_len,
            ScaleMap::Group { row_len, group } => n.div_ceil(row_len) * row_len.div_ceil(group),
        }
    }
}

/// Zero point `j` of `zeros`, stored in `format` (absent: 0).
pub fn zero_point(zeros: Option<&[u8]>, format: Format, j: usize) -> i32 {
    match (zeros, format) {
        (None, _) | (_, Format::E4M3) => 0,
        (Some(z), Format::I8) => i32::from(z[j] as i8),
        (Some(z), Format::U8) => i32::from(z[j]),
        (Some(z), _) => code_value(format, nibble(z, j)),
    }
}

/// Code `i` of a packed array (its raw bits).
pub fn code(codes: &[u8], format: Format, i: usize) -> u8 {
    if format.bits() == 8 {
        codes[i]
    } else {
        nibble(codes, i)
    }
}

fn nibble(bytes: &[u8], i: usize) -> u8 {
    if i.is_multiple_of(2) {
        bytes[i / 2] & 0xf
    } else {
        bytes[i / 2] >> 4
    }
}

/// The integer value of an integer code's bits.
fn code_value(format: Format, bits: u8) -> i32 {
    match format {
        Format::I8 => i32::from(bits as i8),
        Format::U8 => i32::from(bits),
        _ => numeric::decode(format.dtype(), bits) as i32,
    }
}

/// Packs codes (raw bits) in `format`'s layout.
pub fn pack(format: Format, codes: &[u8]) -> Vec<u8> {
    if format.bits() == 8 {
        return codes.to_vec();
    }
    codes
        .chunks(2)
        .map(|p| (p[0] & 0xf) | (p.get(1).copied().unwrap_or(0) << 4))
        .collect()
}

/// The code (raw bits) of `x` with scale `scale` and zero point `zero`.
pub fn encode(format: Format, x: f32, scale: f32, zero: i32, saturate: bool) -> u8 {
    match format.range() {
        None => quantize_float(x, scale, format.dtype(), saturate),
        Some(range) => {
            let q = quantize_value(x, scale, zero, range);
            (q & if format.bits() == 8 { 0xff } else { 0xf }) as u8
        }
    }
}

/// The value of a code (raw bits), exact before rounding to the output type.
pub fn decode(format: Format, bits: u8, scale: f32, zero: i32) -> f64 {
    match format {
        Format::E4M3 => f64::from(numeric::decode(format.dtype(), bits)) * f64::from(scale),
        _ => dequantize_value(
            f64::from(code_value(format, bits)),
            f64::from(scale),
            f64::from(zero),
        ),
    }
}

/// Quantizes `x` with the given scales and zero points; packed codes.
pub fn quantize(
    x: &[f32],
    map: &ScaleMap,
    scales: &[f32],
    zeros: Option<&[u8]>,
    format: Format,
    saturate: bool,
) -> Vec<u8> {
    let codes: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let j = map.index(i);
            encode(format, v, scales[j], zero_point(zeros, format, j), saturate)
        })
        .collect();
    pack(format, &codes)
}

/// Dequantizes `n` packed codes; exact values, to be rounded once to the output type.
pub fn dequantize(
    codes: &[u8],
    n: usize,
    map: &ScaleMap,
    scales: &[f32],
    zeros: Option<&[u8]>,
    format: Format,
) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let j = map.index(i);
            decode(
                format,
                code(codes, format, i),
                scales[j],
                zero_point(zeros, format, j),
            )
        })
        .collect()
}

/// The scale and zero point of a group whose values span `[min, max]`: symmetric groups map the
/// largest magnitude to the largest positive code (127, 7, 448) with zero point 0 (signed
/// formats) or the middle code (unsigned: 128, 8); asymmetric groups map `[min(min, 0),
/// max(max, 0)]` onto the whole code range (an empty range counts as 1, as in ONNX
/// `DynamicQuantizeLinear`). A zero scale becomes 1. With `scale_f16` the scale is rounded to
/// binary16 (at most 65504) first, and the zero point is computed from the rounded scale.
pub fn group_qparams(
    min: f32,
    max: f32,
    format: Format,
    symmetric: bool,
    scale_f16: bool,
) -> (f32, i32) {
    let amax = min.abs().max(max.abs());
    let mut zero = 0;
    let mut scale = match format.range() {
        None => amax / 448.0,
        Some((lo, hi)) if symmetric => {
            zero = if lo < 0 { 0 } else { (hi + 1) / 2 };
            amax / (hi - zero) as f32
        }
        Some((lo, hi)) => {
            let (l, h) = (min.min(0.0), max.max(0.0));
            let range = if h == l { 1.0 } else { h - l };
            range / (hi - lo) as f32
        }
    };
    if scale.is_nan() || scale <= 0.0 {
        scale = 1.0;
    }
    if scale_f16 {
        scale = f16::from_f32(scale.min(65504.0)).to_f32();
        if scale == 0.0 {
            scale = 1.0;
        }
    }
    if let (Some((lo, hi)), false) = (format.range(), symmetric) {
        // max/min (not clamp): a NaN (infinite data) takes the lowest code, as fmaxf does.
        let zf = (lo as f32 - min.min(0.0) / scale)
            .max(lo as f32)
            .min(hi as f32);
        zero = round_half_even(f64::from(zf)) as i32;
    }
    (scale, zero)
}

/// Dynamically quantized data: packed codes, one scale per group (as stored: binary16 values when
/// the scales are binary16) and one zero-point byte per group.
#[derive(Clone, Debug, PartialEq)]
pub struct Dynamic {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub zeros: Vec<u8>,
}

/// Quantizes rows of `row_len` in groups of `group` (per token: `group == row_len`), each group
/// with its own [`group_qparams`]; saturating.
pub fn quantize_dynamic(
    x: &[f32],
    row_len: usize,
    group: usize,
    format: Format,
    symmetric: bool,
    scale_f16: bool,
) -> Dynamic {
    let map = ScaleMap::Group { row_len, group };
    let groups = map.count(x.len());
    let mut bounds = vec![(f32::INFINITY, f32::NEG_INFINITY); groups];
    for (i, &v) in x.iter().enumerate() {
        let b = &mut bounds[map.index(i)];
        *b = (b.0.min(v), b.1.max(v));
    }
    let params: Vec<(f32, i32)> = bounds
        .iter()
        .map(|&(lo, hi)| group_qparams(lo, hi, format, symmetric, scale_f16))
        .collect();
    let codes: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (s, z) = params[map.index(i)];
            encode(format, v, s, z, true)
        })
        .collect();
    Dynamic {
        codes: pack(format, &codes),
        scales: params.iter().map(|p| p.0).collect(),
        zeros: params.iter().map(|p| p.1 as u8).collect(),
    }
}

/// The weights `[n, k]` of a 4-bit `MatMulNBits` B (`[n, k / block, block / 2]` bytes, codes low
/// nibble first), with scales `[n, k / block]` and packed 4-bit zero points
/// (`[n, ceil(k / block / 2)]`, absent: 8): `(code - zero) * scale` in f32.
pub fn nbits_weights(
    b: &[u8],
    scales: &[f32],
    zeros: Option<&[u8]>,
    n: usize,
    k: usize,
    block: usize,
) -> Vec<f32> {
    let k_blocks = k / block;
    let per_row = k_blocks.div_ceil(2);
    let mut w = Vec::with_capacity(n * k);
    for row in 0..n {
        for kk in 0..k {
            let kb = kk / block;
            let zero = zeros.map_or(8.0, |z| f32::from(nibble(&z[row * per_row..], kb)));
            let c = f32::from(nibble(&b[row * (k / 2)..], kk));
            w.push((c - zero) * scales[row * k_blocks + kb]);
        }
    }
    w
}

/// `y[m, n] = a[m, k] · wᵀ (+ bias)` in f64 over the [`nbits_weights`].
pub fn nbits_matmul(a: &[f32], m: usize, w: &[f32], n: usize, bias: Option<&[f32]>) -> Vec<f64> {
    let k = w.len() / n;
    let mut y = Vec::with_capacity(m * n);
    for row in a.chunks_exact(k).take(m) {
        for (j, wr) in w.chunks_exact(k).enumerate() {
            let dot: f64 = row
                .iter()
                .zip(wr)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            y.push(dot + bias.map_or(0.0, |b| f64::from(b[j])));
        }
    }
    y
}

/// Bytes of one KV-cache block (INT8 codes of `KV_BLOCK_BYTES / head_dim` tokens of one head).
pub const KV_BLOCK_BYTES: usize = 512;

/// Appends one step (`[bh, head_dim]`, one row per batch·head) at token position `pos` to an
/// INT8 KV cache `[bh, max_blocks, KV_BLOCK_BYTES]` with scales `[bh, max_blocks]`: the block's
/// scale becomes `max(old scale (0 for a new block), amax / 127)`; when it grows, the tokens
/// already in the block are recoded (`round(q · (old / new))`); the step's codes are in
/// [-127, 127] (a zero scale codes 0).
pub fn kv_append(
    cache: &mut [i8],
    scales: &mut [f32],
    step: &[f32],
    head_dim: usize,
    max_blocks: usize,
    pos: usize,
) {
    let per_block = KV_BLOCK_BYTES / head_dim;
    let (blk, slot) = (pos / per_block, pos % per_block);
    for (bh, x) in step.chunks_exact(head_dim).enumerate() {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let sp = &mut scales[bh * max_blocks + blk];
        let s_old = if slot > 0 { *sp } else { 0.0 };
        let s_new = s_old.max(amax / 127.0);
        let start = (bh * max_blocks + blk) * KV_BLOCK_BYTES;
        let block = &mut cache[start..start + KV_BLOCK_BYTES];
        if slot > 0 && s_new != s_old {
            for q in &mut block[..slot * head_dim] {
                *q = round_half_even(f64::from(f32::from(*q) * (s_old / s_new))) as i8;
            }
        }
        for (q, &v) in block[slot * head_dim..(slot + 1) * head_dim]
            .iter_mut()
            .zip(x)
        {
            *q = if s_new == 0.0 {
                0
            } else {
                quantize_value(v, s_new, 0, (-127, 127)) as i8
            };
        }
        *sp = s_new;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_maps_index_like_onnx_block_quantization() {
        let g = ScaleMap::Group {
            row_len: 10,
            group: 4,
        };
        // Rows of 10 in groups 4, 4, 2: three scales per row.
        let idx: Vec<usize> = (0..20).map(|i| g.index(i)).collect();
        assert_eq!(
            idx,
            [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5]
        );
        assert_eq!(g.count(20), 6);
        let a = ScaleMap::Axis {
            axis_len: 3,
            inner: 2,
        };
        let idx: Vec<usize> = (0..12).map(|i| a.index(i)).collect();
        assert_eq!(idx, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn int4_packs_low_nibble_first_and_round_trips() {
        let x = [-1.0f32, 0.5, 7.0, -9.0, 2.26];
        let q = quantize(&x, &ScaleMap::Tensor, &[0.5], None, Format::I4, true);
        // codes -2, 1, 7 (14 saturates), -8 (-18 saturates), 5 (4.52) → 0x1e, 0x87, 0x05.
        assert_eq!(q, [0x1e, 0x87, 0x05]);
        let back = dequantize(&q, 5, &ScaleMap::Tensor, &[0.5], None, Format::I4);
        assert_eq!(back, [-1.0, 0.5, 3.5, -4.0, 2.5]);
    }

    #[test]
    fn dynamic_u8_matches_dynamic_quantize_linear() {
        let x = [-1.5f32, 0.25, 3.0, 2.0];
        let d = quantize_dynamic(&x, 4, 4, Format::U8, false, false);
        let (scale, zp) = crate::quant::dynamic_qparams(-1.5, 3.0);
        assert_eq!(d.scales, [scale]);
        assert_eq!(d.zeros, [zp]);
        let want: Vec<u8> = x
            .iter()
            .map(|&v| quantize_value(v, scale, i32::from(zp), (0, 255)) as u8)
            .collect();
        assert_eq!(d.codes, want);
    }

    #[test]
    fn kv_append_grows_the_block_scale_and_recodes() {
        let (hd, max_blocks) = (256usize, 2usize); // two tokens per block
        let mut cache = vec![0i8; max_blocks * KV_BLOCK_BYTES];
        let mut scales = vec![0f32; max_blocks];
        let step0 = vec![1.27f32; hd];
        kv_append(&mut cache, &mut scales, &step0, hd, max_blocks, 0);
        assert_eq!(scales[0], 1.27 / 127.0);
        assert!(cache[..hd].iter().all(|&q| q == 127));
        // A step twice as large doubles the scale: the first token is recoded to 64 (63.5 rounds
        // to even 64), the new one codes 127.
        let step1 = vec![-2.54f32; hd];
        kv_append(&mut cache, &mut scales, &step1, hd, max_blocks, 1);
        assert_eq!(scales[0], 2.54 / 127.0);
        assert!(cache[..hd].iter().all(|&q| q == 64), "{}", cache[0]);
        assert!(cache[hd..2 * hd].iter().all(|&q| q == -127));
        // Position 2 opens block 1 with its own scale.
        kv_append(&mut cache, &mut scales, &vec![0.0; hd], hd, max_blocks, 2);
        assert_eq!(scales[1], 0.0);
    }
}
