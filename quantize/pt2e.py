"""PT2E static INT8 for the Inductor backend: capture, calibrate, convert, compile, run.

The flow is torchao's PT2E post-training quantization (torchao 0.18; ``torch.ao.quantization``'s
copy is gone from torch 2.13)::

    torch.export.export(model, args).module()        # ATen graph
    prepare_pt2e(graph, X86InductorQuantizer())       # observers on activations and weights
    graph(*batch) for batch in calibration            # observers record ranges
    convert_pt2e(prepared)                            # quantize/dequantize ops, int8 weights
    torch.compile(converted, backend="inductor")      # freezing: fuse q/dq into oneDNN qconv/qlinear

Activations are uint8 per-tensor affine (histogram observer), weights int8 symmetric per output
channel (or per tensor with ``per_channel=False``). The converted graph still computes in fp32 in
eager mode (``dequantize -> conv -> quantize``); Inductor with ``freezing=True`` pattern-matches
those q/dq pairs into int8 oneDNN kernels with the weights prepacked at compile time.

Reference: https://pytorch.org/tutorials/prototype/pt2e_quant_x86_inductor.html
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from infopt.core.errors import BuildError, CaptureError, EnvironmentProblem, UsageError
from infopt.runtime.backends.inductor import cpp_compiler
from infopt.runtime.runner import Runner

log = logging.getLogger("infopt.quantize")

TORCHAO_FIX = "pip install 'torchao>=0.18' (the PT2E quantizers moved from torch.ao.quantization to torchao)"

Batch = Mapping[str, Any] | Sequence[Any] | Any
"""One calibration batch: a dict of arrays by input name, a tuple of arrays/tensors in input order,
or a single array/tensor for a one-input model."""


def _torchao_pt2e():
    """The torchao PT2E entry points, or an EnvironmentProblem that says how to install them."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as exc:
        raise EnvironmentProblem(f"PT2E INT8 needs torchao, which cannot be imported ({exc})",
                                 fix=TORCHAO_FIX) from exc
    return prepare_pt2e, convert_pt2e, X86InductorQuantizer, get_default_x86_inductor_quantization_config


def x86_inductor_config(per_channel: bool = True):
    """torchao's default X86 Inductor static config; per-tensor symmetric weights when asked.

    torchao 0.18's ``get_default_x86_inductor_quantization_config`` has no ``is_per_channel``
    argument: it always observes weights per output channel. For ``per_channel=False`` the weight
    spec is replaced by an int8 per-tensor symmetric one with a min/max observer (same ``eps``).
    """
    import dataclasses

    import torch

    _, _, _, default_config = _torchao_pt2e()
    config = default_config(is_qat=False, is_dynamic=False)
    if per_channel:
        return config
    from torchao.quantization.pt2e.observer import MinMaxObserver

    weight = dataclasses.replace(config.weight, qscheme=torch.per_tensor_symmetric, ch_axis=None,
                                 observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
    return dataclasses.replace(config, weight=weight)


def capture(program_or_module, example_args: Sequence[Any], dynamic_shapes=None):
    """An ATen-level ``torch.fx.GraphModule`` from an ``nn.Module``, ``ExportedProgram`` or graph."""
    import torch

    if isinstance(program_or_module, torch.export.ExportedProgram):
        return program_or_module.module()
    if isinstance(program_or_module, torch.fx.GraphModule):
        return program_or_module
    if not isinstance(program_or_module, torch.nn.Module):
        raise UsageError(f"cannot quantize a {type(program_or_module).__name__}",
                         fix="pass an nn.Module, a torch.export.ExportedProgram or its .module()")
    module = program_or_module.eval()
    try:
        program = torch.export.export(module, tuple(_tensors(example_args)), dynamic_shapes=dynamic_shapes)
    except Exception as exc:  # export raises many unrelated types; all mean "could not capture"
        raise CaptureError(f"torch.export could not capture {type(module).__name__}: {exc}",
                           where=type(module).__qualname__,
                           fix="make forward traceable (no data-dependent Python control flow), "
                               "or pass a torch.export.ExportedProgram") from exc
    return program.module()


def input_names(graph_module) -> tuple[str, ...]:
    """The graph's user inputs in call order: its placeholders' names."""
    return tuple(n.target for n in graph_module.graph.nodes if n.op == "placeholder")


def _tensors(args: Iterable[Any]) -> list[Any]:
    import torch

    return [a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a)) for a in args]


