//! mmq's CUDA kernels (`kernels/cuda`), launched through cudarc: quantize / dequantize per tensor,
//! axis and group, dynamic per-group and per-token quantization, the INT4 `MatMulNBits` GEMV and
//! GEMM, and the cache writes (KV steps into INT8 blocks, image features into INT4 groups of 64).
//! Every result is defined by [`crate::packed`].
//!
//! The driver library is loaded at run time: without it [`Device::new`] returns
//! [`CudaError::NoDriver`], so everything builds and runs on machines without CUDA. The kernels
//! come from the fatbin built by nvcc (SASS for sm_80, sm_89, sm_90 and compute_90 PTX) when the
//! build had nvcc, else (or when the fatbin has no code the device can run) NVRTC compiles the
//! embedded [`SOURCE`] for the device.
//!
//! [`Device::emulated`] runs the same kernels, through the same launchers, on the CPU: the source
//! compiled for the host with `kernels/cuda/emu.h`, every CUDA thread a fiber, the warp collectives
//! and `mma` exchanged between them as the hardware does. It is slow and exists to check the
//! kernels where there is no GPU: their results, their loads (aligned, inside the buffers), their
//! barriers (no deadlock) and their writes (no byte past a buffer's ends).

#![allow(
    unsafe_code,
    reason = "the CUDA driver API (through cudarc) and page-locked host memory are foreign calls"
)]

use std::alloc::Layout;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    DriverError, LaunchConfig, PushKernelArg, SyncOnDrop, ValidAsZeroBits, sys,
};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use half::{bf16, f16};

pub use crate::packed::{Format, KV_BLOCK_BYTES, ScaleMap};

mod build {
    include!(concat!(env!("OUT_DIR"), "/cuda_build.rs"));
}
pub use build::{FATBIN_ARCHS, NVCC};

/// The kernels' source: every `kernels/cuda/*.cu` with its headers inlined, as nvcc and NVRTC
/// compile it.
pub const SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/mmq_kernels.cu"));

/// The kernels compiled by nvcc at build time; empty when the build had no nvcc.
pub static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmq_kernels.fatbin"));

/// What went wrong on the CUDA side.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded.
    #[error(
        "no CUDA driver: libcuda.so.1 could not be loaded (no NVIDIA driver on this machine, or it \
         is not on the library path)"
    )]
    NoDriver,
    /// NVRTC (`libnvrtc.so.13`) could not be loaded, and it was needed.
    #[error("no NVRTC: libnvrtc.so.13 could not be loaded ({0})")]
    NoNvrtc(String),
    /// A driver call failed.
    #[error("CUDA {call} failed: {source}")]
    Driver {
        call: &'static str,
        #[source]
        source: DriverError,
    },
    /// NVRTC could not compile the kernels.
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    /// Arguments that do not fit together (lengths, shapes, formats).
    #[error("{0}")]
    Invalid(String),
    /// The CPU emulator is not in this build (it had no C++ compiler).
    #[error(
        "no CPU emulator: kernels/cuda was not compiled for the host (no C++ compiler at build time)"
    )]
    NoEmulator,
    /// A kernel under the CPU emulator did what the hardware faults or hangs on: a misaligned load,
    /// a load outside its buffers, a write past a buffer's end, a deadlock at a barrier.
    #[error("kernel {kernel} under the CPU emulator: {message}")]
    Emulated { kernel: String, message: String },
}

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver { call, source }
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, CudaError> {
    Err(CudaError::Invalid(msg.into()))
}

/// The activation types the kernels read and write.
pub trait Float: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static {
    /// The kernels' name for the type.
    const NAME: &'static str;
}
impl Float for f32 {
    const NAME: &'static str = "f32";
}
impl Float for f16 {
    const NAME: &'static str = "f16";
}
impl Float for bf16 {
    const NAME: &'static str = "bf16";
}

/// Where the device's kernel code came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeSource {
    /// The build's fatbin: SASS for this architecture, or compute_90 PTX the driver compiled.
    Fatbin,
    /// NVRTC, compiling [`SOURCE`] for this architecture at load time.
    Nvrtc(String),
    /// The CPU emulator ([`Device::emulated`]).
    Emulated,
}

/// One GPU with mmq's kernels loaded, and a stream every call is queued on; or the CPU emulator.
pub struct Device {
    backend: Backend,
    name: String,
    capability: (i32, i32),
    sm_count: u32,
    code: CodeSource,
    gemv: Gemv,
    /// Blocks a kernel keeps resident on the device, by kernel and block size: asked of the
    /// driver once.
    resident: Mutex<HashMap<(String, u32), usize>>,
}

/// The INT4 GEMV kernel [`Device::nbits_matmul`] uses for 1 to 8 rows of A. The tensor-core ones
/// need sm_80; the first takes quantization blocks of at least 128 (a step's 128 K must share one
/// scale), the lean one also blocks of 32 and 64 where K is a multiple of 128; other products run
/// on CUDA cores whatever is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemv {
    /// Tensor cores, the lean kernel (`mmq_nbits_gemv_lean*`): the default.
    TensorCores,
    /// Tensor cores, the first kernel (`mmq_nbits_gemv_tc*`), whose figures are in
    /// `docs/benchmarks.md`; kept to be measured against the lean one.
    TensorCoresFirst,
    /// CUDA cores, a warp per column (`mmq_nbits_gemv_m*`).
    CudaCores,
}

enum Backend {
    Cuda {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        module: Arc<CudaModule>,
    },
    Emulated,
}

/// A typed device buffer (host memory on the emulator).
pub struct Buffer<T> {
    store: Store<T>,
}

enum Store<T> {
    Cuda(CudaSlice<T>),
    Host(HostMem<T>),
}

impl<T> Buffer<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Cuda(s) => s.len(),
            Store::Host(h) => h.len,
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cudarc slice, for calls this API does not wrap (cuBLAS, copies); `None` on the
    /// emulator.
    pub fn slice(&self) -> Option<&CudaSlice<T>> {
        match &self.store {
            Store::Cuda(s) => Some(s),
            Store::Host(_) => None,
        }
    }

    /// The cudarc slice, mutable; `None` on the emulator.
    pub fn slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        match &mut self.store {
            Store::Cuda(s) => Some(s),
            Store::Host(_) => None,
        }
    }
}

/// Bytes of guard before and after an emulated buffer (also its alignment, as `cudaMalloc`'s).
const GUARD: usize = 256;
/// What the guards hold; a launch that changes one wrote outside its buffer.
const GUARD_BYTE: u8 = 0xa5;

