//! The cache pool's layout: one byte pool for KV pages and image slots, every region aligned to
//! [`ALIGN`] bytes.
//!
//! A **KV page** holds one block of tokens of one sequence for every KV tensor of the model
//! (`layers × {key, value}`) and every head: per (tensor, head) one code block, then the page's
//! scale table. INT8/FP8 pages hold `512 / head_dim` tokens (one 512-byte code block and one
//! f32 scale per tensor and head); INT4 pages `1024 / head_dim` tokens (512 bytes of codes and
//! one binary16 scale per token and group of up to 64). A sequence owns a list of pages, as in
//! paged attention. An **image slot** holds one image's features as INT4 groups of 64 (32 bytes
//! per group, eight groups per 256-byte block) and their binary16 scales. The pool is the image
//! slots first, then the KV pages; what is left of the budget after the requested image slots
//! goes to KV pages.

use serde::Serialize;

use super::{CacheFormat, CacheScales, INT4_GROUP};

/// The alignment of every region of the pool, in bytes.
pub const ALIGN: u64 = 128;

/// Bytes of one code block of one head in a KV page.
pub const PAGE_CODE_BYTES: u64 = 512;

fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// A KV tensor of the model (one layer's keys or values).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvTensor {
    /// The cache input's name (`past_key_values.0.key`).
    pub name: String,
    /// Heads.
    pub heads: u64,
    /// Elements per token and head.
    pub head_dim: u64,
}

/// An image-feature tensor of the model (one image).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImageTensor {
    /// The vision output's name (`image_embeds`).
    pub name: String,
    /// Feature tokens per image.
    pub tokens: u64,
    /// Elements per token.
    pub width: u64,
}

/// What the pool must hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanRequest {
    /// The KV tensors (all with one head_dim).
    pub kv: Vec<KvTensor>,
    /// The KV code format.
    pub kv_format: CacheFormat,
    /// The KV scales are static, constants of the model (ONNX Runtime's `GroupQueryAttention`
    /// INT8 cache, one scale per head and channel): a page holds codes only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kv_static_scales: bool,
    /// The image-feature tensor, if the model has one.
    pub image: Option<ImageTensor>,
    /// Image slots to reserve.
    pub images: u64,
    /// The pool's size limit in bytes.
    pub budget: u64,
}

/// One region of a slot: where it starts (from the slot's start), its length, its stride when it
/// is a table of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    /// Offset from the start of the slot, a multiple of [`ALIGN`].
    pub offset: u64,
    /// Bytes used.
    pub bytes: u64,
}

/// The layout of one KV page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvPageLayout {
    /// Tokens per page.
    pub tokens: u64,
    /// Bytes of one page (a multiple of [`ALIGN`]).
    pub bytes: u64,
    /// Code blocks, one per (tensor, head) in tensor-major order: block `t * heads + h` at
    /// `codes.offset + (t * heads + h) * code_stride`.
    pub codes: Region,
    /// Bytes between consecutive code blocks.
    pub code_stride: u64,
    /// The scale table: f32 `[tensors, heads]` (blocks) or binary16 `[tensors, heads, tokens,
    /// head_dim / group]` (groups); empty where the scales are static.
    pub scales: Region,
    /// `"f32"` or `"f16"`; `"static"` where the scales are constants of the model.
    pub scale_dtype: &'static str,
}

/// The layout of one image slot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ImageSlotLayout {
    /// Bytes of one slot (a multiple of [`ALIGN`]).
    pub bytes: u64,
    /// INT4 codes `[tokens, width]`, two per byte, low nibble first.
    pub codes: Region,
    /// Binary16 scales `[tokens, width / 64]`.
    pub scales: Region,
}

