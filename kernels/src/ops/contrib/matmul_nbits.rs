//! Kernel: `com.microsoft.MatMulNBits`, a matrix product whose right operand is quantized
//! blockwise along K (ONNX Runtime's weight-only INT4/INT2/INT8 format).
//!
//! Inputs `A` (float, `[..., K]`), `B` (u8 `[N, k_blocks, blob_size]`, codes packed low bits
//! first along K, `blob_size = block_size * bits / 8`), `scales` (A's dtype, `[N, k_blocks]` or
//! `[N * k_blocks]`), optional `zero_points` (u8 packed like B, `ceil(k_blocks * bits / 8)` bytes
//! per row of N, or unpacked in the scales' dtype), optional `g_idx` (not supported), optional
//! `bias` (`[N]`). Attributes `K`, `N`, `bits` (default 4), `block_size`. Absent zero points
//! are `2^(bits - 1)`. `B` dequantizes to `(code - zero_point) * scale` in f32 and
//! `Y = A · Bᵀ (+ bias)` has shape `A.shape[..-1] + [N]`.
//!
//! `accuracy_level` 4 is ONNX Runtime's int8 compute on the CPU: each row of an f32 `A` is
//! quantized per block of `block_size` along K to symmetric int8 (`scale = absmax / 127`,
//! round half to even) before the product, so the interpreter sees the activations' rounding
//! that ONNX Runtime's int8 kernels add (other levels compute in f32).

use mmq_ir::Op;

use super::norm::int_attr;
use crate::error::KernelError;
use crate::ops::linalg::gemm;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// The shape-checked parameters of one node.
struct Params {
    k: usize,
    n: usize,
    bits: usize,
    block: usize,
    k_blocks: usize,
    blob: usize,
}

fn params(cx: &OpCtx<'_>, op: &Op) -> Result<Params, KernelError> {
    let k = int_attr(op, "K", -1);
    let n = int_attr(op, "N", -1);
    let bits = int_attr(op, "bits", 4);
    let block = int_attr(op, "block_size", -1);
    if k <= 0 || n <= 0 {
        return Err(cx.invalid(format!(
            "attributes K ({k}) and N ({n}) must be set and positive"
        )));
    }
    if !matches!(bits, 2 | 4 | 8) {
        return Err(cx.unsupported(format!("bits = {bits} (2, 4 or 8 are supported)")));
    }
    if block < 16 || (block as u64).count_ones() != 1 {
        return Err(cx.invalid(format!(
            "block_size {block} must be a power of two of at least 16"
        )));
    }
    let (k, n, bits, block) = (k as usize, n as usize, bits as usize, block as usize);
    let k_blocks = k.div_ceil(block);
    Ok(Params {
        k,
        n,
        bits,
        block,
        k_blocks,
        blob: block * bits / 8,
    })
}

/// Zero points: one per (row of N, block), as f32.
fn zero_points(
    cx: &OpCtx<'_>,
    p: &Params,
    zp: Option<&Tensor>,
    scale_dtype: mmq_ir::DType,
) -> Result<Vec<f32>, KernelError> {
    let count = p.n * p.k_blocks;
    let Some(zp) = zp else {
        return Ok(vec![(1u32 << (p.bits - 1)) as f32; count]);
    };
    match &zp.data {
        Data::U8(bytes) => {
            let per_row = (p.k_blocks * p.bits).div_ceil(8);
            if bytes.len() != p.n * per_row {
                return Err(cx.invalid(format!(
                    "packed zero_points {:?} must hold {} bytes (N {} x {per_row})",
                    zp.shape,
                    p.n * per_row,
                    p.n
                )));
            }
            let mask = (1u16 << p.bits) - 1;
            let mut out = Vec::with_capacity(count);
            for row in bytes.chunks_exact(per_row) {
                for b in 0..p.k_blocks {
                    let bit = b * p.bits;
                    let code = (u16::from(row[bit / 8]) >> (bit % 8)) & mask;
                    out.push(f32::from(code));
                }
            }
            Ok(out)
        }
        _ if zp.dtype == scale_dtype => {
            let v = zp.to_f32()?;
            if v.len() != count {
                return Err(cx.invalid(format!(
                    "zero_points {:?} must hold N x k_blocks = {count} values",
                    zp.shape
                )));
            }
            Ok(v)
        }
        _ => Err(cx.invalid(format!(
            "zero_points must be u8 (packed) or the scales' type, not {}",
            zp.dtype
        ))),
    }
}