/// An emulated device buffer: `len` elements between two guard zones.
struct HostMem<T> {
    base: NonNull<u8>,
    len: usize,
    _t: PhantomData<T>,
}

// SAFETY: the memory is owned, like a `Vec<T>`'s.
unsafe impl<T: Send> Send for HostMem<T> {}
// SAFETY: shared access only reads.
unsafe impl<T: Sync> Sync for HostMem<T> {}

impl<T> HostMem<T> {
    fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes + 2 * GUARD, GUARD).expect("a buffer size fits a layout")
    }

    /// `len` elements copied from `init` (`len · size_of::<T>()` bytes), or zeroed.
    fn new(len: usize, init: Option<&[T]>) -> Result<Self, CudaError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|b| *b <= isize::MAX as usize - 2 * GUARD)
            .ok_or_else(|| {
                CudaError::Invalid(format!("a buffer of {len} elements is too large"))
            })?;
        // SAFETY: the layout's size is at least 2 · GUARD.
        let raw = unsafe { std::alloc::alloc(Self::layout(bytes)) };
        let base = NonNull::new(raw)
            .ok_or_else(|| CudaError::Invalid(format!("cannot allocate {bytes} bytes")))?;
        // SAFETY: the allocation holds GUARD + bytes + GUARD bytes; `init` holds `bytes` bytes.
        unsafe {
            let data = raw.add(GUARD);
            raw.write_bytes(GUARD_BYTE, GUARD);
            match init {
                Some(src) => data.copy_from_nonoverlapping(src.as_ptr().cast::<u8>(), bytes),
                None => data.write_bytes(0, bytes),
            }
            data.add(bytes).write_bytes(GUARD_BYTE, GUARD);
        }
        Ok(HostMem {
            base,
            len,
            _t: PhantomData,
        })
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: inside the allocation.
        unsafe { self.base.as_ptr().add(GUARD) }
    }

    fn to_vec(&self) -> Vec<T>
    where
        T: Clone,
    {
        // SAFETY: `len` initialized elements of T (uploaded, zeroed (`ValidAsZeroBits`) or written
        // by kernels in T's layout) at an alignment of GUARD.
        unsafe { std::slice::from_raw_parts(self.data().cast::<T>(), self.len) }.to_vec()
    }
}

/// Whether the guard zones on either side of an emulated buffer still hold [`GUARD_BYTE`].
///
/// # Safety
///
/// `data` and `bytes` must be a live [`HostMem`]'s data pointer and size.
#[cfg(mmq_emu)]
unsafe fn guards_intact(data: *const u8, bytes: usize) -> bool {
    // SAFETY: both zones lie inside the allocation (the caller's contract).
    let (head, tail) = unsafe {
        (
            std::slice::from_raw_parts(data.sub(GUARD), GUARD),
            std::slice::from_raw_parts(data.add(bytes), GUARD),
        )
    };
    head.iter().chain(tail).all(|&b| b == GUARD_BYTE)
}

impl<T> Drop for HostMem<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), Self::layout(self.bytes())) }
    }
}

/// Scales and zero points of a static quantization (see [`ScaleMap`]).
pub struct QuantParams<'a> {
    pub format: Format,
    pub map: ScaleMap,
    /// `map.count(n)` f32 scales.
    pub scales: &'a Buffer<f32>,
    /// `format.bytes(map.count(n))` zero points in the codes' format; `None`: 0.
    pub zeros: Option<&'a Buffer<u8>>,
    /// FP8: out-of-range values saturate to ±448 (else they become NaN).
    pub saturate: bool,
}

/// The scales a dynamic quantization writes.
pub enum GroupScales<'a> {
    F32(&'a mut Buffer<f32>),
    F16(&'a mut Buffer<f16>),
}

impl GroupScales<'_> {
    fn len(&self) -> usize {
        match self {
            GroupScales::F32(b) => b.len(),
            GroupScales::F16(b) => b.len(),
        }
    }
}

/// A 4-bit `MatMulNBits` weight on the device: B `[n, k / block, block / 2]` bytes, binary16
/// scales `[n, k / block]`, optional packed 4-bit zero points `[n, ceil(k / block / 2)]`.
pub struct NBits<'a> {
    pub b: &'a Buffer<u8>,
    pub scales: &'a Buffer<f16>,
    pub zeros: Option<&'a Buffer<u8>>,
    pub n: usize,
    pub k: usize,
    pub block: usize,
}

/// An INT8 KV cache for one K or V tensor: `[bh, max_blocks, KV_BLOCK_BYTES]` codes and
/// `[bh, max_blocks]` f32 scales (see [`crate::packed::kv_append`]).
pub struct KvCache {
    pub codes: Buffer<i8>,
    pub scales: Buffer<f32>,
    /// Batch × heads.
    pub bh: usize,
    pub head_dim: usize,
    pub max_blocks: usize,
}

impl KvCache {
    /// An empty cache for `max_tokens` tokens.
    pub fn new(
        dev: &Device,
        bh: usize,
        head_dim: usize,
        max_tokens: usize,
    ) -> Result<Self, CudaError> {
        kv_geometry(head_dim)?;
        let max_blocks = max_tokens.div_ceil(KV_BLOCK_BYTES / head_dim);
        Ok(KvCache {
            codes: dev.zeros(bh * max_blocks * KV_BLOCK_BYTES)?,
            scales: dev.zeros(bh * max_blocks)?,
            bh,
            head_dim,
            max_blocks,
        })
    }
}

fn kv_geometry(head_dim: usize) -> Result<usize, CudaError> {
    if head_dim == 0 || head_dim > KV_BLOCK_BYTES || !KV_BLOCK_BYTES.is_multiple_of(head_dim) {
        return invalid(format!(
            "head_dim {head_dim} must divide the {KV_BLOCK_BYTES}-byte KV block"
        ));
    }
    Ok(KV_BLOCK_BYTES / head_dim)
}

/// The kernels' `MmqDiv`: division of a 32-bit value by a constant as a multiply-high, an add and
/// a shift.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawDiv {
    mul: u32,
    shift: u32,
}

impl RawDiv {
    /// The multiplier and shift of `d >= 1` (`mmq_div_by`): shift = ceil(log2 d),
    /// mul = floor(2^32 (2^shift - d) / d) + 1.
    pub(crate) fn by(d: u64) -> RawDiv {
        let d = d.clamp(1, 1 << 32);
        let shift = 64 - (d - 1).leading_zeros();
        let mul = (((1u128 << 32) * ((1u128 << shift) - u128::from(d))) / u128::from(d) + 1) as u32;
        RawDiv { mul, shift }
    }