/// Where the pool's slots are and how many there are.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CachePlan {
    /// The request.
    pub request: PlanRequest,
    /// Alignment of every region.
    pub align: u64,
    /// One KV page (`None` when the models have no KV cache: a plan of image slots only).
    pub kv_page: Option<KvPageLayout>,
    /// One image slot, when the model has image features.
    pub image_slot: Option<ImageSlotLayout>,
    /// Offset of the first image slot (0).
    pub images_offset: u64,
    /// Image slots.
    pub image_slots: u64,
    /// Offset of the first KV page.
    pub kv_offset: u64,
    /// KV pages.
    pub kv_pages: u64,
    /// Bytes the pool takes (at most the budget).
    pub pool_bytes: u64,
    /// KV bytes per token of one sequence, all layers, scales included (page bytes / tokens).
    pub kv_bytes_per_token: f64,
    /// The same for one layer (keys and values).
    pub kv_bytes_per_token_per_layer: f64,
    /// The same in fp32, for the ratio.
    pub fp32_bytes_per_token: u64,
    /// Bytes of one image's features in the pool (slot bytes), and in fp32.
    pub image_bytes: Option<(u64, u64)>,
    /// Tokens the KV pages hold (pages × tokens per page), over all sequences.
    pub token_capacity: u64,
}

/// Why a plan cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The models have neither a KV tensor nor image features to plan.
    #[error(
        "the models have no KV cache (past…/present… pairs) and no vision feature output: \
         nothing to plan"
    )]
    Nothing,
    /// Image features but no KV cache, and no image slot asked for.
    #[error(
        "the models have no KV cache (past…/present… pairs); ask for image slots (--images N) \
         to plan the image features alone"
    )]
    NoSlots,
    /// KV tensors of different head sizes.
    #[error("KV tensors '{0}' and '{1}' have different head sizes")]
    MixedHeads(String, String),
    /// A tensor does not fit the format.
    #[error("{0}")]
    Geometry(String),
    /// The budget is too small.
    #[error(
        "a budget of {budget} bytes holds {what} ({need} bytes); at least {need} bytes are needed"
    )]
    Budget {
        /// The budget.
        budget: u64,
        /// What did not fit.
        what: String,
        /// The bytes needed.
        need: u64,
    },
}

/// Plans the pool.
pub fn plan(request: PlanRequest) -> Result<CachePlan, PlanError> {
    let kv_page = match request.kv.first() {
        Some(first) => Some(kv_page_layout(&request, first)?),
        None if request.image.is_none() => return Err(PlanError::Nothing),
        None if request.images == 0 => return Err(PlanError::NoSlots),
        None => None,
    };
    let image_slot = match &request.image {
        Some(img) => {
            if img.width % INT4_GROUP as u64 != 0 {
                return Err(PlanError::Geometry(format!(
                    "image features '{}' of width {} do not split into INT4 groups of {INT4_GROUP}",
                    img.name, img.width
                )));
            }
            let codes = Region {
                offset: 0,
                bytes: img.tokens * img.width / 2,
            };
            let scales = Region {
                offset: align(codes.bytes),
                bytes: img.tokens * (img.width / INT4_GROUP as u64) * 2,
            };
            Some(ImageSlotLayout {
                bytes: align(scales.offset + scales.bytes),
                codes,
                scales,
            })
        }
        None => None,
    };
    let image_slots = if image_slot.is_some() {
        request.images
    } else {
        0
    };
    let images_bytes = image_slot.as_ref().map_or(0, |s| s.bytes) * image_slots;
    if images_bytes > request.budget {
        return Err(PlanError::Budget {
            budget: request.budget,
            what: format!("{image_slots} image slots"),
            need: images_bytes,
        });
    }
    let (page_bytes, tokens) = kv_page.as_ref().map_or((0, 0), |p| (p.bytes, p.tokens));
    let kv_pages = (request.budget - images_bytes)
        .checked_div(page_bytes)
        .unwrap_or(0);
    if kv_page.is_some() && kv_pages == 0 {
        return Err(PlanError::Budget {
            budget: request.budget,
            what: "one KV page besides the image slots".into(),
            need: images_bytes + page_bytes,
        });
    }
    let layers = (request.kv.len() as u64).div_ceil(2).max(1);
    let fp32_bytes_per_token = request.kv.iter().map(|t| t.heads * t.head_dim * 4).sum();
    let image_bytes = match (&image_slot, &request.image) {
        (Some(s), Some(img)) => Some((s.bytes, img.tokens * img.width * 4)),
        _ => None,
    };
    Ok(CachePlan {
        align: ALIGN,
        images_offset: 0,
        image_slots,
        kv_offset: images_bytes,
        kv_pages,
        pool_bytes: images_bytes + kv_pages * page_bytes,
        kv_bytes_per_token: if tokens == 0 {
            0.0
        } else {
            page_bytes as f64 / tokens as f64
        },
        kv_bytes_per_token_per_layer: if tokens == 0 {
            0.0
        } else {
            page_bytes as f64 / tokens as f64 / layers as f64
        },
        fp32_bytes_per_token,
        image_bytes,
        token_capacity: kv_pages * tokens,
        kv_page,
        image_slot,
        request,
    })
}

