"""Build a TensorRT engine (``model.plan``) from the ONNX model, or leave the build to the server.

Where TensorRT imports and a CUDA GPU is present, the ONNX file is parsed with ``trt.OnnxParser``,
one optimization profile is made from the InputSpec (each symbol's min/opt/max) and the engine is
built with the precision flags below. INT8 is explicit quantization: the scales come from the QDQ
nodes already in the model, so no calibrator runs here. Autotuning results persist in a timing
cache under ``$INFOPT_CACHE_DIR/tensorrt``, so a rebuild on the same GPU is much faster.

Where TensorRT or the GPU is missing, ``when_missing="server"`` keeps the ONNX model and the
server builds the engine at load time: Triton's ONNX Runtime backend with its TensorRT execution
accelerator. That accelerator's ``precision_mode`` takes ``FP32``, ``FP16`` or ``INT8`` (the
onnxruntime_backend README). ``INT8`` turns on ``trt_int8_enable``; for a QDQ model no
``int8_calibration_table_name`` may be given (the README: a calibration table with a Q/DQ model
makes session creation fail), and the TensorRT EP then takes the scales from the Q/DQ nodes.
One mode is allowed, so float layers outside the QDQ pairs stay FP32 on the server, where the
local build runs them in FP16. FP8 and BF16 have no documented accelerator mode, so those engines
must be built here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.cache import cache_dir
from infopt.core.errors import BuildError, EnvironmentProblem
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.runtime.backends.tensorrt import INSTALL_FIX, make_logger, tensorrt_unavailable

SERVER_PRECISION_MODES = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8"}
"""What Triton's ONNX Runtime backend's TensorRT accelerator accepts as ``precision_mode``."""

__all__ = ["PASS", "TensorRTOptions", "build_engine", "engine_artifact", "server_precision_mode",
           "tensorrt_unavailable"]


class TensorRTOptions(PassOptions):
    precision: Literal["fp32", "fp16", "bf16", "fp8", "int8"] = Field(
        "fp32", description="builder precision flags; int8 uses the model's QDQ nodes (explicit quantization)")
    workspace_gb: float = Field(4.0, gt=0, description="GPU memory TensorRT may use for layer tactics while building, GiB")
    optimization_level: int = Field(3, ge=0, le=5, description="builder optimization level: 0 fastest build, 5 most tuning")
    timing_cache: bool = Field(True, description="load and save TensorRT's timing cache in infopt's cache folder")
    when_missing: Literal["server", "error"] = Field(
        "server", description="without TensorRT or a GPU: leave the build to the server (server) or fail (error)")


def server_precision_mode(precision: str) -> str:
    """The ``precision_mode`` for Triton's ORT TensorRT accelerator; fp8/bf16 have none."""
    if precision not in SERVER_PRECISION_MODES:
        raise EnvironmentProblem(
            f"{precision} TensorRT engines must be built where TensorRT and a GPU are present: the server's "
            f"ONNX Runtime TensorRT accelerator has no {precision} mode",
            fix="run the build on a machine with an NVIDIA GPU and `pip install tensorrt`, or use --fp16",
        )
    return SERVER_PRECISION_MODES[precision]


def timing_cache_path(target_arch: str) -> Path:
    """``<cache>/tensorrt/timing-<gpu name or target arch>.cache``: tactics are timed per GPU model."""
    import torch

    label = torch.cuda.get_device_name() if torch.cuda.is_available() else target_arch
    return cache_dir("tensorrt") / f"timing-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label).strip('-')}.cache"


def engine_artifact(onnx_artifact: Artifact, plan_path: Path) -> Artifact:
    """The ``tensorrt`` artifact for an engine built from ``onnx_artifact``: ``path`` is the plan and
    ``obj`` the ONNX file it was built from, whose outputs the engine keeps (the manifest reads
    the model's outputs from it)."""
    return onnx_artifact.derive("tensorrt", path=plan_path, obj=onnx_artifact.path)


def _parse(trt, network, logger, path: Path) -> None:
    parser = trt.OnnxParser(network, logger)
    if parser.parse_from_file(str(path)):
        return
    problems = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        node = err.node_name() or f"#{err.node()}"
        problems.append(f"node {node} ({err.node_operator() or '?'}): {err.desc()}")
    raise BuildError(
        "TensorRT cannot parse the ONNX model: " + "; ".join(problems or ["no error reported"]),
        where=str(path),
        fix="replace or remove the named ops before export, or build with --backend onnxruntime",
    )


def _profile(builder, network, spec, path: Path):
    """One optimization profile: every network input's min/opt/max shape from the InputSpec."""
    by_name = {t.name: t for t in spec.inputs}
    profile = builder.create_optimization_profile()
    shapes: dict[str, dict[str, list[int]]] = {}
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        if name not in by_name:
            raise BuildError(f"the ONNX model's input {name} is not in the input spec ({spec})", where=str(path),
                             fix=f"describe every input with --input, including {name}")
        picks = {k: list(spec.concrete_shape(by_name[name], k)) for k in ("min", "opt", "max")}
        profile.set_shape(name, picks["min"], picks["opt"], picks["max"])
        shapes[name] = picks
    return profile, shapes