    /// `x / d` as the kernels compute it.
    #[cfg(test)]
    pub(crate) fn quotient(self, x: u32) -> u32 {
        let t = ((u64::from(x) * u64::from(self.mul)) >> 32) as u32;
        ((u64::from(t) + u64::from(x)) >> self.shift) as u32
    }
}

/// The kernels' `MmqScaleMap` (`mmq_scale_map` in mmq_blocks.cuh builds the same).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawScaleMap {
    mode: i64,
    axis_len: i64,
    inner: i64,
    row_len: i64,
    group: i64,
    chunk_uniform: i64,
    fast: i64,
    groups: i64,
    inner_div: RawDiv,
    axis_div: RawDiv,
    row_div: RawDiv,
    group_div: RawDiv,
}

impl RawScaleMap {
    /// The same map with the 64-bit index arithmetic the kernels use past 2^32 elements.
    #[cfg(test)]
    pub(crate) fn with_64_bit_indices(mut self) -> Self {
        self.fast = 0;
        self
    }
}

// SAFETY: a plain `#[repr(C)]` struct of i64 and u32 pairs, laid out as `MmqScaleMap` in
// mmq_blocks.cuh.
unsafe impl DeviceRepr for RawScaleMap {}

/// Checks a static quantization of `n` elements against its parameters and output length, and
/// gives the kernels' scale map.
pub fn quant_plan(
    n: usize,
    format: Format,
    map: &ScaleMap,
    scales: usize,
    zeros: Option<usize>,
    codes: usize,
) -> Result<RawScaleMap, CudaError> {
    let fast = i64::from(n <= u32::MAX as usize);
    let raw = match *map {
        ScaleMap::Tensor => RawScaleMap {
            chunk_uniform: 1,
            fast,
            ..Default::default()
        },
        ScaleMap::Axis { axis_len, inner } => {
            if axis_len == 0 || inner == 0 || !n.is_multiple_of(axis_len * inner) {
                return invalid(format!(
                    "a per-axis map (axis {axis_len}, inner {inner}) does not fit {n} elements"
                ));
            }
            RawScaleMap {
                mode: 1,
                axis_len: axis_len as i64,
                inner: inner as i64,
                chunk_uniform: i64::from(inner % 8 == 0),
                fast,
                inner_div: RawDiv::by(inner as u64),
                axis_div: RawDiv::by(axis_len as u64),
                ..Default::default()
            }
        }
        ScaleMap::Group { row_len, group } => {
            if row_len == 0 || group == 0 || !n.is_multiple_of(row_len) {
                return invalid(format!(
                    "a per-group map (rows of {row_len}, groups of {group}) does not fit {n} \
                     elements"
                ));
            }
            RawScaleMap {
                mode: 2,
                row_len: row_len as i64,
                group: group as i64,
                chunk_uniform: i64::from(group % 8 == 0 && row_len % 8 == 0),
                fast,
                groups: row_len.div_ceil(group) as i64,
                row_div: RawDiv::by(row_len as u64),
                group_div: RawDiv::by(group as u64),
                ..Default::default()
            }
        }
    };
    let want = map.count(n);
    if scales != want {
        return invalid(format!("{scales} scales given, {want} needed"));
    }
    if let Some(z) = zeros {
        if format == Format::E4M3 {
            return invalid("FP8 E4M3 has no zero points");
        }
        if z != format.bytes(want) {
            return invalid(format!(
                "{z} zero-point bytes given, {} needed",
                format.bytes(want)
            ));
        }
    }
    if codes != format.bytes(n) {
        return invalid(format!(
            "{codes} code bytes given, {} needed for {n} {} codes",
            format.bytes(n),
            format.name()
        ));
    }
    Ok(raw)
}

/// Checks a dynamic quantization of `x_len` elements in rows of `row_len` and groups of `group`;
/// returns the number of groups.
pub fn dynamic_plan(
    x_len: usize,
    row_len: usize,
    group: usize,
    format: Format,
    codes: usize,
    scales: usize,
    zeros: Option<usize>,
) -> Result<usize, CudaError> {
    if row_len == 0 || group == 0 || !x_len.is_multiple_of(row_len) {
        return invalid(format!(
            "rows of {row_len} in groups of {group} do not fit {x_len} elements"
        ));
    }
    // The kernels index inside a group, and count groups along a row, in 32 bits.
    if group > i32::MAX as usize || row_len.div_ceil(group) > i32::MAX as usize {
        return invalid(format!(
            "groups of {group} in rows of {row_len}: the kernels take groups of under 2^31 values \
             and under 2^31 groups a row"
        ));
    }
    if format.bits() == 4 && (!row_len.is_multiple_of(2) || !group.is_multiple_of(2)) {
        return invalid(format!(
            "4-bit groups must start on a byte: row length {row_len} and group {group} must be even"
        ));
    }
    let groups = ScaleMap::Group { row_len, group }.count(x_len);
    if codes != format.bytes(x_len) {
        return invalid(format!(
            "{codes} code bytes given, {} needed",
            format.bytes(x_len)
        ));
    }
    if scales != groups || zeros.is_some_and(|z| z != groups) {
        return invalid(format!(
            "{groups} groups need {groups} scales and zero points; {scales} scales and {zeros:?} \
             zero points given"
        ));
    }
    Ok(groups)
}

/// Checks an INT4 matrix product of `a_len` activations (`[m, k]`).
#[allow(
    clippy::too_many_arguments,
    reason = "the shapes, block and buffers of one INT4 product"
)]
pub fn nbits_plan(
    a_len: usize,
    n: usize,
    k: usize,
    block: usize,
    b: usize,
    scales: usize,
    zeros: Option<usize>,
    bias: Option<usize>,
    y: usize,
) -> Result<usize, CudaError> {
    if block < 32 || !block.is_power_of_two() || k == 0 || !k.is_multiple_of(block) || n == 0 {
        return invalid(format!(
            "block {block} must be a power of two of at least 32 dividing K {k} (N {n})"
        ));
    }
    if !a_len.is_multiple_of(k) {
        return invalid(format!("A holds {a_len} values, not a multiple of K {k}"));
    }
    let m = a_len / k;
    let k_blocks = k / block;
    let checks = [
        ("B bytes", b, n * k / 2),
        ("scales", scales, n * k_blocks),
        ("Y values", y, m * n),
    ];
    for (what, got, want) in checks {
        if got != want {
            return invalid(format!("{got} {what} given, {want} needed"));
        }
    }
    if zeros.is_some_and(|z| z != n * k_blocks.div_ceil(2)) || bias.is_some_and(|b| b != n) {
        return invalid(format!(
            "zero points must be {} bytes and bias {n} values",
            n * k_blocks.div_ceil(2)
        ));
    }
    Ok(m)
}

