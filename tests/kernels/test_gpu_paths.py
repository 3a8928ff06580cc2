"""The kernels as a model calls them on a GPU: launched directly from eager code, through the op,
under torch.compile, and compiled into an AOTInductor package that runs without infopt. Skipped
without a CUDA GPU (the CPU suite runs the kernels in Triton's interpreter instead)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from infopt.kernels import w4a16
from infopt.kernels.norms import layer_norm, layer_norm_torch, rms_norm, rms_norm_torch
from infopt.kernels.w4a16 import W4A16Linear, use_w4a16_kernels, w4a16_linear, w4a16_linear_torch
from infopt.quantize.int4_config import GPTQConfig, RTNConfig
from infopt.quantize.weight_only import quantize_int4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOLERANCE = {torch.float16: dict(atol=2e-2, rtol=2e-2), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


def mlp(width: int = 256, layers: int = 3, act_order: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).eval()
    if act_order:
        batches = [(torch.randn(64, width),) for _ in range(2)]
        quantize_int4(model, GPTQConfig(group_size=64, act_order=True), batches)
    else:
        quantize_int4(model, RTNConfig(group_size=64), None)
    assert not use_w4a16_kernels(model)
    return model


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("M", [1, 5, 16, 64, 300])
def test_direct_launch_op_and_reference_agree(dtype, M):
    layer = mlp(act_order=M == 5)[0].cuda()
    assert isinstance(layer, W4A16Linear)
    x = torch.randn(M, 256, device="cuda", dtype=dtype)
    args = (layer.qweight, layer.scales, layer.zeros, layer.perm, layer.bias, layer.group_size)
    with torch.inference_mode():
        first = w4a16_linear(x, *args)  # through Triton's launcher and the autotuner
        direct = w4a16_linear(x, *args)  # the remembered compiled kernel (gpu_kernels/launcher.py)
        through_op = w4a16.registered()(x, *args)
    reference = w4a16_linear_torch(x.cpu(), *[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    # split-K tiles add their parts atomically, in no fixed order: the paths agree to rounding, not bit for bit
    for out in (first, direct, through_op):
        torch.testing.assert_close(out.cpu().float(), reference.float(), **TOLERANCE[dtype])
    torch.testing.assert_close(direct.float(), through_op.float(), **TOLERANCE[dtype])


def test_torch_compile_sees_the_kernel_and_matches_eager():
    model = mlp().half().cuda()
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, **TOLERANCE[torch.float16])


def aoti_crash_here(tmp_path) -> str:
    """Why no AOTInductor package can load on this machine (a bare ``x * 2 + 1`` one crashes the
    process that opens it), or "" when one loads."""
    class Pointwise(nn.Module):
        def forward(self, x):
            return x * 2 + 1

    x = torch.randn(4, 16, device="cuda")
    program = torch.export.export(Pointwise(), (x,))
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "pointwise.pt2"))
    script = f"import torch; torch._inductor.aoti_load_package({path!r})(torch.ones(4, 16, device='cuda'))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return ""
    return (f"a bare AOTInductor package (x * 2 + 1, no infopt) ends the process that loads it with exit "
            f"{done.returncode} on this machine (torch {torch.__version__}): benchmarks/results/gpu_builds.md")


def test_aoti_package_embeds_the_kernel_and_runs_without_infopt(tmp_path):
    """A triton_op is compiled into the package: it loads and runs in a process that never imports infopt."""
    if reason := aoti_crash_here(tmp_path):
        pytest.skip(reason)
    model = mlp().half().cuda()
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    assert any(n.target == w4a16.registered().default for n in program.graph.nodes)
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "mlp.pt2"))
    torch.save(x.cpu(), tmp_path / "x.pt")
    with torch.inference_mode():
        torch.save(model(x).cpu(), tmp_path / "eager.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        package = torch._inductor.aoti_load_package({str(path)!r})
        x = torch.load({str(tmp_path / 'x.pt')!r}).cuda()
        with torch.inference_mode():
            y = package(x)
        y = y[0] if isinstance(y, (list, tuple)) else y
        eager = torch.load({str(tmp_path / 'eager.pt')!r})
        assert not any(name.startswith("infopt") for name in sys.modules), "infopt was imported"
        torch.testing.assert_close(y.cpu().float(), eager.float(), atol=2e-2, rtol=2e-2)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("rows", [1, 256])
def test_norm_paths_agree(rows):
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    with torch.inference_mode():
        torch.testing.assert_close(rms_norm(x, w), torch.ops.infopt.rms_norm(x, w, 1e-6), atol=0, rtol=0)
        torch.testing.assert_close(layer_norm(x, w, b), torch.ops.infopt.layer_norm(x, w, b, 1e-5), atol=0, rtol=0)
        torch.testing.assert_close(rms_norm(x, w).float(), rms_norm_torch(x, w).float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(layer_norm(x, w, b).float(), layer_norm_torch(x, w, b).float(), atol=2e-2, rtol=2e-2)
        compiled = torch.compile(lambda t: rms_norm(t, w), fullgraph=True)(x)
    # Inductor compiles the same kernel with its own options: at most one bf16 rounding step apart
    torch.testing.assert_close(compiled, rms_norm(x, w), atol=0, rtol=2**-7)
