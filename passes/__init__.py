"""Graph passes: FX/ExportedProgram passes, ONNX passes, and lowering passes (ONNX export).

Importing this package registers every bundled pass (``core/pass_api.py``), in the order
``infopt recipes --passes`` lists them. A new pass is its module plus one line here.
"""

from __future__ import annotations

from infopt.core.pass_api import register
from infopt.passes.decoder import (
    capture_kv_decoder,
    fuse_decoder,
    half_scales,
    quantize_embedding,
    quantize_int4_head,
    quantize_int8_weights,
    write_genai_folder,
)
from infopt.passes.fx import (
    capture,
    cast_precision,
    fold_batchnorm,
    int4_kernels,
    quantize_int4,
    quantize_linear_8bit,
    remove_noops,
)
from infopt.passes.lower import aoti_compile, onnx_export, tensorrt_build
from infopt.passes.onnx import (
    attention_mask_fill,
    fuse_matmuls,
    ort_optimize,
    quantize_fp8,
    quantize_int4_graph,
    quantize_int8,
    smoothquant,
    transformer_fusion,
)

BUNDLED = (capture, remove_noops, fold_batchnorm, cast_precision, quantize_int4, int4_kernels, onnx_export,
           aoti_compile, tensorrt_build, ort_optimize, transformer_fusion, attention_mask_fill, quantize_int4_graph,
           smoothquant, fuse_matmuls, quantize_int8, quantize_fp8, capture_kv_decoder, fuse_decoder, quantize_int4_head,
           quantize_int8_weights, quantize_embedding, half_scales, write_genai_folder,
           quantize_linear_8bit)

for _module in BUNDLED:
    register(_module.PASS)