/// Compiles [`SOURCE`] to PTX for `arch` (e.g. `compute_90`) with NVRTC; no GPU needed.
pub fn compile_with_nvrtc(arch: &str) -> Result<Ptx, CudaError> {
    // SAFETY: only tries to load the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc(
            "put the directory holding libnvrtc.so.13 and libnvrtc-builtins.so.13.0 on \
             LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
        name: Some("mmq_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| CudaError::Compile {
        arch: arch.into(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// The kernel that quantizes `input` to `format`.
fn quantize_kernel(input: &str, format: Format) -> String {
    format!("mmq_quantize_{input}_{}", format.name())
}

/// The kernel that dequantizes `format` to `output`.
fn dequantize_kernel(format: Format, output: &str) -> String {
    format!("mmq_dequantize_{}_{output}", format.name())
}

/// Groups of at most this many values are quantized by lanes of one warp (`MMQ_WARP_GROUP`),
/// longer ones by a block each.
const WARP_GROUP: usize = 256;

/// The dynamic quantization kernel of `input` to `format` with f32 or binary16 scales, in its
/// warp form (short groups) or block form.
fn dynamic_kernel(input: &str, format: Format, scale_f16: bool, warp: bool) -> String {
    let s = if scale_f16 { "f16s" } else { "f32s" };
    let form = if warp { "warp" } else { "blocks" };
    format!("mmq_quantize_dynamic_{form}_{input}_{}_{s}", format.name())
}

/// Every kernel the launchers use, by name.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for input in ["f32", "f16", "bf16"] {
        for format in Format::ALL {
            names.push(quantize_kernel(input, format));
            names.push(dequantize_kernel(format, input));
            for (scale_f16, warp) in [(false, false), (false, true), (true, false), (true, true)] {
                names.push(dynamic_kernel(input, format, scale_f16, warp));
            }
        }
        names.push(format!("mmq_kv_append_{input}"));
    }
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_m{m}")));
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_tc_m{m}")));
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_lean_m{m}")));
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_lean_zp_m{m}")));
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_lean_small_m{m}")));
    names.extend((1..=8).map(|m| format!("mmq_nbits_gemv_lean_small_zp_m{m}")));
    names.push("mmq_nbits_gemm".into());
    names.extend([1, 4, 8].map(|m| format!("mmq_dense_gemv_m{m}")));
    names
}

/// The number of grid blocks for `work` items of `per_block` each, capped.
fn grid(work: usize, per_block: usize, cap: usize) -> u32 {
    work.div_ceil(per_block).clamp(1, cap) as u32
}

fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One kernel argument, by value.
enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    Map(RawScaleMap),
}

/// A launch's arguments in the kernel's order, with what keeps them valid: cudarc's stream
/// bookkeeping for device buffers; for emulated ones, their extents (loads are checked against
/// them) and the buffers whose guards are checked after the launch.
struct Args<'a> {
    stream: Option<&'a Arc<CudaStream>>,
    vals: Vec<Arg>,
    syncs: Vec<SyncOnDrop<'a>>,
    /// (argument index, data, bytes) of every emulated buffer argument.
    host: Vec<(usize, *const u8, usize)>,
    /// A buffer of another device (a GPU buffer on the emulator or the other way round): the
    /// launch is refused.
    foreign: bool,
}

impl<'a> Args<'a> {
    fn host_arg<T>(&mut self, h: &HostMem<T>) {
        self.host.push((self.vals.len(), h.data(), h.bytes()));
        self.vals.push(Arg::Ptr(h.data() as u64));
    }

    /// A buffer the kernel reads.
    fn buf<T>(&mut self, b: &'a Buffer<T>) -> &mut Self {
        match (&b.store, self.stream) {
            (Store::Cuda(s), Some(stream)) => {
                let (p, sync) = s.device_ptr(stream);
                self.syncs.push(sync);
                self.vals.push(Arg::Ptr(p));
            }
            (Store::Host(h), None) => self.host_arg(h),
            _ => self.foreign_arg(),
        }
        self
    }

    fn foreign_arg(&mut self) {
        self.foreign = true;
        self.vals.push(Arg::Ptr(0));
    }

    /// A buffer the kernel writes.
    fn buf_mut<T>(&mut self, b: &'a mut Buffer<T>) -> &mut Self {
        match (&mut b.store, self.stream) {
            (Store::Cuda(s), Some(stream)) => {
                let (p, sync) = s.device_ptr_mut(stream);
                self.syncs.push(sync);
                self.vals.push(Arg::Ptr(p));
            }
            (Store::Host(h), None) => self.host_arg(h),
            _ => self.foreign_arg(),
        }
        self
    }

    /// An optional buffer the kernel reads (a null pointer for `None`).
    fn opt<T>(&mut self, b: Option<&'a Buffer<T>>) -> &mut Self {
        match b {
            Some(b) => self.buf(b),
            None => {
                self.vals.push(Arg::Ptr(0));
                self
            }
        }
    }

    fn i64(&mut self, v: usize) -> &mut Self {
        self.vals.push(Arg::I64(v as i64));
        self
    }

    fn i32(&mut self, v: bool) -> &mut Self {
        self.vals.push(Arg::I32(i32::from(v)));
        self
    }

    fn map(&mut self, m: RawScaleMap) -> &mut Self {
        self.vals.push(Arg::Map(m));
        self
    }
}

#[cfg(mmq_emu)]
mod emu {
    use std::ffi::{c_char, c_void};

    #[repr(C)]
    pub struct Range {
        pub base: usize,
        pub bytes: usize,
    }

