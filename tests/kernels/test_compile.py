"""The kernels compile for a GPU on a machine without one: Triton lowers them for sm_90 (H100/H200)
and sm_80 (A100) ahead of time, in a fresh process without the interpreter, so a kernel that only
the interpreter accepts fails here. The PTX shows what the W4A16 kernel was designed for: its weight
bytes arrive in 16-byte copies, the 4-bit codes become fp16/bf16 through integer ops and packed
subtractions (no integer-to-float conversion per code), the 64-row tiles use Hopper's warpgroup MMA
(wgmma) on sm_90 and mma.sync on sm_80, and a 32-row decoding tile mma.sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from infopt.kernels import norms
from infopt.kernels import w4a16

def build(fn, signature, constants, arch, num_warps, num_stages, aligned=()):
    sig = dict(signature, **{name: "constexpr" for name in constants})
    at = {(list(sig).index(name),): value for name, value in constants.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = ASTSource(fn=fn, signature=sig, constexprs=at, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages))

def w4a16_ptx(arch, small, index, act, perm):
    config = dict(w4a16.kernel_configs(small)[index])
    warps, stages = config.pop("num_warps"), config.pop("num_stages")
    sig = {"x_ptr": "*" + act, "qw_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8",
           "perm_ptr": "*i32" if perm else "*u8", "bias_ptr": "*fp32", "out_ptr": "*" + act,
           "M": "i32", "N": "i32", "K": "i32", "stride_qn": "i32", "stride_xm": "i32", "M_BUCKET": "i32"}
    # what Triton's launcher specializes for Llama-sized layers: 16-aligned pointers, sizes and strides
    aligned = [i for i, name in enumerate(sig) if name.endswith("_ptr") or name in ("N", "K", "stride_qn", "stride_xm")]
    consts = dict(GROUP=128, HALF=64, HAS_PERM=perm, HAS_BIAS=True, DOT_FP32=False, **config)
    return build(w4a16._w4a16_kernel, sig, consts, arch, warps, stages, aligned).asm["ptx"]

found = {}
for arch in (90, 80):
    found[f"decode-fp16-sm{arch}"] = w4a16_ptx(arch, True, 0, "fp16", False)
    # act-order: the 32-row decoding tile (the 64- and 128-row ones gather x too, and load the weight plainly)
    found[f"decode-bf16-act-order-sm{arch}"] = w4a16_ptx(arch, True, 7, "bf16", True)
    found[f"gemm-fp16-sm{arch}"] = w4a16_ptx(arch, False, 4, "fp16", False)
rows = {"x_ptr": "*bf16", "w_ptr": "*fp32", "y_ptr": "*bf16", "H": "i32", "stride_x": "i64", "stride_y": "i64", "eps": "fp32"}
config = dict(norms.norm_config(11008, interpret=False))
warps = config.pop("num_warps")
found["rms_norm-chunked"] = build(norms._rms_norm_kernel, rows, dict(HAS_WEIGHT=True, **config), 90, warps, 1).asm["ptx"]
rows = dict(list(rows.items())[:2] + [("b_ptr", "*bf16")] + list(rows.items())[2:])
config = dict(norms.norm_config(4096, interpret=False))
warps = config.pop("num_warps")
found["layer_norm-one-block"] = build(norms._layer_norm_kernel, rows, dict(HAS_WEIGHT=True, HAS_BIAS=True, **config),
                                      90, warps, 1).asm["ptx"]

def features(ptx):
    return {"wgmma": "wgmma.mma_async" in ptx, "mma": "mma.sync" in ptx, "lines": ptx.count("\n"),
            "copies16": len(re.findall(r"cp\.async\.[a-z.]+ \[[^]]*\], \[[^]]*\], (?:0x10|16)", ptx))
            + ptx.count("ld.global.v4"),
            "packed_sub": ptx.count("sub.f16x2") + ptx.count("sub.bf16x2") + ptx.count("fma.rn.bf16x2"),
            "int_to_float": len(re.findall(r"cvt\.rn\.(?:f16|bf16|f32)\.[us](?:8|16|32)", ptx))}

json.dump({name: features(ptx) for name, ptx in found.items()}, sys.stdout)
"""


def test_kernels_compile_for_hopper_and_ampere():
    pytest.importorskip("triton", reason="compiling the kernels needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    w4a16 = [name for name in found if not name.startswith(("rms", "layer"))]
    assert len(w4a16) == 6 and {"rms_norm-chunked", "layer_norm-one-block"} <= set(found)
    assert found["gemm-fp16-sm90"]["wgmma"] and not found["gemm-fp16-sm80"]["wgmma"]
    for name in w4a16:
        entry = found[name]
        assert entry["mma"] or entry["wgmma"], name
        assert entry["copies16"] >= 1, f"{name}: the weight is not read in 16-byte pieces"
        # a few conversions are the per-row zero points; per code there would be 32 or more per thread
        assert entry["int_to_float"] <= 8, f"{name}: codes converted to float one by one ({entry['int_to_float']})"
    assert found["decode-fp16-sm90"]["wgmma"] and not found["decode-fp16-sm80"]["wgmma"]
    assert found["decode-bf16-act-order-sm90"]["mma"] and not found["decode-bf16-act-order-sm90"]["wgmma"]
    assert found["decode-fp16-sm90"]["packed_sub"] >= 8
    assert found["decode-bf16-act-order-sm90"]["packed_sub"] >= 8
    assert all(entry["lines"] > 50 for entry in found.values())
