"""AOTInductor: compile the ExportedProgram ahead of time into a ``.pt2`` package.

``torch._inductor.aoti_compile_and_package`` generates C++ (CPU) or Triton (CUDA) kernels for the
whole graph, compiles them into a shared library and packs it with the weights into one file that
``torch._inductor.aoti_load_package`` runs without Python tracing or recompiles. The graph's
symbolic dims stay dynamic, so the package accepts the InputSpec's whole range.

Inductor's own cache (generated code, compiled kernels) is kept in infopt's cache folder
(``$INFOPT_CACHE_DIR/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` is already set, so a rebuild
reuses it and nothing is scattered in ``/tmp``. The package itself is kept there too
(``aoti-package/``), under the hash of everything it depends on (:func:`package_key`: the program,
the Inductor settings, the device, this machine's CPU or GPU and C++ compiler, torch), so a rebuild of
the same program copies it instead of compiling again; ``cache: false`` turns that off.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.cache import cache_dir, content_key, store, stored
from infopt.core.errors import EnvironmentProblem, RecipeError
from infopt.core.logs import quiet_third_party
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.exporters.program_key import key_or_none, program_parts, source_of
from infopt.passes.fx import cast_precision
from infopt.quantize.int4_format import decompose_int4
from infopt.runtime.cpp_compiler import package_compiler


class InductorOptions(PassOptions):
    freezing: bool = Field(True, description="treat weights as constants: fold them and prepack for the kernels")
    max_autotune: bool = Field(False, description="benchmark kernel and GEMM-template choices at compile time (slower build)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the package runs; auto: the target's device")
    cache: bool = Field(True, description="reuse an identical package from infopt's cache folder (keyed by the program, "
                                          "the Inductor settings, the device, this machine's CPU/GPU and compiler, torch)")


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
    compiler = package_compiler()
    if compiler.path is None:
        raise EnvironmentProblem(f"no C++ compiler here builds an AOTInductor package a torch process can load: "
                                 f"{compiler.problem()}",
                                 fix="install the system g++ (apt install g++) or set CXX to a compiler that links "
                                     "libstdc++ dynamically; or use --backend onnxruntime")
    portable_rnn = device == "cpu" and lstm_lacks_onednn_kernel(program)
    key = key_or_none(lambda: package_key(program, configs, device, compiler.path)) if options.cache else None
    hit = stored(STORE, key) if key else None
    with inductor_cache() as cache:
        if hit is not None:
            shutil.copyfile(hit[0] / path.name, path)
        else:
            context.say(f"AOTInductor compiling for {device} (generated kernels, then the C++ build)")
            with quiet_third_party(), torch.backends.mkldnn.flags(enabled=not portable_rnn):
                torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                         inductor_configs={**configs, "cpp.cxx": (None, compiler.path)})
            if key:
                store(STORE, key, {path.name: path}, {})
    details = AotiDetails(device=device, inductor_configs=configs, cache=cache, torch=torch.__version__,
                          cached=True if hit is not None else None, compiler=compiler.path)
    notes = [f"AOTInductor package for {device} ({', '.join(k for k, v in configs.items() if v) or 'defaults'})"]
    if compiler.note():
        notes.append(compiler.note())
    if portable_rnn:
        notes.append("LSTM layers as matmuls unrolled over their steps: oneDNN has no bf16 LSTM on this CPU")
    if int4_layers:
        notes.append(f"{int4_layers} INT4 layers as dequantize + matmul in generated code")
        details.int4_layers = int4_layers
    return PassOutcome(artifact.derive("aoti", path=path, obj=artifact.obj), True, notes, details)



STORE = "aoti-package"


def lstm_lacks_onednn_kernel(program) -> bool:
    """Whether the program holds a bf16 LSTM and this CPU has no oneDNN bf16 kernels (no AVX512-BF16 or AMX).

    Inductor lowers an LSTM to oneDNN's wherever oneDNN is on, without asking whether oneDNN can run it in the
    LSTM's dtype; on such a CPU the package then fails at its first run ("could not create a primitive
    descriptor for the LSTM forward propagation primitive"). Compiled with oneDNN off, the LSTM becomes plain
    matmuls over its (fixed) steps, which run anywhere."""
    import torch

    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    lstm = (torch.ops.aten.lstm.input, torch.ops.aten.lstm.data)
    for node in program.graph.nodes:
        if node.target in lstm:
            value = node.meta.get("val")
            first = value[0] if isinstance(value, (tuple, list)) else value
            if getattr(first, "dtype", None) == torch.bfloat16:
                return True
    return False


def package_key(program, configs: dict[str, Any], device: str, compiler: str) -> str:
    """What the package depends on, hashed: the program (``exporters/program_key.py``), the Inductor
    settings, the device, the machine it is compiled for (the CPU's model and instruction sets, as
    the C++ build targets them, or the GPU), the C++ compiler, torch, and this module's code."""
    import torch

    return content_key(*program_parts(program), repr(sorted(configs.items())), device, _compiled_for(device, compiler),
                       source_of(sys.modules[__name__], sys.modules[decompose_int4.__module__]), f"torch {torch.__version__}")


def _compiled_for(device: str, compiler: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name()} {torch.cuda.get_device_capability()} cuda {torch.version.cuda}"
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = "".join(sorted({line for line in f if line.startswith(("model name", "flags"))}))
    except OSError:
        cpu = platform.processor()
    stat = os.stat(compiler) if os.path.exists(compiler) else None
    return f"{platform.machine()} {cpu} {compiler} {stat.st_size if stat else ''} {stat.st_mtime if stat else ''}"


class AotiDetails(PassDetails):
    """What ``aoti_compile`` records: where the package runs and how Inductor was set up to build it."""

    device: str
    inductor_configs: dict[str, Any]
    cache: str
    """the Inductor cache folder it compiled with"""
    torch: str
    int4_layers: int | None = None
    """INT4 layers compiled as dequantize + matmul"""
    cached: bool | None = None
    """True when the package is an earlier build's of the same program, from the cache (volatile)"""
    compiler: str | None = None
    """the C++ compiler it was built with (``runtime/cpp_compiler.py``)"""


PASS = Pass(
    name="aoti_compile",
    consumes="exported",
    produces="aoti",
    run=run,
    details=AotiDetails,
    options=InductorOptions,
    description="AOTInductor: compile the ExportedProgram into a .pt2 package (CPU or CUDA)",
)


def in_process_settings(recipe) -> tuple[InductorOptions, str | None]:
    """What ``infopt.compile`` applies in process from an Inductor recipe: the options of its compile step, and the
    precision its cast step casts to (None without one)."""
    step = next((s for s in recipe.passes if s.name == PASS.name), None)
    if step is None:
        raise RecipeError(f"recipe {recipe.name} has no {PASS.name} step to take Inductor's options from",
                          fix="pass an inductor recipe (infopt recipes lists them)")
    cast = next((s for s in recipe.passes if s.name == cast_precision.PASS.name), None)
    return (PASS.parse_options(step.options),
            cast_precision.PASS.parse_options(cast.options).precision if cast is not None else None)
