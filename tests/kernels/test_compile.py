"""The kernels compile for a GPU on a machine without one: Triton lowers them for sm_90 (H100/H200)
and sm_80 (A100) ahead of time, in a fresh process without the interpreter, so a kernel that only
the interpreter accepts fails here. The large-M GEMM must use Hopper's warpgroup tensor-core
instruction (wgmma); the split-K tiles of 16 rows use mma.sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from infopt.kernels import norms, w4a16

def build(fn, signature, constants, arch, num_warps, num_stages):
    sig = dict(signature, **{name: "constexpr" for name in constants})
    at = {(list(sig).index(name),): value for name, value in constants.items()}
    source = ASTSource(fn=fn, signature=sig, constexprs=at)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages))

def tuned(variant, index):
    config = dict(w4a16.kernel_configs(variant, interpret=False)[index])
    return config, config.pop("num_warps"), config.pop("num_stages")

def weights(act, gidx):
    return {"x_ptr": "*" + act, "qw_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8",
            "gidx_ptr": "*i32" if gidx else "*u8", "bias_ptr": "*fp32", "out_ptr": "*" + act}

found = {}
for arch in (90, 80):
    tiles, warps, stages = tuned("gemm", 2)
    sig = dict(weights("bf16", True), M="i32", N="i32", K="i32", M_BUCKET="i32")
    consts = dict(GROUP_SIZE=32, HAS_GIDX=True, HAS_BIAS=True, DOT_FP32=False, **tiles)
    found[f"gemm-sm{arch}"] = build(w4a16._w4a16_gemm_kernel, sig, consts, arch, warps, stages).asm["ptx"]
    tiles, warps, stages = tuned("splitk", 1)
    sig = dict(weights("fp16", False), part_ptr="*fp32", M="i32", N="i32", K="i32", K_PER_SPLIT="i32", M_BUCKET="i32")
    consts = dict(GROUP_SIZE=128, HAS_GIDX=False, HAS_BIAS=False, DOT_FP32=False, PARTIAL=True, **tiles)
    found[f"splitk-sm{arch}"] = build(w4a16._w4a16_splitk_kernel, sig, consts, arch, warps, stages).asm["ptx"]
rows = {"x_ptr": "*bf16", "w_ptr": "*fp32", "y_ptr": "*bf16", "H": "i32", "stride_x": "i64", "stride_y": "i64", "eps": "fp32"}
config = norms.norm_config(11008, interpret=False)
warps = config.pop("num_warps")
found["rms_norm-chunked"] = build(norms._rms_norm_kernel, rows, dict(HAS_WEIGHT=True, **config), 90, warps, 1).asm["ptx"]
rows = dict(list(rows.items())[:2] + [("b_ptr", "*bf16")] + list(rows.items())[2:])
config = norms.norm_config(4096, interpret=False)
warps = config.pop("num_warps")
found["layer_norm-one-block"] = build(norms._layer_norm_kernel, rows, dict(HAS_WEIGHT=True, HAS_BIAS=True, **config),
                                      90, warps, 1).asm["ptx"]
json.dump({name: {"wgmma": "wgmma.mma_async" in ptx, "mma": "mma.sync" in ptx, "lines": ptx.count("\n")}
           for name, ptx in found.items()}, sys.stdout)
"""


def test_kernels_compile_for_hopper_and_ampere():
    pytest.importorskip("triton", reason="compiling the kernels needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert set(found) == {"gemm-sm90", "splitk-sm90", "gemm-sm80", "splitk-sm80", "rms_norm-chunked",
                          "layer_norm-one-block"}
    assert found["gemm-sm90"]["wgmma"] and not found["gemm-sm80"]["wgmma"]
    assert found["gemm-sm80"]["mma"] and found["splitk-sm80"]["mma"]
    assert found["splitk-sm90"]["mma"], "16-row tiles are below wgmma's 64; they must still use mma"
    assert all(entry["lines"] > 50 for entry in found.values())
