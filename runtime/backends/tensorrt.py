"""Run a serialized TensorRT engine (``.plan``) behind the Runner call signature.

The engine is deserialized with ``trt.Runtime`` and run with TensorRT 10's name-based I/O:
``set_input_shape`` and ``set_tensor_address`` per tensor, then ``execute_async_v3`` on torch's
current CUDA stream. Buffers are torch CUDA tensors, so no separate CUDA binding is needed.
A ``.plan`` is tied to the GPU architecture and TensorRT version that built it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from infopt.core.errors import BuildError, EnvironmentProblem, UsageError
from infopt.runtime.backend import Backend, check, package_version, register
from infopt.runtime.runner import Runner

INSTALL_FIX = "pip install tensorrt on a machine with an NVIDIA GPU, or drop --backend tensorrt"


def tensorrt_unavailable() -> str | None:
    """None when TensorRT imports and a CUDA GPU is present; otherwise why not, in a few words."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "the tensorrt package is not installed"
    except OSError as exc:
        return f"the tensorrt package cannot load its libraries ({exc})"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    return None


def make_logger():
    """A ``trt.ILogger`` that sends TensorRT's messages to the ``infopt.tensorrt`` logger instead of
    stderr and keeps the errors, so a failed build can say what TensorRT said."""
    import tensorrt as trt

    log = logging.getLogger("infopt.tensorrt")
    severity = trt.ILogger.Severity
    levels = {severity.INTERNAL_ERROR: logging.ERROR, severity.ERROR: logging.ERROR, severity.WARNING: logging.WARNING,
              severity.INFO: logging.DEBUG, severity.VERBOSE: logging.DEBUG}

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, level_of_message, msg) -> None:
            level = levels.get(level_of_message, logging.DEBUG)
            if level >= logging.ERROR:
                self.errors.append(str(msg))
            log.log(level, "%s", msg)

    return Logger()


def torch_dtype(trt_dtype):
    """The torch dtype of a ``trt.DataType``."""
    import tensorrt as trt
    import torch

    table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
             trt.DataType.BF16: torch.bfloat16, trt.DataType.INT8: torch.int8, trt.DataType.INT32: torch.int32,
             trt.DataType.INT64: torch.int64, trt.DataType.BOOL: torch.bool, trt.DataType.UINT8: torch.uint8}
    if trt_dtype not in table:
        raise UsageError(f"engine tensors of type {trt_dtype} cannot be fed from numpy",
                         fix="build the engine with float32/float16/int inputs and outputs")
    return table[trt_dtype]


class TensorRTRunner(Runner):
    """A TensorRT engine on the current CUDA device; inputs and outputs are numpy arrays."""

    kind = "tensorrt"
    device = "cuda"

    def __init__(self, path: str | Path):
        reason = tensorrt_unavailable()
        if reason is not None:
            raise EnvironmentProblem(f"cannot run the TensorRT engine: {reason}", where=str(path), fix=INSTALL_FIX)
        import tensorrt as trt

        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"no TensorRT engine at {self.path}", fix="pass the model.plan written by the build")
        self.logger = make_logger()
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            said = f": {self.logger.errors[-1]}" if self.logger.errors else ""
            raise EnvironmentProblem(
                f"TensorRT {trt.__version__} cannot load {self.path.name}{said}",
                where=str(self.path),
                fix="an engine runs only on the GPU architecture and TensorRT version that built it; rebuild it here",
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = tuple(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        self.output_names = tuple(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT)

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise UsageError(f"missing inputs {', '.join(missing)}", fix=f"pass {', '.join(self.input_names)}")
        keep = []
        for name in self.input_names:
            want = torch_dtype(self.engine.get_tensor_dtype(name))
            tensor = torch.from_numpy(np.ascontiguousarray(feed[name])).to("cuda", want).contiguous()
            if not self.context.set_input_shape(name, tuple(tensor.shape)):
                raise UsageError(f"input {name} of shape {tuple(tensor.shape)} is outside the engine's profile",
                                 where=str(self.path), fix="rebuild with a --dim range that covers this shape")
            self.context.set_tensor_address(name, tensor.data_ptr())
            keep.append(tensor)
        outputs = []
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise BuildError(f"output {name} has a data-dependent shape {shape}", where=str(self.path),
                                 fix="the TensorRT runner needs output shapes known from the input shapes")
            out = torch.empty(shape, dtype=torch_dtype(self.engine.get_tensor_dtype(name)), device="cuda")
            self.context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            said = f": {self.logger.errors[-1]}" if self.logger.errors else ""
            raise BuildError(f"TensorRT failed to run the engine{said}", where=str(self.path),
                             fix="run with --verbose for TensorRT's log; rebuild the engine on this GPU if it is stale")
        stream.synchronize()
        return [(t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy() for t in outputs]


def open_runner(path: Path, input_names: Sequence[str], output_names: Sequence[str], threads: int = 0,
                device: str = "cuda") -> Runner:
    """An engine runs on the GPU it was built for; its input and output names are its own."""
    return TensorRTRunner(path)


def unavailable(precision: str, device: str) -> str | None:
    """bf16 and fp8 engines are built only by TensorRT itself (the ONNX Runtime backend's TensorRT
    accelerator has no such precision mode); the other precisions build where ``tensorrt_build`` can."""
    why = tensorrt_unavailable() if precision in ("bf16", "fp8") else None
    if why:
        return (f"{precision} engines are built only where TensorRT runs ({why}); the ONNX Runtime "
                "backend's TensorRT accelerator has no such precision mode")
    return None


def checks() -> list[dict]:
    why = tensorrt_unavailable()
    return [check("TensorRT", why is None, why or package_version("tensorrt") or "installed",
                  "install TensorRT from NVIDIA's index on a CUDA machine")]


BACKEND = register(Backend(
    name="tensorrt", representation="tensorrt", suffix=".plan", runner_kind=TensorRTRunner.kind,
    open_runner=open_runner, unavailable=unavailable, checks=checks, fenced=lambda device: True,
    worker_imports=("tensorrt",),
))