/// `B` dequantized to row-major `[N, K]` f32.
fn dequantize_b(
    cx: &OpCtx<'_>,
    p: &Params,
    b: &Tensor,
    scales: &[f32],
    zps: &[f32],
) -> Result<Vec<f32>, KernelError> {
    let Data::U8(codes) = &b.data else {
        return Err(cx.invalid(format!("B must be u8, not {}", b.dtype)));
    };
    if codes.len() != p.n * p.k_blocks * p.blob {
        return Err(cx.invalid(format!(
            "B {:?} must have shape [N {}, k_blocks {}, blob_size {}]",
            b.shape, p.n, p.k_blocks, p.blob
        )));
    }
    let mask = (1u16 << p.bits) - 1;
    let mut w = vec![0f32; p.n * p.k];
    for (row, out) in w.chunks_exact_mut(p.k).enumerate() {
        for (kb, chunk) in out.chunks_mut(p.block).enumerate() {
            let q = row * p.k_blocks + kb;
            let (scale, zp) = (scales[q], zps[q]);
            let blob = &codes[q * p.blob..(q + 1) * p.blob];
            if p.bits == 4 {
                // Two codes per byte, low bits first, through the block's 16 values.
                let lut: [f32; 16] = std::array::from_fn(|c| (c as f32 - zp) * scale);
                for (pair, &byte) in chunk.chunks_mut(2).zip(blob) {
                    pair[0] = lut[usize::from(byte & 15)];
                    if let Some(hi) = pair.get_mut(1) {
                        *hi = lut[usize::from(byte >> 4)];
                    }
                }
                continue;
            }
            for (i, slot) in chunk.iter_mut().enumerate() {
                let bit = i * p.bits;
                let code = (u16::from(blob[bit / 8]) >> (bit % 8)) & mask;
                *slot = (f32::from(code) - zp) * scale;
            }
        }
    }
    Ok(w)
}

pub(crate) fn matmul_nbits(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let p = params(cx, op)?;
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    let scales = tensor(cx, inputs, 2)?;
    if opt_tensor(inputs, 4).is_some() {
        return Err(cx.unsupported("g_idx (input 4)"));
    }
    if !matches!(a.dtype, mmq_ir::DType::F32 | mmq_ir::DType::F16) {
        return Err(cx.unsupported(format!("A of type {}", a.dtype)));
    }
    if scales.dtype != a.dtype {
        return Err(cx.invalid(format!(
            "scales ({}) must have A's type ({})",
            scales.dtype, a.dtype
        )));
    }
    let Some((&ak, lead)) = a.shape.split_last() else {
        return Err(cx.invalid("A must have rank at least 1"));
    };
    if ak != p.k {
        return Err(cx.invalid(format!(
            "the last dim of A {:?} must be K = {}",
            a.shape, p.k
        )));
    }
    let sv = scales.to_f32()?;
    if sv.len() != p.n * p.k_blocks {
        return Err(cx.invalid(format!(
            "scales {:?} must hold N x k_blocks = {} values",
            scales.shape,
            p.n * p.k_blocks
        )));
    }
    let zps = zero_points(cx, &p, opt_tensor(inputs, 3).map(|t| &**t), scales.dtype)?;
    let w = dequantize_b(cx, &p, b, &sv, &zps)?;
    let m: usize = lead.iter().product();
    let mut av = a.to_f32()?;
    if int_attr(op, "accuracy_level", 0) == 4 && a.dtype == mmq_ir::DType::F32 {
        quantize_a_blocks(&mut av, p.k, p.block);
    }
    let mut y = vec![0f32; m * p.n];
    // y[m×n] = a[m×k] · wᵀ, w row-major [n×k].
    gemm(
        m,
        p.k,
        p.n,
        1.0,
        &av,
        (p.k, 1),
        &w,
        (1, p.k),
        0.0,
        &mut y,
        (p.n, 1),
    );
    if let Some(bias) = opt_tensor(inputs, 5) {
        let bv = bias.to_f32()?;
        if bv.len() != p.n {
            return Err(cx.invalid(format!(
                "bias {:?} must hold N = {} values",
                bias.shape, p.n
            )));
        }
        for row in y.chunks_exact_mut(p.n) {
            for (x, b) in row.iter_mut().zip(&bv) {
                *x += b;
            }
        }
    }
    let mut shape = lead.to_vec();
    shape.push(p.n);
    let out = if a.dtype == mmq_ir::DType::F32 {
        Tensor::from_f32(shape, y)?
    } else {
        let yv: Vec<f64> = y.iter().map(|&x| f64::from(x)).collect();
        Tensor::from_f64_as(a.dtype, shape, &yv)?
    };
    Ok(vec![Some(out.into())])
}