    unsafe extern "C" {
        pub fn mmq_emu_launch(
            name: *const c_char,
            grid: *const u32,
            block: *const u32,
            args: *const *mut c_void,
            ranges: *const Range,
            range_count: usize,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
    }
}

impl Device {
    /// Opens GPU `ordinal` and loads the kernels.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("context creation"))?;
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(driver("device name"))?;
        let capability = ctx
            .compute_capability()
            .map_err(driver("compute capability"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("multiprocessor count"))?
            .max(1) as u32;
        let fatbin = if FATBIN.is_empty() {
            None
        } else {
            ctx.load_module(Ptx::from_binary(FATBIN.to_vec())).ok()
        };
        let (module, code) = match fatbin {
            Some(m) => (m, CodeSource::Fatbin),
            None => {
                let arch = format!("compute_{}{}", capability.0, capability.1);
                let ptx = compile_with_nvrtc(&arch)?;
                let m = ctx.load_module(ptx).map_err(driver("module load"))?;
                (m, CodeSource::Nvrtc(arch))
            }
        };
        Ok(Device {
            backend: Backend::Cuda {
                ctx,
                stream,
                module,
            },
            name,
            capability,
            sm_count,
            code,
            gemv: Gemv::TensorCores,
            resident: Mutex::default(),
        })
    }

    /// The CPU emulator: the kernels compiled for the host, each CUDA thread a fiber (see the
    /// module's documentation). It reports sm_90 with tensor cores and 2 SMs (grids stay small).
    pub fn emulated() -> Result<Self, CudaError> {
        if !cfg!(mmq_emu) {
            return Err(CudaError::NoEmulator);
        }
        Ok(Device {
            backend: Backend::Emulated,
            name: "CPU emulator".into(),
            capability: (9, 0),
            sm_count: 2,
            code: CodeSource::Emulated,
            gemv: Gemv::TensorCores,
            resident: Mutex::default(),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The INT4 GEMV kernel chosen ([`Gemv::TensorCores`] unless set).
    pub fn gemv(&self) -> Gemv {
        self.gemv
    }

    /// Chooses the INT4 GEMV kernel (below sm_80 every choice runs on CUDA cores).
    pub fn set_gemv(&mut self, gemv: Gemv) {
        self.gemv = gemv;
    }

    /// Where the kernel code came from.
    pub fn code_source(&self) -> &CodeSource {
        &self.code
    }

    /// The stream every call is queued on; `None` on the emulator.
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.backend {
            Backend::Cuda { stream, .. } => Some(stream),
            Backend::Emulated => None,
        }
    }

    /// The context; `None` on the emulator.
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        match &self.backend {
            Backend::Cuda { ctx, .. } => Some(ctx),
            Backend::Emulated => None,
        }
    }

    /// A copy of `host` on the device.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<Buffer<T>, CudaError> {
        let store = match &self.backend {
            Backend::Cuda { stream, .. } => {
                Store::Cuda(stream.clone_htod(host).map_err(driver("upload"))?)
            }
            Backend::Emulated => Store::Host(HostMem::new(host.len(), Some(host))?),
        };
        Ok(Buffer { store })
    }

    /// `len` (at least 1) zeroed elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<Buffer<T>, CudaError> {
        if len == 0 {
            return invalid("a device buffer needs at least one element");
        }
        let store = match &self.backend {
            Backend::Cuda { stream, .. } => {
                Store::Cuda(stream.alloc_zeros(len).map_err(driver("allocation"))?)
            }
            Backend::Emulated => Store::Host(HostMem::new(len, None)?),
        };
        Ok(Buffer { store })
    }