def _batch_args(batch: Batch, names: Sequence[str]) -> list[Any]:
    """A calibration batch as tensors in the graph's input order."""
    import torch

    if isinstance(batch, Mapping):
        missing = [n for n in names if n not in batch]
        if missing:
            raise UsageError(f"calibration batch lacks inputs {', '.join(missing)}",
                             fix=f"give every batch the keys {', '.join(names)}")
        return _tensors(batch[n] for n in names)
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return _tensors([batch])
    return _tensors(batch)


def quantize_pt2e(program_or_module, example_args: Sequence[Any], calibration_batches: Iterable[Batch], *,
                  per_channel: bool = True, dynamic_shapes=None):
    """Static INT8 (PT2E, X86InductorQuantizer) of a model, calibrated on ``calibration_batches``.

    Returns the converted ``torch.fx.GraphModule``: quantize/dequantize ops around each conv and
    linear, int8 weights as frozen constants, per-channel weight scales as ``_scale_<i>``
    attributes. Compile it with :func:`compile_inductor` to run it as int8 kernels.

    ``dynamic_shapes`` goes to ``torch.export.export`` when a module is captured here; without it
    the graph accepts only the shapes of ``example_args``, so calibration batches must have them.
    """
    import torch

    prepare_pt2e, convert_pt2e, quantizer_cls, _ = _torchao_pt2e()
    graph = capture(program_or_module, example_args, dynamic_shapes)
    names = input_names(graph)
    quantizer = quantizer_cls()
    quantizer.set_global(x86_inductor_config(per_channel))
    try:
        prepared = prepare_pt2e(graph, quantizer)
    except Exception as exc:
        raise BuildError(f"PT2E prepare failed: {exc}", where="torchao prepare_pt2e",
                         fix="check that the graph comes from torch.export in eval mode") from exc
    batches = 0
    with torch.no_grad():
        for batch in calibration_batches:
            prepared(*_batch_args(batch, names))
            batches += 1
    if not batches:
        raise UsageError("PT2E static INT8 needs calibration data and none was given",
                         fix="pass at least one calibration batch (a few hundred representative samples)")
    log.info("PT2E calibrated on %d batches (per_channel=%s)", batches, per_channel)
    return convert_pt2e(prepared)


def _check_cxx() -> None:
    if cpp_compiler() is None:
        raise EnvironmentProblem("Inductor on CPU compiles C++ and no C++ compiler was found",
                                 fix="install g++ (apt-get install g++) or set CXX to a C++ compiler")


class InductorCompiled:
    """A ``torch.compile``d module whose every call runs under the Inductor config it was built with.

    Calls run under ``torch.no_grad()`` (freezing applies only to inference graphs, and a change of
    grad mode would make Dynamo recompile) and under ``torch._inductor.config.patch(freezing=...)``
    so a recompile for new shapes is frozen the same way as the first compile.
    """

    def __init__(self, module, freezing: bool, dynamic: bool = False):
        import torch

        self.module = module
        self.freezing = freezing
        self.compiled = torch.compile(module, backend="inductor", dynamic=dynamic)

    def __call__(self, *args):
        import torch

        with torch._inductor.config.patch(freezing=self.freezing), torch.no_grad():
            return self.compiled(*args)


def compile_inductor(graph_module, example_args: Sequence[Any], *, freezing: bool = True,
                     dynamic: bool = False) -> Callable:
    """``torch.compile(graph_module, backend="inductor")``, compiled now on ``example_args``.

    ``freezing=True`` lets Inductor treat parameters as constants: that is what folds the PT2E
    q/dq patterns into prepacked int8 oneDNN convolutions and linears. Compile failures surface
    here as a :class:`BuildError`, not at the first prediction.

    ``dynamic=False`` (the default) compiles one static program per input shape met. With torch
    2.13 a PT2E graph exported with a dynamic batch, frozen and recompiled dynamically, failed at
    run time with a stride assertion inside the qconv kernel call, so dynamic is opt-in.
    """
    _check_cxx()
    compiled = InductorCompiled(graph_module, freezing, dynamic)
    try:
        compiled(*_tensors(example_args))
    except Exception as exc:
        raise BuildError(f"Inductor could not compile the model: {exc}", where="torch.compile(backend='inductor')",
                         fix="retry with freezing=False, or run with TORCH_LOGS=output_code to see the failing kernel") from exc
    return compiled


class InductorRunner(Runner):
    """A compiled module (from :func:`compile_inductor`) behind the Runner call signature."""

    kind = "inductor"

    def __init__(self, compiled: Callable, input_names: Sequence[str], output_names: Sequence[str] = ()):
        self.compiled = compiled
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise UsageError(f"missing inputs {', '.join(missing)}", fix=f"pass {', '.join(self.input_names)}")
        result = self.compiled(*_tensors(feed[n] for n in self.input_names))
        return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