/// `a` (rows of `k`) through symmetric int8 per block of `block` along each row, as ONNX
/// Runtime's int8 compute quantizes `A` (`accuracy_level` 4).
fn quantize_a_blocks(a: &mut [f32], k: usize, block: usize) {
    for row in a.chunks_mut(k.max(1)) {
        for blk in row.chunks_mut(block) {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
            for v in blk.iter_mut() {
                // `round_half_even` is inlined where `round_ties_even` calls libm.
                let q = crate::numeric::round_half_even(f64::from(*v * inv)) as f32;
                *v = q.clamp(-127.0, 127.0) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mmq_ir::{DType, Op};

    use crate::ops::linalg::tests::{close, f32t, out, run_op};
    use crate::tensor::{Data, Tensor};

    fn nbits(k: i64, n: i64, block: i64) -> Op {
        Op::MatMulNBits {
            k: Some(k),
            n: Some(n),
            bits: Some(4),
            block_size: Some(block),
            accuracy_level: None,
            weight_prepacked: None,
        }
    }

    /// `accuracy_level` 4 rounds A to int8 per block; other levels do not.
    #[test]
    fn activation_blocks_round_half_to_even_as_libm_does() {
        // Blocks of 16 led by 127 (scale 1, so k + 0.5 is an exact tie), with values near the
        // ties, past the ends and a NaN, against `round_ties_even`.
        let mut values: Vec<f32> = Vec::new();
        for k in -130..130 {
            for f in [0.0f32, 0.25, 0.5, 0.4999999, 0.5000001, 0.75] {
                values.push(k as f32 + f);
            }
        }
        values.push(f32::NAN);
        let a: Vec<f32> = values
            .chunks(15)
            .flat_map(|c| {
                let mut blk = vec![127.0f32];
                blk.extend_from_slice(c);
                blk.resize(16, 0.0);
                blk
            })
            .collect();
        let mut got = a.clone();
        let k = got.len();
        super::quantize_a_blocks(&mut got, k, 16);
        for (blk, out) in a.chunks(16).zip(got.chunks(16)) {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
            for (x, y) in blk.iter().zip(out) {
                let want = (x * inv).round_ties_even().clamp(-127.0, 127.0) * scale;
                assert!(
                    want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                    "{x}: {want} != {y}"
                );
            }
        }
    }

    #[test]
    fn accuracy_level_4_rounds_a_per_block() {
        // K 32, N 1, block 16, every weight code 9 (value 1 · scale 1): y = Σ A'.
        let (k, n) = (32usize, 1usize);
        let b = vec![0x99u8; n * 2 * 8];
        let scales = [1.0f32, 1.0];
        // Block 0: absmax 127 → scale 1, 0.5 → 0 and 1.5 → 2 (ties to even), 3.25 → 3.
        // Block 1: all 0.001 → scale 0.001/127, exact.
        let mut a = vec![0f32; k];
        a[..4].copy_from_slice(&[127.0, 0.5, 1.5, 3.25]);
        a[16..].fill(0.001);
        let run = |level: Option<i64>| {
            let mut op = nbits(k as i64, n as i64, 16);
            if let Op::MatMulNBits { accuracy_level, .. } = &mut op {
                *accuracy_level = level;
            }
            two_blocks(op, &a, b.clone(), &scales).1[0]
        };
        let exact: f64 = a.iter().map(|&v| f64::from(v)).sum();
        close(&[run(None)], &[exact], 1e-5);
        close(&[run(Some(1))], &[exact], 1e-5);
        close(
            &[run(Some(4))],
            &[127.0 + 0.0 + 2.0 + 3.0 + 16.0 * 0.001],
            1e-5,
        );
    }

    /// Runs `op` on one row `a`, `b` of blocks of 16 (two per row of N) and their scales.
    fn two_blocks(op: Op, a: &[f32], b: Vec<u8>, scales: &[f32]) -> (Vec<usize>, Vec<f64>) {
        let n = scales.len() / 2;
        let r = run_op(
            op,
            vec![
                f32t(&[1, a.len()], a),
                u8t(&[n, 2, 8], b),
                f32t(&[n, 2], scales),
            ],
            1,
            21,
        )
        .expect("runs");
        out(&r, 0)
    }

    fn u8t(shape: &[usize], v: Vec<u8>) -> Option<Tensor> {
        Some(Tensor::new(DType::U8, shape.to_vec(), Data::U8(v)).expect("tensor"))
    }

    /// K = 20, N = 2, block 16: codes chosen by hand.
    #[test]
    fn dequantizes_low_nibble_first_with_padding_and_zero_points() {
        // K 20, block 16 → 2 blocks, the second holds 4 real values and 12 padding codes.
        let (k, n) = (20usize, 2usize);
        // Row 0: codes k%16 (low nibble = even k). Row 1: all code 9.
        let mut b = Vec::new();
        for row in 0..n {
            for _block in 0..2 {
                for byte in 0..8 {
                    let (lo, hi) = if row == 0 {
                        ((2 * byte) as u8, (2 * byte + 1) as u8)
                    } else {
                        (9, 9)
                    };
                    b.push(lo | (hi << 4));
                }
            }
        }
        let scales = [0.5f32, 2.0, 1.0, 0.25];
        let a: Vec<f32> = (0..k).map(|i| if i < 16 { 1.0 } else { 10.0 }).collect();
        // Symmetric (zero point 8).
        let (shape, y) = two_blocks(nbits(k as i64, n as i64, 16), &a, b.clone(), &scales);
        assert_eq!(shape, [1, 2]);
        // Row 0: block 0 Σ(c-8)*0.5 for c in 0..16 = -4; block 1 k=16..20 codes 0..4: (0+1+2+3-32)*2*10.
        let y0 = -4.0 + (6.0 - 32.0) * 2.0 * 10.0;
        // Row 1: 16 * (1 * 1.0) + 4 * 10 * (1 * 0.25).
        let y1 = 16.0 + 10.0;
        close(&y, &[y0, y1], 1e-6);
        // Packed zero points: row 0 zp (0, 8) → byte 0x80; row 1 zp (9, 9) → 0x99; plus bias.
        let r = run_op(
            nbits(k as i64, n as i64, 16),
            vec![
                f32t(&[1, k], &a),
                u8t(&[n, 2, 8], b),
                f32t(&[n, 2], &scales),
                u8t(&[n, 1], vec![0x80, 0x99]),
                None,
                f32t(&[2], &[1.0, -1.0]),
            ],
            1,
            21,
        )
        .expect("runs");
        let y0 = 120.0 * 0.5 + (6.0 - 32.0) * 2.0 * 10.0 + 1.0;
        close(&out(&r, 0).1, &[y0, -1.0], 1e-6);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let r = run_op(
            nbits(32, 2, 32),
            vec![
                f32t(&[1, 16], &[0.0; 16]),
                u8t(&[2, 1, 16], vec![0; 32]),
                f32t(&[2], &[1.0, 1.0]),
            ],
            1,
            21,
        );
        let err = r.expect_err("K mismatch");
        assert!(err.to_string().contains("must be K = 32"), "{err}");
        let r = run_op(
            nbits(32, 2, 32),
            vec![
                f32t(&[1, 32], &[0.0; 32]),
                u8t(&[2, 1, 8], vec![0; 16]),
                f32t(&[2], &[1.0, 1.0]),
            ],
            1,
            21,
        );
        let err = r.expect_err("B too small");
        assert!(err.to_string().contains("blob_size 16"), "{err}");
    }

    /// The layout the CUDA kernels are checked against (`packed::nbits_weights`) is this op's:
    /// the same product for random weights, scales, packed zero points and bias.
    #[test]
    fn the_cuda_reference_layout_is_this_ops() {
        let (k, n, block, m) = (128usize, 6usize, 32usize, 3usize);
        let kb = k / block;
        let b: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 251) as u8).collect();
        let scales: Vec<f32> = (0..n * kb).map(|i| 0.01 * (1 + i % 7) as f32).collect();
        let zeros: Vec<u8> = (0..n * kb.div_ceil(2))
            .map(|i| (i * 91 % 256) as u8)
            .collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32 - 2.5).collect();
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let r = run_op(
            nbits(k as i64, n as i64, block as i64),
            vec![
                f32t(&[m, k], &a),
                u8t(&[n, kb, block / 2], b.clone()),
                f32t(&[n, kb], &scales),
                u8t(&[n, kb.div_ceil(2)], zeros.clone()),
                None,
                f32t(&[n], &bias),
            ],
            1,
            21,
        )
        .expect("runs");
        let (_, y) = out(&r, 0);
        let w = crate::packed::nbits_weights(&b, &scales, Some(&zeros), n, k, block);
        let want = crate::packed::nbits_matmul(&a, m, &w, n, Some(&bias));
        close(&y, &want, 1e-5);
    }
}
