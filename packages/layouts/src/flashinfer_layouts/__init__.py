"""flashinfer_layouts: pack, quantise and unpack the KV-cache byte layouts of the
FlashInfer sparse-attention kernels in pure PyTorch (CPU and CUDA tensors).

* FP8 per-token indexer cache (`fp8`): E4M3 values + float32 per-token scales in the
  two-region ``kv_fused`` block.
* MXFP4 (`mxfp4`): E2M1 nibbles + UE8M0 scales per 32 elements; ``q``/``q_sf`` and the
  MXFP4 ``kv_fused`` block with token-major or interleaved scale slots.
* NVFP4 (`nvfp4`): E2M1 nibbles + E4M3 scales per 16 elements + a global scale, with the
  128x4-swizzled or linear scale layout.
* The packed NVFP4 MSA page (`msa_page`): ``[K data | K scales | V data | V scales]``.
* The serving write path (`write`): quantise new rows and scatter them by slot.
"""

from .fp8 import (
    dequantize_fp8_kv_cache,
    fp8_kv_cache_head_dim,
    pack_fp8_kv_cache,
    quantize_fp8_per_token,
    unpack_fp8_kv_cache,
)
from .msa_page import (
    MSA_HEAD_DIM,
    MSA_PAGE_SIZE,
    MsaPageOffsets,
    dequantize_msa_v_scales,
    msa_page_offsets,
    msa_page_views,
    pack_nvfp4_msa_pages,
    swizzle_msa_v_scales,
    unpack_nvfp4_msa_pages,
    unswizzle_msa_v_scales,
)
from .mxfp4 import (
    MXFP4_SF_VEC_SIZE,
    dequantize_mxfp4,
    dequantize_mxfp4_kv_cache,
    dequantize_mxfp4_q,
    mxfp4_interleaved_slot_of_token,
    mxfp4_interleaved_token_of_slot,
    mxfp4_kv_cache_head_dim,
    pack_mxfp4_kv_cache,
    pack_mxfp4_q,
    quantize_mxfp4,
    quantize_mxfp4_kv_cache,
    quantize_mxfp4_q,
    ue8m0_scale_bytes,
    unpack_mxfp4_kv_cache,
    unpack_mxfp4_q,
)
from .nvfp4 import (
    NVFP4_SF_VEC_SIZE,
    nvfp4_dequantize,
    nvfp4_global_scale,
    nvfp4_quantize,
    swizzle_128x4,
    swizzle_128x4_offset,
    swizzled_128x4_shape,
    unswizzle_128x4,
)
from .write import write_fp8_kv_cache, write_mxfp4_kv_cache

__version__ = "0.1.0"

__all__ = [
    "MSA_HEAD_DIM",
    "MSA_PAGE_SIZE",
    "MXFP4_SF_VEC_SIZE",
    "NVFP4_SF_VEC_SIZE",
    "MsaPageOffsets",
    "__version__",
    "dequantize_fp8_kv_cache",
    "dequantize_msa_v_scales",
    "dequantize_mxfp4",
    "dequantize_mxfp4_kv_cache",
    "dequantize_mxfp4_q",
    "fp8_kv_cache_head_dim",
    "msa_page_offsets",
    "msa_page_views",
    "mxfp4_interleaved_slot_of_token",
    "mxfp4_interleaved_token_of_slot",
    "mxfp4_kv_cache_head_dim",
    "nvfp4_dequantize",
    "nvfp4_global_scale",
    "nvfp4_quantize",
    "pack_fp8_kv_cache",
    "pack_mxfp4_kv_cache",
    "pack_mxfp4_q",
    "pack_nvfp4_msa_pages",
    "quantize_fp8_per_token",
    "quantize_mxfp4",
    "quantize_mxfp4_kv_cache",
    "quantize_mxfp4_q",
    "swizzle_128x4",
    "swizzle_128x4_offset",
    "swizzle_msa_v_scales",
    "swizzled_128x4_shape",
    "ue8m0_scale_bytes",
    "unpack_fp8_kv_cache",
    "unpack_mxfp4_kv_cache",
    "unpack_mxfp4_q",
    "unpack_nvfp4_msa_pages",
    "unswizzle_128x4",
    "unswizzle_msa_v_scales",
    "write_fp8_kv_cache",
    "write_mxfp4_kv_cache",
]