impl CachePlan {
    /// The KV lines of [`CachePlan::summary`].
    fn kv_summary(&self, p: &KvPageLayout) -> String {
        let r = &self.request;
        let scales = if r.kv_static_scales {
            "scales static (per head and channel, in the model)".to_owned()
        } else {
            format!(
                "scales ({}) at +{}, {} bytes",
                p.scale_dtype, p.scales.offset, p.scales.bytes
            )
        };
        let mut s = format!(
            "kv: {} tensors ({} heads in all, head_dim {}), {} pages of {} tokens, {} bytes each \
             at offset {}\n  codes: {} blocks of {} bytes at +{}; {scales}\n",
            r.kv.len(),
            r.kv.iter().map(|t| t.heads).sum::<u64>(),
            r.kv[0].head_dim,
            self.kv_pages,
            p.tokens,
            p.bytes,
            self.kv_offset,
            p.codes.bytes / p.code_stride,
            p.code_stride,
            p.codes.offset,
        );
        s += &format!(
            "  {:.2} bytes per token ({:.2} per layer), fp32 {} ({:.2}x smaller); {} tokens fit\n",
            self.kv_bytes_per_token,
            self.kv_bytes_per_token_per_layer,
            self.fp32_bytes_per_token,
            self.fp32_bytes_per_token as f64 / self.kv_bytes_per_token,
            self.token_capacity
        );
        s
    }

    /// Offset of KV page `page` in the pool.
    pub fn kv_page_offset(&self, page: u64) -> u64 {
        self.kv_offset + page * self.kv_page.as_ref().map_or(0, |p| p.bytes)
    }

    /// Offset of image slot `slot` in the pool.
    pub fn image_slot_offset(&self, slot: u64) -> u64 {
        self.images_offset + slot * self.image_slot.as_ref().map_or(0, |s| s.bytes)
    }

    /// Every region of the pool as (what, offset, bytes), in pool order.
    pub fn regions(&self) -> Vec<(String, u64, u64)> {
        let mut out = Vec::new();
        if let Some(s) = &self.image_slot {
            for i in 0..self.image_slots {
                let at = self.image_slot_offset(i);
                out.push((
                    format!("image {i} codes"),
                    at + s.codes.offset,
                    s.codes.bytes,
                ));
                out.push((
                    format!("image {i} scales"),
                    at + s.scales.offset,
                    s.scales.bytes,
                ));
            }
        }
        let Some(p) = &self.kv_page else {
            return out;
        };
        for i in 0..self.kv_pages {
            let at = self.kv_page_offset(i);
            for b in 0..p.codes.bytes / p.code_stride {
                out.push((
                    format!("page {i} block {b} codes"),
                    at + p.codes.offset + b * p.code_stride,
                    p.code_stride,
                ));
            }
            if p.scales.bytes > 0 {
                out.push((
                    format!("page {i} scales"),
                    at + p.scales.offset,
                    p.scales.bytes,
                ));
            }
        }
        out
    }