    /// The buffer's contents, after everything queued so far.
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &Buffer<T>,
    ) -> Result<Vec<T>, CudaError> {
        match (&self.backend, &buf.store) {
            (Backend::Cuda { stream, .. }, Store::Cuda(slice)) => {
                let v = stream.clone_dtoh(slice).map_err(driver("download"))?;
                self.synchronize()?;
                Ok(v)
            }
            (Backend::Emulated, Store::Host(h)) => Ok(h.to_vec()),
            _ => invalid("a buffer of another device"),
        }
    }

    /// Waits for everything queued.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        match &self.backend {
            Backend::Cuda { stream, .. } => stream.synchronize().map_err(driver("synchronize")),
            Backend::Emulated => Ok(()),
        }
    }

    /// An empty argument list for a launch on this device.
    fn args(&self) -> Args<'_> {
        Args {
            stream: self.stream(),
            vals: Vec::new(),
            syncs: Vec::new(),
            host: Vec::new(),
            foreign: false,
        }
    }

    /// Launches kernel `name`; `what` names the call in errors.
    ///
    /// # Safety
    ///
    /// `args` must match the kernel's parameters in number, order and type, and every buffer
    /// must hold what the kernel reads and writes under `launch`.
    unsafe fn launch(
        &self,
        name: &str,
        launch: LaunchConfig,
        args: Args<'_>,
        what: &'static str,
    ) -> Result<(), CudaError> {
        if args.foreign {
            return invalid(format!(
                "{name}: a buffer argument belongs to another device than the {}",
                self.name
            ));
        }
        match &self.backend {
            Backend::Cuda { stream, module, .. } => {
                let f = module
                    .load_function(name)
                    .map_err(driver("kernel lookup"))?;
                let mut b = stream.launch_builder(&f);
                for v in &args.vals {
                    match v {
                        Arg::Ptr(p) => b.arg(p),
                        Arg::I64(x) => b.arg(x),
                        Arg::I32(x) => b.arg(x),
                        Arg::Map(m) => b.arg(m),
                    };
                }
                // SAFETY: the caller's contract.
                unsafe { b.launch(launch) }.map_err(driver(what))?;
                drop(args.syncs);
                Ok(())
            }
            Backend::Emulated => self.launch_emulated(name, launch, args),
        }
    }

    #[cfg(mmq_emu)]
    fn launch_emulated(
        &self,
        name: &str,
        launch: LaunchConfig,
        mut args: Args<'_>,
    ) -> Result<(), CudaError> {
        use std::ffi::{CStr, CString, c_void};
        let ptrs: Vec<*mut c_void> = args
            .vals
            .iter_mut()
            .map(|v| match v {
                Arg::Ptr(p) => (p as *mut u64).cast(),
                Arg::I64(x) => (x as *mut i64).cast(),
                Arg::I32(x) => (x as *mut i32).cast(),
                Arg::Map(m) => (m as *mut RawScaleMap).cast(),
            })
            .collect();
        let ranges: Vec<emu::Range> = args
            .host
            .iter()
            .map(|&(_, base, bytes)| emu::Range {
                base: base as usize,
                bytes,
            })
            .collect();
        let (g, b) = (launch.grid_dim, launch.block_dim);
        let c_name = CString::new(name).map_err(|_| CudaError::Invalid(name.into()))?;
        let mut err = vec![0u8; 512];
        // SAFETY: the arguments point at values of the kernel's parameter types (the caller's
        // contract, as for a device), the ranges at live buffers, `err` holds its length.
        let rc = unsafe {
            emu::mmq_emu_launch(
                c_name.as_ptr(),
                [g.0, g.1, g.2].as_ptr(),
                [b.0, b.1, b.2].as_ptr(),
                ptrs.as_ptr(),
                ranges.as_ptr(),
                ranges.len(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        let emulated = |message: String| CudaError::Emulated {
            kernel: name.into(),
            message,
        };
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err)
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(emulated(msg));
        }
        for &(i, data, bytes) in &args.host {
            // SAFETY: a buffer borrowed by `args`, so alive.
            if !unsafe { guards_intact(data, bytes) } {
                return Err(emulated(format!(
                    "wrote outside buffer argument {i} ({bytes} bytes)"
                )));
            }
        }
        Ok(())
    }

    #[cfg(not(mmq_emu))]
    fn launch_emulated(
        &self,
        _name: &str,
        _launch: LaunchConfig,
        _args: Args<'_>,
    ) -> Result<(), CudaError> {
        Err(CudaError::NoEmulator)
    }

    /// Quantizes `x` (`n = x.len()` elements) into `out` (`format.bytes(n)` bytes).
    pub fn quantize<T: Float>(
        &self,
        x: &Buffer<T>,
        q: &QuantParams<'_>,
        out: &mut Buffer<u8>,
    ) -> Result<(), CudaError> {
        let n = x.len();
        let map = quant_plan(
            n,
            q.format,
            &q.map,
            q.scales.len(),
            q.zeros.map(Buffer::len),
            out.len(),
        )?;
        let mut a = self.args();
        a.buf(x)
            .i64(n)
            .buf(q.scales)
            .opt(q.zeros)
            .map(map)
            .i32(q.saturate)
            .i32(true)
            .buf_mut(out);
        let launch = cfg(grid(n.div_ceil(8), 256, self.cap()), 256);
        // SAFETY: the argument list matches `mmq_quantize_*` in quantize.cu, and `quant_plan`
        // checked every buffer's length against what the kernel reads and writes.
        unsafe {
            self.launch(
                &quantize_kernel(T::NAME, q.format),
                launch,
                a,
                "quantize launch",
            )
        }
    }

    /// Dequantizes `n` codes into `y` (`n` values).
    pub fn dequantize<T: Float>(
        &self,
        codes: &Buffer<u8>,
        q: &QuantParams<'_>,
        y: &mut Buffer<T>,
    ) -> Result<(), CudaError> {
        let n = y.len();
        let map = quant_plan(
            n,
            q.format,
            &q.map,
            q.scales.len(),
            q.zeros.map(Buffer::len),
            codes.len(),
        )?;
        let mut a = self.args();
        a.buf(codes)
            .i64(n)
            .buf(q.scales)
            .opt(q.zeros)
            .map(map)
            .i32(true)
            .buf_mut(y);
        let launch = cfg(grid(n.div_ceil(8), 256, self.cap()), 256);
        // SAFETY: as in `quantize`, for `mmq_dequantize_*`.
        unsafe {
            self.launch(
                &dequantize_kernel(q.format, T::NAME),
                launch,
                a,
                "dequantize launch",
            )
        }
    }

    /// Quantizes rows of `row_len` in groups of `group` (per token: `group == row_len`), each
    /// group with the scale and zero point of its own range ([`crate::packed::group_qparams`]),
    /// in one pass: `scales` and `zeros` get one value per group.
    #[allow(
        clippy::too_many_arguments,
        reason = "the input, its row and group sizes and the three outputs"
    )]
    pub fn quantize_dynamic<T: Float>(
        &self,
        x: &Buffer<T>,
        row_len: usize,
        group: usize,
        format: Format,
        symmetric: bool,
        out: &mut Buffer<u8>,
        scales: GroupScales<'_>,
        zeros: Option<&mut Buffer<u8>>,
    ) -> Result<(), CudaError> {
        let groups = dynamic_plan(
            x.len(),
            row_len,
            group,
            format,
            out.len(),
            scales.len(),
            zeros.as_ref().map(|z| z.len()),
        )?;
        let warp = group <= WARP_GROUP;
        let name = dynamic_kernel(T::NAME, format, matches!(scales, GroupScales::F16(_)), warp);
        let vec = row_len.is_multiple_of(8) && group.is_multiple_of(8);
        let mut a = self.args();
        a.buf(x)
            .i64(x.len() / row_len)
            .i64(row_len)
            .i64(group)
            .i32(symmetric)
            .i32(vec)
            .buf_mut(out);
        match scales {
            GroupScales::F32(s) => a.buf_mut(s),
            GroupScales::F16(s) => a.buf_mut(s),
        };
        match zeros {
            Some(z) => a.buf_mut(z),
            None => a.opt::<u8>(None),
        };
        // Short groups take lanes of a warp, 32 bytes of input each (`MMQ_LANE_BYTES`); longer
        // ones a block with enough threads to hold the group in registers (64 bytes of input
        // each, `MMQ_HELD_BYTES`). The kernels stride over the groups and load each next group
        // while they code the current one, so one wave of resident blocks is enough.
        let (threads, per_block) = if warp {
            let per_lane = 32 / std::mem::size_of::<T>();
            (256, 8 * (32 / group.div_ceil(per_lane).next_power_of_two()))
        } else {
            let held = 64 / std::mem::size_of::<T>();
            (group.div_ceil(held).next_power_of_two().clamp(32, 512), 1)
        };
        let wave = self.resident_blocks(&name, threads as u32)?;
        let launch = cfg(grid(groups, per_block, wave), threads as u32);
        // SAFETY: the argument list matches `mmq_quantize_dynamic_*`; `dynamic_plan` checked the
        // lengths of the codes, scales and zero points against the groups the kernel writes.
        unsafe { self.launch(&name, launch, a, "dynamic quantize launch") }
    }

    /// Image features `[tokens, dim]` into the image cache's layout: symmetric INT4 in groups of
    /// 64 along `dim` with binary16 scales (`tokens · dim / 64`).
    pub fn image_features_int4<T: Float>(
        &self,
        x: &Buffer<T>,
        dim: usize,
        codes: &mut Buffer<u8>,
        scales: &mut Buffer<f16>,
    ) -> Result<(), CudaError> {
        if !dim.is_multiple_of(64) {
            return invalid(format!(
                "image features of width {dim} do not split into groups of 64"
            ));
        }
        self.quantize_dynamic(
            x,
            dim,
            64,
            Format::I4,
            true,
            codes,
            GroupScales::F16(scales),
            None,
        )
    }

    /// `y[m, n] = a[m, k] · dequant(B)ᵀ (+ bias)`, binary16 in and out: the GEMV kernel for m ≤ 8,
    /// the tiled GEMM above.
    pub fn nbits_matmul(
        &self,
        a: &Buffer<f16>,
        w: &NBits<'_>,
        bias: Option<&Buffer<f16>>,
        y: &mut Buffer<f16>,
    ) -> Result<(), CudaError> {
        let m = nbits_plan(
            a.len(),
            w.n,
            w.k,
            w.block,
            w.b.len(),
            w.scales.len(),
            w.zeros.map(Buffer::len),
            bias.map(Buffer::len),
            y.len(),
        )?;
        let mut args = self.args();
        args.buf(a)
            .buf(w.b)
            .buf(w.scales)
            .opt(w.zeros)
            .opt(bias)
            .buf_mut(y);
        if m <= 8 {
            // Tensor cores: a block of 8 warps per 16 columns in steps of 128 K. The first
            // kernel's steps must lie in one quantization block; the lean kernel (32-bit
            // indices) also takes blocks of 32 and 64 when K is a multiple of 128 (its `small`
            // form scales each 32 K). Else CUDA cores, a warp per column.
            let tc = self.capability.0 >= 8;
            let small = w.block < 128;
            let lean = tc && w.k <= i32::MAX as usize && (!small || w.k.is_multiple_of(128));
            let tensor_cores = tc && !small;
            let (name, launch) = match self.gemv {
                Gemv::TensorCores if lean => {
                    let zp = if w.zeros.is_some() { "_zp" } else { "" };
                    let form = if small { "_small" } else { "" };
                    (
                        format!("mmq_nbits_gemv_lean{form}{zp}_m{m}"),
                        cfg(grid(w.n, 16, 1 << 31), 256),
                    )
                }
                Gemv::TensorCores | Gemv::TensorCoresFirst if tensor_cores => (
                    format!("mmq_nbits_gemv_tc_m{m}"),
                    cfg(grid(w.n, 16, 1 << 31), 256),
                ),
                _ => (
                    format!("mmq_nbits_gemv_m{m}"),
                    cfg(grid(w.n, 4, 1 << 20), 128),
                ),
            };
            args.i64(w.n).i64(w.k).i64(w.block);
            // SAFETY: matches `mmq_nbits_gemv_m*`, `mmq_nbits_gemv_tc_m*` and
            // `mmq_nbits_gemv_lean*_m*`; `nbits_plan` checked every length.
            unsafe { self.launch(&name, launch, args, "INT4 GEMV launch") }
        } else {
            args.i64(m).i64(w.n).i64(w.k).i64(w.block);
            let launch = LaunchConfig {
                grid_dim: (w.n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `mmq_nbits_gemm`; `nbits_plan` checked every length.
            unsafe { self.launch("mmq_nbits_gemm", launch, args, "INT4 GEMM launch") }
        }
    }

    /// The dense binary16 GEMV `y[m, n] = a[m, k] · w[n, k]ᵀ` for m ∈ {1, 4, 8} (the baseline of
    /// the INT4 GEMV; K a multiple of 8).
    pub fn dense_gemv(
        &self,
        a: &Buffer<f16>,
        w: &Buffer<f16>,
        n: usize,
        y: &mut Buffer<f16>,
    ) -> Result<(), CudaError> {
        let k = w.len().checked_div(n).unwrap_or(0);
        if k == 0 || !k.is_multiple_of(8) || w.len() != n * k || !a.len().is_multiple_of(k) {
            return invalid(format!(
                "dense GEMV: W of {} values is not [N {n}, K] with K a multiple of 8, or A of {} \
                 values is not [M, K]",
                w.len(),
                a.len()
            ));
        }
        let m = a.len() / k;
        if !matches!(m, 1 | 4 | 8) || y.len() != m * n {
            return invalid(format!(
                "dense GEMV: M {m} must be 1, 4 or 8 and Y must hold M x N = {} values",
                m * n
            ));
        }
        let mut args = self.args();
        args.buf(a).buf(w).buf_mut(y).i64(n).i64(k);
        let launch = cfg(grid(n, 4, 1 << 20), 128);
        // SAFETY: matches `mmq_dense_gemv_m*`; the shapes were checked above.
        unsafe {
            self.launch(
                &format!("mmq_dense_gemv_m{m}"),
                launch,
                args,
                "dense GEMV launch",
            )
        }
    }

    /// Appends one step (`[bh, head_dim]`) at token position `pos` (see
    /// [`crate::packed::kv_append`]).
    pub fn kv_append<T: Float>(
        &self,
        step: &Buffer<T>,
        cache: &mut KvCache,
        pos: usize,
    ) -> Result<(), CudaError> {
        let per_block = kv_geometry(cache.head_dim)?;
        if step.len() != cache.bh * cache.head_dim {
            return invalid(format!(
                "a step of {} values for {} heads of {}",
                step.len(),
                cache.bh,
                cache.head_dim
            ));
        }
        if pos >= cache.max_blocks * per_block {
            return invalid(format!(
                "position {pos} is past the cache's {} tokens",
                cache.max_blocks * per_block
            ));
        }
        let launch = cfg(grid(cache.bh, 1, 1 << 20), 128);
        let mut a = self.args();
        a.buf(step)
            .i64(cache.bh)
            .i64(cache.head_dim)
            .i64(cache.max_blocks)
            .i64(pos)
            .buf_mut(&mut cache.codes)
            .buf_mut(&mut cache.scales);
        let name = format!("mmq_kv_append_{}", T::NAME);
        // SAFETY: matches `mmq_kv_append_*`; the step, position and cache geometry were checked.
        unsafe { self.launch(&name, launch, a, "KV append launch") }
    }

    /// How many blocks of `threads` running `name` fit on the device at once (every SM full).
    fn resident_blocks(&self, name: &str, threads: u32) -> Result<usize, CudaError> {
        let key = (name.to_owned(), threads);
        if let Some(&blocks) = self.resident.lock().ok().as_ref().and_then(|m| m.get(&key)) {
            return Ok(blocks);
        }
        let per_sm = match &self.backend {
            Backend::Cuda { module, .. } => module
                .load_function(name)
                .map_err(driver("kernel lookup"))?
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .map_err(driver("occupancy query"))?,
            // The emulator runs blocks one after another: one per SM.
            Backend::Emulated => 1,
        };
        let blocks = self.sm_count as usize * per_sm.max(1) as usize;
        if let Ok(mut m) = self.resident.lock() {
            m.insert(key, blocks);
        }
        Ok(blocks)
    }

    /// Grid cap for grid-stride kernels: enough blocks to fill every SM several times.
    fn cap(&self) -> usize {
        self.sm_count as usize * 32
    }
}

/// The (kind, architecture) of every entry of a fatbin: kind 1 PTX, 2 SASS (ELF); architecture as
/// `major * 10 + minor`. `None` when the bytes are not a fatbin.
pub fn fatbin_entries(bytes: &[u8]) -> Option<Vec<(u16, u32)>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    if u32_at(0)? != 0xba55_ed50 {
        return None;
    }
    let header = usize::from(u16_at(6)?);
    let end = header.checked_add(usize::try_from(u64_at(8)?).ok()?)?;
    let mut off = header;
    let mut out = Vec::new();
    while off < end.min(bytes.len()) {
        let kind = u16_at(off)?;
        let entry_header = u32_at(off + 4)? as usize;
        let payload = usize::try_from(u64_at(off + 8)?).ok()?;
        out.push((kind, u32_at(off + 28)?));
        off = off.checked_add(entry_header)?.checked_add(payload)?;
    }
    Some(out)
}

