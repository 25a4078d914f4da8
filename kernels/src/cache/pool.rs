//! [`CachePool`]: one host allocation laid out by a [`CachePlan`], with page and image-slot
//! allocation, views of every region, and the writes of the cache kernels on the CPU (an INT8
//! KV step appended as [`crate::packed::kv_append`] does, image features quantized as
//! [`crate::packed::quantize_dynamic`] does). [`CachePool::to_device`] copies it into one device
//! buffer whose offsets are the plan's.

use half::f16;

use super::CacheFormat;
use super::plan::{ALIGN, CachePlan};
use crate::packed::{self, Format};

/// A region of the pool: (offset, bytes).
type Span = (u64, u64);

/// A KV page of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u64);

/// An image slot of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageId(pub u64);

/// A pool operation that cannot be done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The pool's bytes cannot be allocated.
    #[error("cannot allocate a cache pool of {0} bytes")]
    Alloc(u64),
    /// An argument is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// The cache pool on the host.
pub struct CachePool {
    plan: CachePlan,
    raw: Vec<u8>,
    /// Offset of the first [`ALIGN`]-aligned byte of `raw`.
    start: usize,
    free_pages: Vec<PageId>,
    free_images: Vec<ImageId>,
}

impl CachePool {
    /// A zeroed pool for `plan`, every page and slot free.
    pub fn new(plan: CachePlan) -> Result<Self, PoolError> {
        let len = usize::try_from(plan.pool_bytes + ALIGN)
            .map_err(|_| PoolError::Alloc(plan.pool_bytes))?;
        let mut raw = Vec::new();
        raw.try_reserve_exact(len)
            .map_err(|_| PoolError::Alloc(plan.pool_bytes))?;
        raw.resize(len, 0);
        let addr = raw.as_ptr() as usize;
        let start = addr.next_multiple_of(ALIGN as usize) - addr;
        Ok(CachePool {
            free_pages: (0..plan.kv_pages).rev().map(PageId).collect(),
            free_images: (0..plan.image_slots).rev().map(ImageId).collect(),
            plan,
            raw,
            start,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &CachePlan {
        &self.plan
    }

    /// The pool's bytes (starting at an [`ALIGN`]-aligned address).
    pub fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.plan.pool_bytes as usize]
    }

    /// A free KV page, or `None` when every page is taken.
    pub fn alloc_page(&mut self) -> Option<PageId> {
        self.free_pages.pop()
    }

    /// Returns a page to the pool.
    pub fn free_page(&mut self, page: PageId) {
        debug_assert!(!self.free_pages.contains(&page));
        self.free_pages.push(page);
    }

    /// A free image slot, or `None`.
    pub fn alloc_image(&mut self) -> Option<ImageId> {
        self.free_images.pop()
    }

    /// Returns an image slot to the pool.
    pub fn free_image(&mut self, slot: ImageId) {
        debug_assert!(!self.free_images.contains(&slot));
        self.free_images.push(slot);
    }

    fn region(&mut self, offset: u64, len: u64) -> &mut [u8] {
        let at = self.start + offset as usize;
        &mut self.raw[at..at + len as usize]
    }

    /// The plan's KV page layout (an error for a plan of image slots only).
    fn kv_page(&self) -> Result<&crate::cache::plan::KvPageLayout, PoolError> {
        self.plan.kv_page.as_ref().ok_or_else(|| {
            PoolError::Invalid("the plan has no KV pages (the models have no KV cache)".into())
        })
    }

    fn check_page(&self, page: PageId, tensor: usize, head: usize) -> Result<(), PoolError> {
        let kv = &self.plan.request.kv;
        let heads = kv.get(tensor).map(|t| t.heads as usize);
        if page.0 >= self.plan.kv_pages || heads.is_none_or(|h| head >= h) {
            return Err(PoolError::Invalid(format!(
                "page {} tensor {tensor} head {head} is outside the plan ({} pages, {} tensors)",
                page.0,
                self.plan.kv_pages,
                kv.len()
            )));
        }
        Ok(())
    }

    /// Index of (tensor, head) among the page's code blocks.
    fn block(&self, tensor: usize, head: usize) -> u64 {
        let before: u64 = self.plan.request.kv[..tensor].iter().map(|t| t.heads).sum();
        before + head as u64
    }

    /// The code block of `tensor`'s head `head` in `page`.
    pub fn page_codes(
        &mut self,
        page: PageId,
        tensor: usize,
        head: usize,
    ) -> Result<&mut [u8], PoolError> {
        self.check_page(page, tensor, head)?;
        let p = self.kv_page()?.clone();
        let off = self.plan.kv_page_offset(page.0)
            + p.codes.offset
            + self.block(tensor, head) * p.code_stride;
        let len = p.code_stride;
        Ok(self.region(off, len))
    }

    /// The scale table of `page` (raw bytes: f32 per block, or binary16 per token and group).
    pub fn page_scales(&mut self, page: PageId) -> Result<&mut [u8], PoolError> {
        self.check_page(page, 0, 0)?;
        let s = self.kv_page()?.scales;
        let off = self.plan.kv_page_offset(page.0) + s.offset;
        Ok(self.region(off, s.bytes))
    }

    /// Appends one token of `tensor` (`[heads, head_dim]`) at position `pos` of a sequence
    /// whose pages are `pages` (page `pos / tokens per page` must be there): INT8 pages only,
    /// with the block rule of [`crate::packed::kv_append`].
    pub fn append_kv(
        &mut self,
        pages: &[PageId],
        tensor: usize,
        pos: u64,
        step: &[f32],
    ) -> Result<(), PoolError> {
        if self.plan.request.kv_format != CacheFormat::Int8 {
            return Err(PoolError::Invalid(format!(
                "append_kv writes INT8 pages; this pool is {}",
                self.plan.request.kv_format
            )));
        }
        let t = self
            .plan
            .request
            .kv
            .get(tensor)
            .cloned()
            .ok_or_else(|| PoolError::Invalid(format!("no KV tensor {tensor}")))?;
        let (heads, dim) = (t.heads as usize, t.head_dim as usize);
        if step.len() != heads * dim {
            return Err(PoolError::Invalid(format!(
                "a step of '{}' has {} values, not {heads} x {dim}",
                t.name,
                step.len()
            )));
        }
        let per_page = self.kv_page()?.tokens;
        let page = *pages.get((pos / per_page) as usize).ok_or_else(|| {
            PoolError::Invalid(format!(
                "position {pos} needs page {} of the sequence",
                pos / per_page
            ))
        })?;
        let slot = (pos % per_page) as usize;
        for (h, x) in step.chunks_exact(dim).enumerate() {
            let mut codes: Vec<i8> = self
                .page_codes(page, tensor, h)?
                .iter()
                .map(|&b| b as i8)
                .collect();
            let at = self.block(tensor, h) as usize * 4;
            let table = self.page_scales(page)?;
            let mut scale = [f32::from_le_bytes(
                table[at..at + 4].try_into().expect("4 bytes"),
            )];
            packed::kv_append(&mut codes, &mut scale, x, dim, 1, slot);
            table[at..at + 4].copy_from_slice(&scale[0].to_le_bytes());
            for (b, c) in self.page_codes(page, tensor, h)?.iter_mut().zip(codes) {
                *b = c as u8;
            }
        }
        Ok(())
    }

    /// The dequantized tokens `0..len` of `tensor`'s head `head` in an INT8 sequence.
    pub fn read_kv(
        &mut self,
        pages: &[PageId],
        tensor: usize,
        head: usize,
        len: u64,
    ) -> Result<Vec<f32>, PoolError> {
        let dim = self
            .plan
            .request
            .kv
            .get(tensor)
            .map_or(0, |t| t.head_dim as usize);
        let per_page = self.kv_page()?.tokens;
        let mut out = Vec::with_capacity(len as usize * dim);
        for pos in 0..len {
            let page = *pages
                .get((pos / per_page) as usize)
                .ok_or_else(|| PoolError::Invalid(format!("position {pos} has no page")))?;
            let at = self.block(tensor, head) as usize * 4;
            let table = self.page_scales(page)?;
            let scale = f32::from_le_bytes(table[at..at + 4].try_into().expect("4 bytes"));
            let slot = (pos % per_page) as usize;
            let codes = self.page_codes(page, tensor, head)?;
            out.extend(
                codes[slot * dim..(slot + 1) * dim]
                    .iter()
                    .map(|&b| f32::from(b as i8) * scale),
            );
        }
        Ok(out)
    }

    fn image_regions(&self, slot: ImageId) -> Result<(Span, Span), PoolError> {
        let layout = self
            .plan
            .image_slot
            .as_ref()
            .filter(|_| slot.0 < self.plan.image_slots);
        let l = layout.ok_or_else(|| {
            PoolError::Invalid(format!(
                "image slot {} is outside the plan ({} slots)",
                slot.0, self.plan.image_slots
            ))
        })?;
        let at = self.plan.image_slot_offset(slot.0);
        Ok((
            (at + l.codes.offset, l.codes.bytes),
            (at + l.scales.offset, l.scales.bytes),
        ))
    }

    /// Stores one image's features (`[tokens, width]`) in `slot` as INT4 groups of 64 with
    /// binary16 scales.
    pub fn store_image(&mut self, slot: ImageId, features: &[f32]) -> Result<(), PoolError> {
        let ((co, cl), (so, sl)) = self.image_regions(slot)?;
        let img = self
            .plan
            .request
            .image
            .clone()
            .expect("a plan with slots has an image");
        if features.len() as u64 != img.tokens * img.width {
            return Err(PoolError::Invalid(format!(
                "image features of {} values, not {} x {}",
                features.len(),
                img.tokens,
                img.width
            )));
        }
        let q = packed::quantize_dynamic(
            features,
            img.width as usize,
            super::INT4_GROUP,
            Format::I4,
            true,
            true,
        );
        self.region(co, cl).copy_from_slice(&q.codes);
        let scales: Vec<u8> = q
            .scales
            .iter()
            .flat_map(|&s| f16::from_f32(s).to_le_bytes())
            .collect();
        self.region(so, sl).copy_from_slice(&scales);
        Ok(())
    }

    /// The features stored in `slot`, dequantized.
    pub fn load_image(&mut self, slot: ImageId) -> Result<Vec<f32>, PoolError> {
        let ((co, cl), (so, sl)) = self.image_regions(slot)?;
        let codes = self.region(co, cl).to_vec();
        let scales: Vec<f32> = self
            .region(so, sl)
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let n = codes.len() * 2;
        Ok((0..n)
            .map(|i| {
                let c = packed::code(&codes, Format::I4, i);
                let v = if c >= 8 {
                    i32::from(c) - 16
                } else {
                    i32::from(c)
                };
                v as f32 * scales[i / super::INT4_GROUP]
            })
            .collect())
    }

    /// The pool in one device buffer with the plan's offsets (the device's allocations are
    /// aligned to at least 256 bytes, so every region keeps its alignment).
    pub fn to_device(
        &self,
        dev: &crate::cuda::Device,
    ) -> Result<crate::cuda::Buffer<u8>, crate::cuda::CudaError> {
        dev.upload(self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{ImageTensor, KvTensor, PlanRequest, plan};
    use super::*;

    fn pool(budget: u64, images: u64) -> CachePool {
        let kv = (0..4)
            .map(|i| KvTensor {
                name: format!("past_key_values.{}.{}", i / 2, ["key", "value"][i % 2]),
                heads: 2,
                head_dim: 16,
            })
            .collect();
        let p = plan(PlanRequest {
            kv,
            kv_format: CacheFormat::Int8,
            kv_static_scales: false,
            image: Some(ImageTensor {
                name: "image_embeds".into(),
                tokens: 16,
                width: 64,
            }),
            images,
            budget,
        })
        .unwrap();
        CachePool::new(p).unwrap()
    }

    #[test]
    fn pages_and_slots_are_handed_out_up_to_the_plan_capacity() {
        let mut p = pool(100_000, 3);
        assert_eq!(p.bytes().as_ptr() as usize % ALIGN as usize, 0);
        let pages: Vec<PageId> = std::iter::from_fn(|| p.alloc_page()).collect();
        assert_eq!(pages.len() as u64, p.plan().kv_pages);
        let images: Vec<ImageId> = std::iter::from_fn(|| p.alloc_image()).collect();
        assert_eq!(images.len(), 3);
        p.free_page(pages[1]);
        assert_eq!(p.alloc_page(), Some(pages[1]));
        assert!(p.alloc_page().is_none());
        assert!(p.page_codes(PageId(999), 0, 0).is_err());
    }

    #[test]
    fn kv_appends_match_the_kernel_reference_and_images_round_trip() {
        let mut p = pool(1 << 20, 1);
        let pages: Vec<PageId> = (0..3).map(|_| p.alloc_page().unwrap()).collect();
        // 70 tokens of tensor 3 (2 heads x 16), crossing two page boundaries (32 per page).
        let mut reference = vec![0i8; 2 * 3 * 512];
        let mut ref_scales = vec![0f32; 2 * 3];
        let mut all = Vec::new();
        for pos in 0..70u64 {
            let step: Vec<f32> = (0..32)
                .map(|i| ((pos * 31 + i) % 17) as f32 * 0.1 - 0.8 + pos as f32 * 0.01)
                .collect();
            p.append_kv(&pages, 3, pos, &step).unwrap();
            packed::kv_append(&mut reference, &mut ref_scales, &step, 16, 3, pos as usize);
            all.push(step);
        }
        for head in 0..2 {
            let got = p.read_kv(&pages, 3, head, 70).unwrap();
            for pos in 0..70usize {
                let (blk, slot) = (pos / 32, pos % 32);
                let s = ref_scales[head * 3 + blk];
                for i in 0..16 {
                    let want = f32::from(reference[(head * 3 + blk) * 512 + slot * 16 + i]) * s;
                    assert_eq!(got[pos * 16 + i], want, "head {head} pos {pos} elem {i}");
                }
            }
            let x: Vec<f64> = all
                .iter()
                .flat_map(|s| &s[head * 16..head * 16 + 16])
                .map(|&v| f64::from(v))
                .collect();
            let y: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
            let dot: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
            let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
            let c = dot / (norm(&x) * norm(&y));
            // The block rule recodes older tokens as the scale grows: close, not exact.
            assert!(c > 0.995, "head {head}: cosine {c}");
        }
        // Tensor 0 was never written.
        assert!(
            p.page_codes(pages[0], 0, 0)
                .unwrap()
                .iter()
                .all(|&b| b == 0)
        );

        let slot = p.alloc_image().unwrap();
        let feats: Vec<f32> = (0..16 * 64)
            .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.1)
            .collect();
        p.store_image(slot, &feats).unwrap();
        let back = p.load_image(slot).unwrap();
        for (g, (a, b)) in feats.chunks(64).zip(back.chunks(64)).enumerate() {
            let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= amax / 7.0 * 0.5 + 1e-3,
                    "group {g}: {x} vs {y}"
                );
            }
        }
        assert!(p.store_image(slot, &feats[1..]).is_err());
    }
}