    /// The plan as text, for a terminal.
    pub fn summary(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let r = &self.request;
        let mut s = format!(
            "pool: {} bytes ({:.3} GiB) of a {} byte budget, every region aligned to {} bytes\n",
            self.pool_bytes,
            gib(self.pool_bytes),
            r.budget,
            self.align
        );
        if let Some(p) = &self.kv_page {
            s += &self.kv_summary(p);
        } else {
            s += "kv: none (no past…/present… pairs in the models)\n";
        }
        match (&self.image_slot, &r.image, self.image_bytes) {
            (Some(slot), Some(img), Some((bytes, fp32))) => {
                s += &format!(
                    "images: '{}' [{} tokens, {}] as INT4 groups of 64, {} slots of {} bytes at \
                     offset {} (codes +{}, {} bytes; scales +{}, {} bytes); fp32 {} bytes \
                     ({:.2}x smaller)\n",
                    img.name,
                    img.tokens,
                    img.width,
                    self.image_slots,
                    slot.bytes,
                    self.images_offset,
                    slot.codes.offset,
                    slot.codes.bytes,
                    slot.scales.offset,
                    slot.scales.bytes,
                    fp32,
                    fp32 as f64 / bytes as f64
                );
            }
            _ => s += "images: none (no vision feature output in the models)\n",
        }
        s
    }
}