/// What the emulator catches that results alone would not show, each provoked through a real
/// kernel launched with arguments its launcher would refuse.
#[cfg(all(test, mmq_emu))]
mod emulator_checks {
    use super::*;

    fn per_tensor() -> RawScaleMap {
        RawScaleMap {
            chunk_uniform: 1,
            fast: 1,
            ..Default::default()
        }
    }

    /// `mmq_quantize_f32_i8` over `n` elements of `x` into `out`, one block of 32 threads.
    fn quantize(dev: &Device, x: Args<'_>, out: &mut Buffer<u8>, n: usize) -> CudaError {
        let scales = dev.upload(&[0.5f32]).unwrap();
        let mut a = x;
        a.i64(n)
            .buf(&scales)
            .opt::<u8>(None)
            .map(per_tensor())
            .i32(true)
            .i32(true)
            .buf_mut(out);
        // SAFETY: the kernel's parameter list; the lengths are wrong on purpose, and the
        // emulator's buffers are guarded.
        unsafe { dev.launch("mmq_quantize_f32_i8", cfg(1, 32), a, "test") }.unwrap_err()
    }

    #[test]
    fn a_load_past_its_buffer_is_an_error() {
        let dev = Device::emulated().unwrap();
        let x = dev.upload(&[1.0f32; 16]).unwrap();
        let mut out = dev.zeros::<u8>(64).unwrap();
        let mut a = dev.args();
        a.buf(&x);
        let e = quantize(&dev, a, &mut out, 64).to_string();
        assert!(
            e.contains("mmq_quantize_f32_i8") && e.contains("outside every buffer"),
            "{e}"
        );
        assert!(e.contains("block (0, 0, 0) thread (2, 0, 0)"), "{e}");
    }