def _set_precision(trt, config, precision: str) -> None:
    flags = {"fp32": (), "fp16": ("FP16",), "bf16": ("BF16",), "fp8": ("FP8", "FP16"), "int8": ("INT8", "FP16")}
    for flag in flags[precision]:
        config.set_flag(getattr(trt.BuilderFlag, flag))


def build_engine(artifact: Artifact, options: TensorRTOptions, context: PassContext) -> PassOutcome:
    """Parse, profile, build and save ``<workdir>/model.plan``; needs TensorRT and a GPU."""
    import tensorrt as trt

    logger = make_logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    context.say(f"TensorRT {trt.__version__}: parsing {artifact.path.name}")
    _parse(trt, network, logger, artifact.path)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace_gb * (1 << 30)))
    config.builder_optimization_level = options.optimization_level
    _set_precision(trt, config, options.precision)
    profile, shapes = _profile(builder, network, artifact.spec, artifact.path)
    config.add_optimization_profile(profile)
    cache_file, reused = None, False
    if options.timing_cache:
        cache_file = timing_cache_path(context.target.arch)
        reused = cache_file.is_file() and cache_file.stat().st_size > 0
        cache = config.create_timing_cache(cache_file.read_bytes() if reused else b"")
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            reused = False  # made on another GPU or TensorRT version: start afresh and overwrite it
            config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    context.say(f"TensorRT: building the {options.precision} engine (level {options.optimization_level}); this takes a while")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        said = ": " + "; ".join(logger.errors[-3:]) if logger.errors else ""
        raise BuildError(f"TensorRT could not build a {options.precision} engine for {artifact.path.name}{said}",
                         where=str(artifact.path),
                         fix="try a larger workspace_gb, another precision, or --backend onnxruntime; --verbose shows TensorRT's log")
    if cache_file is not None:
        cache_file.write_bytes(bytes(memoryview(config.get_timing_cache().serialize())))
    plan_path = context.workdir / "model.plan"
    plan_path.write_bytes(bytes(memoryview(plan)))
    context.say(f"TensorRT: engine saved, {plan_path.stat().st_size / 1e6:.1f} MB")
    details = TensorRTDetails(engine="built", precision=options.precision, tensorrt_version=trt.__version__,
                              profile=shapes, timing_cache=str(cache_file) if cache_file else None,
                              timing_cache_reused=reused, workspace_gb=options.workspace_gb,
                              optimization_level=options.optimization_level)
    notes = [f"TensorRT {trt.__version__} {options.precision} engine, one profile: "
             + "; ".join(f"{n} {s['min']}..{s['max']}" for n, s in shapes.items())]
    return PassOutcome(engine_artifact(artifact, plan_path), True, notes, details)


class TensorRTDetails(PassDetails):
    """What ``tensorrt_build`` records: the engine built here, or left to the server and why."""

    engine: Literal["built", "server"]
    precision: str
    workspace_gb: float
    precision_mode: str | None = None
    """server: the Triton TensorRT accelerator's precision_mode (FP32, FP16, INT8)"""
    reason: str | None = None
    """server: why no engine was built here"""
    tensorrt_version: str | None = None
    profile: dict[str, Any] = Field(default_factory=dict)
    timing_cache: str | None = None
    timing_cache_reused: bool | None = None
    optimization_level: int | None = None

    def notes(self) -> list[str]:
        return engine_notes(self)

    def server_engine(self) -> dict | None:
        return server_request(self)


def run(artifact: Artifact, options: TensorRTOptions, context: PassContext) -> PassOutcome:
    reason = tensorrt_unavailable()
    if reason is None:
        return build_engine(artifact, options, context)
    if options.when_missing == "error":
        raise EnvironmentProblem(f"cannot build a TensorRT engine: {reason}", fix=INSTALL_FIX)
    mode = server_precision_mode(options.precision)
    note = (f"TensorRT engine not built here ({reason}): the server builds it at load time "
            f"(Triton's ONNX Runtime backend, TensorRT execution accelerator, precision {mode})")
    details = TensorRTDetails(engine="server", precision=options.precision, precision_mode=mode, reason=reason,
                              workspace_gb=options.workspace_gb)
    return PassOutcome(artifact, False, [note], details)


def engine_notes(details: TensorRTDetails) -> list[str]:
    """What the build says when the engine is left to the server (``TensorRTDetails.notes``)."""
    if details.engine != "server":
        return []
    return [f"the TensorRT engine is built on the server at load time ({details.reason} here): Triton's ONNX Runtime "
            f"backend with the TensorRT execution accelerator, precision {details.precision_mode}; what was validated "
            "here is the ONNX model it is built from"]


def server_request(details: TensorRTDetails) -> dict | None:
    """The Triton config's request for the engine left to the server (``TensorRTDetails.server_engine``): precision mode and
    workspace; None when the engine was built here."""
    if details.engine != "server":
        return None
    return {"precision_mode": details.precision_mode, "workspace_bytes": int(details.workspace_gb * 2**30)}


PASS = Pass(
    name="tensorrt_build",
    consumes="onnx",
    produces="tensorrt",
    run=run,
    options=TensorRTOptions,
    details=TensorRTDetails,
    description="build a TensorRT engine (model.plan) from the ONNX model, or leave it to the server's TensorRT accelerator",
)