/// The layout of one KV page for the tensors of `request` (`first` among them).
fn kv_page_layout(request: &PlanRequest, first: &KvTensor) -> Result<KvPageLayout, PlanError> {
    if let Some(other) = request.kv.iter().find(|t| t.head_dim != first.head_dim) {
        return Err(PlanError::MixedHeads(
            first.name.clone(),
            other.name.clone(),
        ));
    }
    let head_dim = first.head_dim;
    let scales = request
        .kv_format
        .scales(head_dim as usize)
        .map_err(|e| PlanError::Geometry(e.0))?;
    let heads: u64 = request.kv.iter().map(|t| t.heads).sum();
    // Per page: one 512-byte code block per (tensor, head).
    let code_bits = request.kv_format.format().bits() as u64;
    let tokens = PAGE_CODE_BYTES * 8 / code_bits / head_dim;
    let codes = Region {
        offset: 0,
        bytes: heads * PAGE_CODE_BYTES,
    };
    let (scale_bytes, scale_dtype) = match scales {
        _ if request.kv_static_scales => (0, "static"),
        CacheScales::Blocks { .. } => (heads * 4, "f32"),
        CacheScales::Groups { group } => (heads * tokens * (head_dim / group as u64) * 2, "f16"),
    };
    let scale_region = Region {
        offset: align(codes.bytes),
        bytes: scale_bytes,
    };
    let page_bytes = align(scale_region.offset + scale_region.bytes);
    Ok(KvPageLayout {
        tokens,
        bytes: page_bytes,
        codes,
        code_stride: PAGE_CODE_BYTES,
        scales: scale_region,
        scale_dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        format: CacheFormat,
        heads: u64,
        head_dim: u64,
        layers: u64,
        budget: u64,
    ) -> PlanRequest {
        PlanRequest {
            kv: (0..layers * 2)
                .map(|i| KvTensor {
                    name: format!(
                        "past_key_values.{}.{}",
                        i / 2,
                        if i % 2 == 0 { "key" } else { "value" }
                    ),
                    heads,
                    head_dim,
                })
                .collect(),
            kv_format: format,
            kv_static_scales: false,
            image: Some(ImageTensor {
                name: "image_embeds".into(),
                tokens: 16 + heads,
                width: 64 * (1 + layers % 3),
            }),
            images: layers % 4,
            budget,
        }
    }

    /// Alignment, no overlap, inside the budget, and capacity, over a grid of models and budgets.
    #[test]
    fn every_region_is_aligned_disjoint_and_inside_the_budget() {
        let mut checked = 0;
        for format in CacheFormat::ALL {
            for head_dim in [8u64, 16, 32, 64, 128, 256] {
                for heads in [1u64, 2, 3, 8] {
                    for layers in [1u64, 2, 5] {
                        for budget in [1u64 << 16, 300_001, 1 << 20] {
                            let Ok(p) = plan(request(format, heads, head_dim, layers, budget))
                            else {
                                continue;
                            };
                            checked += 1;
                            assert!(p.pool_bytes <= budget);
                            let mut regions = p.regions();
                            for (what, off, len) in &regions {
                                assert_eq!(off % ALIGN, 0, "{what} at {off}");
                                assert!(off + len <= p.pool_bytes, "{what}");
                            }
                            regions.sort_by_key(|r| r.1);
                            for w in regions.windows(2) {
                                assert!(
                                    w[0].1 + w[0].2 <= w[1].1,
                                    "{:?} overlaps {:?}",
                                    w[0],
                                    w[1]
                                );
                            }
                            // Capacity: one more page would not fit.
                            let images =
                                p.image_slot.as_ref().map_or(0, |s| s.bytes) * p.image_slots;
                            let page = p.kv_page.as_ref().expect("a KV page");
                            assert!(images + (p.kv_pages + 1) * page.bytes > budget);
                            assert_eq!(p.token_capacity, p.kv_pages * page.tokens);
                        }
                    }
                }
            }
        }
        assert!(checked > 300, "{checked} plans checked");
    }

    #[test]
    fn static_scales_leave_a_page_of_codes_only() {
        // GroupQueryAttention's INT8 cache: the same code blocks, no scale table.
        let p = plan(PlanRequest {
            images: 0,
            image: None,
            kv_static_scales: true,
            ..request(CacheFormat::Int8, 2, 16, 2, 1 << 20)
        })
        .unwrap();
        let page = p.kv_page.as_ref().expect("a KV page");
        assert_eq!(
            (page.tokens, page.bytes, page.codes.bytes),
            (32, 4096, 4096)
        );
        assert_eq!((page.scales.bytes, page.scale_dtype), (0, "static"));
        // 4 tensors x 2 heads x 16 values, one byte each: 128 bytes a token, 4x fewer than fp32.
        assert_eq!(p.kv_bytes_per_token, 128.0);
        assert_eq!(p.fp32_bytes_per_token, 512);
        assert_eq!(p.kv_pages, 256);
        assert!(
            p.regions()
                .iter()
                .all(|(what, _, _)| !what.contains("scales"))
        );
        assert!(
            p.summary()
                .contains("scales static (per head and channel, in the model)")
        );
    }

    #[test]
    fn int8_pages_follow_the_512_byte_blocks() {
        // 2 layers, 2 KV heads of 16: 32 tokens per page, 8 code blocks, 8 f32 scales.
        let p = plan(PlanRequest {
            images: 1,
            ..request(CacheFormat::Int8, 2, 16, 2, 1 << 20)
        })
        .unwrap();
        let page = p.kv_page.as_ref().expect("a KV page");
        assert_eq!(page.tokens, 32);
        assert_eq!(page.codes.bytes, 8 * 512);
        assert_eq!(
            page.scales,
            Region {
                offset: 4096,
                bytes: 32
            }
        );
        assert_eq!(page.bytes, 4096 + 128);
        // fp32: 4 tensors x 2 heads x 16 x 4 bytes = 512 bytes per token; INT8: a page of
        // 4096 code bytes + 128 (32 scale bytes, aligned) per 32 tokens = 132.
        assert_eq!(p.fp32_bytes_per_token, 512);
        assert!((p.kv_bytes_per_token - 132.0).abs() < 1e-9);
        let e = plan(request(CacheFormat::Int8, 2, 16, 2, 1000)).unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
    }
}
