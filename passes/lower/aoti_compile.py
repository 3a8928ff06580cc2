"""AOTInductor: compile the ExportedProgram ahead of time into a ``.pt2`` package.

``torch._inductor.aoti_compile_and_package`` generates C++ (CPU) or Triton (CUDA) kernels for the
whole graph, compiles them into a shared library and packs it with the weights into one file that
``torch._inductor.aoti_load_package`` runs without Python tracing or recompiles. The graph's
symbolic dims stay dynamic, so the package accepts the InputSpec's whole range.

Inductor's own cache (generated code, compiled kernels) is kept in infopt's cache folder
(``$INFOPT_CACHE_DIR/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` is already set, so a rebuild
reuses it and nothing is scattered in ``/tmp``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.cache import cache_dir
from infopt.core.errors import EnvironmentProblem
from infopt.core.logs import quiet_third_party
from infopt.core.registry import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.quantize.int4_format import decompose_int4


class InductorOptions(PassOptions):
    freezing: bool = Field(True, description="treat weights as constants: fold them and prepack for the kernels")
    max_autotune: bool = Field(False, description="benchmark kernel and GEMM-template choices at compile time (slower build)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the package runs; auto: the target's device")


def inductor_configs(options: InductorOptions) -> dict[str, Any]:
    """The Inductor settings a recipe's options stand for (also used by ``infopt.compile``)."""
    return {"freezing": options.freezing, "max_autotune": options.max_autotune}


def user_cache_dir() -> str | None:
    """``TORCHINDUCTOR_CACHE_DIR`` when the user chose it; None when unset or Inductor's own default
    (Inductor writes its default into the environment the first time it compiles)."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


@contextmanager
def inductor_cache() -> Iterator[str]:
    """Point Inductor (and Triton, which nests under it) at infopt's cache folder for the block."""
    chosen = user_cache_dir()
    if chosen:
        yield chosen
        return
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    folder = str(cache_dir("inductor"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def resolve_device(option: str, target_device: str) -> str:
    device = target_device if option == "auto" else option
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EnvironmentProblem("an Inductor CUDA package can only be compiled on a machine with a CUDA GPU",
                                     fix="build on the GPU machine, or use --backend onnxruntime/tensorrt for a GPU target here")
    return device


def run(artifact: Artifact, options: InductorOptions, context: PassContext) -> PassOutcome:
    import torch

    program = artifact.obj
    device = resolve_device(options.device, context.target.device)
    if device == "cuda":
        from torch.export.passes import move_to_device_pass

        # with its index: the graph's device arguments (``_assert_tensor_metadata`` among them) must
        # name the device the tensors report, cuda:0, or Inductor's fake run rejects the graph
        program = move_to_device_pass(program, torch.device("cuda", torch.cuda.current_device()))

    program, int4_layers = decompose_int4(program)
    path = context.workdir / "model.pt2"
    configs = inductor_configs(options)
    context.say(f"AOTInductor compiling for {device} (generated kernels, then the C++ build)")
    with inductor_cache() as cache, quiet_third_party():
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=dict(configs))
    details = AotiDetails(device=device, inductor_configs=configs, cache=cache, torch=torch.__version__)
    notes = [f"AOTInductor package for {device} ({', '.join(k for k, v in configs.items() if v) or 'defaults'})"]
    if int4_layers:
        notes.append(f"{int4_layers} INT4 layers as dequantize + matmul in generated code")
        details.int4_layers = int4_layers
    return PassOutcome(artifact.derive("aoti", path=path, obj=artifact.obj), True, notes, details)



class AotiDetails(PassDetails):
    """What ``aoti_compile`` records: where the package runs and how Inductor was set up to build it."""

    device: str
    inductor_configs: dict[str, Any]
    cache: str
    """the Inductor cache folder it compiled with"""
    torch: str
    int4_layers: int | None = None
    """INT4 layers compiled as dequantize + matmul"""


PASS = Pass(
    name="aoti_compile",
    consumes="exported",
    produces="aoti",
    run=run,
    details=AotiDetails,
    options=InductorOptions,
    description="AOTInductor: compile the ExportedProgram into a .pt2 package (CPU or CUDA)",
)