    #[test]
    fn a_write_past_its_buffer_is_an_error() {
        let dev = Device::emulated().unwrap();
        let x = dev.upload(&[1.0f32; 64]).unwrap();
        let mut out = dev.zeros::<u8>(40).unwrap();
        let mut a = dev.args();
        a.buf(&x);
        let e = quantize(&dev, a, &mut out, 64).to_string();
        assert!(
            e.contains("wrote outside buffer argument 7 (40 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn a_misaligned_vector_load_is_an_error() {
        let dev = Device::emulated().unwrap();
        let x = dev.upload(&[1.0f32; 40]).unwrap();
        let mut out = dev.zeros::<u8>(32).unwrap();
        let mut a = dev.args();
        a.buf(&x);
        // The same buffer, one element in: its 128-bit loads are misaligned.
        let Arg::Ptr(p) = &mut a.vals[0] else {
            unreachable!()
        };
        *p += 4;
        let e = quantize(&dev, a, &mut out, 32).to_string();
        assert!(e.contains("misaligned 16-byte load"), "{e}");
    }

    #[test]
    fn a_shuffle_from_a_lane_outside_the_block_is_an_error() {
        // The dynamic kernel's block reductions assume whole warps: with 48 threads, lanes 0..15
        // of the second warp shuffle with lanes 16..31, which do not exist.
        let dev = Device::emulated().unwrap();
        let x = dev.upload(&[1.0f32; 1024]).unwrap();
        let mut codes = dev.zeros::<u8>(1024).unwrap();
        let mut scales = dev.zeros::<f32>(1).unwrap();
        let mut a = dev.args();
        a.buf(&x)
            .i64(1)
            .i64(1024)
            .i64(1024)
            .i32(true)
            .i32(true)
            .buf_mut(&mut codes)
            .buf_mut(&mut scales)
            .opt::<u8>(None);
        // SAFETY: the kernel's parameter list and lengths; only the block size is wrong.
        let name = "mmq_quantize_dynamic_blocks_f32_i8_f32s";
        let e = unsafe { dev.launch(name, cfg(1, 48), a, "test") }
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("thread (32, 0, 0): shuffle from a lane that is not live"),
            "{e}"
        );
    }

    /// One of `emu_selftest.cu`'s kernels on a block of 64 threads.
    fn selftest(name: &str) -> Result<Vec<i32>, CudaError> {
        let dev = Device::emulated().unwrap();
        let mut out = dev.zeros::<i32>(64).unwrap();
        let mut a = dev.args();
        a.buf_mut(&mut out);
        // SAFETY: the kernel takes one int32 buffer of a value per thread.
        unsafe { dev.launch(name, cfg(1, 64), a, "test") }?;
        dev.download(&out)
    }

    #[test]
    fn threads_waiting_at_different_collectives_are_a_deadlock() {
        let want: Vec<i32> = (0..64).map(|i| i ^ 1).collect();
        assert_eq!(selftest("mmq_selftest_shuffle").unwrap(), want);
        let e = selftest("mmq_selftest_divergent_shuffle")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("divergent_shuffle") && e.contains("deadlock"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_kernel_is_an_error() {
        let dev = Device::emulated().unwrap();
        // SAFETY: no kernel runs.
        let e = unsafe { dev.launch("mmq_no_such_kernel", cfg(1, 32), dev.args(), "test") }
            .unwrap_err()
            .to_string();
        assert!(e.contains("no kernel named mmq_no_such_kernel"), "{e}");
    }
}
