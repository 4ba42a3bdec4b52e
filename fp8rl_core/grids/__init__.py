"""Quantization grids: which bytes a tensor becomes on each FP8 grid the experiments compare.

>>> from fp8rl_core.grids import quantize, parse_grid
>>> qt = quantize(x, "mxfp8-e4m3-rceil", axis=-1)   # rowwise 1x32 blocks; axis=0 is columnwise
>>> qt.data, qt.scale, qt.grid, qt.dequantize(torch.bfloat16)

One module per grid family, each documenting its rule and where it is specified: :mod:`.mx`
(OCP MX / Transformer Engine), :mod:`.block` (DeepGEMM / vLLM 128-blocks), :mod:`.tensor` (TE current
scaling), :mod:`.kvcache` (vLLM / SGLang FP8 KV cache), :mod:`.swizzle` (cuBLAS 128x4 scale layout),
:mod:`.formats` (E4M3/E5M2 and the BF16 view).
"""

from .api import QuantizedTensor, quantize
from .formats import E4M3, E5M2, FORMATS, FP8Format, bf16_view, saturating_cast
from .spec import VALID_GRID_FORMS, Grid, GridSpecError, parse_grid
from .swizzle import swizzle_mx_scales, swizzled_size, unswizzle_mx_scales

__all__ = [
    "E4M3",
    "E5M2",
    "FORMATS",
    "FP8Format",
    "Grid",
    "GridSpecError",
    "QuantizedTensor",
    "VALID_GRID_FORMS",
    "bf16_view",
    "parse_grid",
    "quantize",
    "saturating_cast",
    "swizzle_mx_scales",
    "swizzled_size",
    "unswizzle_mx_scales",
]
