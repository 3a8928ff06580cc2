"""``infopt doctor``: what this machine has for building and running models, and why not where it
lacks something. The general checks (torch, a CUDA GPU, the exporters, Triton for kernels) are here;
each backend's descriptor adds its own (``Backend.checks``), so a new backend reports itself; a row per
plugin another package declares (``plugin_checks``) says whether it loaded."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from infopt.core.plugin_loader import GROUP, Plugin
from infopt.runtime import backends, precision_routes
from infopt.runtime.backend import check, package_version


def _cuda() -> tuple[bool, str]:
    if package_version("torch") is None:
        return False, "torch not installed"
    import torch  # optional heavy dependency: loaded only when the doctor runs

    if torch.version.cuda is None:
        return False, "this torch is a CPU-only build"
    if not torch.cuda.is_available():
        return False, f"torch built for CUDA {torch.version.cuda}, but no GPU or driver is visible"
    return True, ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def checks(plugins: Sequence[Plugin]) -> list[dict[str, Any]]:
    """The rows, the backends' own among them, then the ``plugins``' (loaded before this is asked, so a
    backend a plugin registered reports itself too)."""
    torch_version = package_version("torch")
    found = [check("torch", torch_version is not None, torch_version or "not installed", "pip install torch")]
    cuda_ok, cuda_detail = _cuda()
    found.append(check("CUDA GPU", cuda_ok, cuda_detail,
                       "GPU targets are built here but validated on CPU; run on a GPU machine to time them"))
    for backend in backends.registered().values():
        found += backend.checks()
    found += precision_routes.checks()
    try:
        triton = importlib.import_module("triton")
        found.append(check("Triton (kernels)", True, getattr(triton, "__version__", "installed")))
    except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
        found.append(check("Triton (kernels)", False, f"cannot import triton: {type(exc).__name__}",
                           "pip install triton (comes with CUDA torch builds)"))
    for pkg in ("onnx", "onnxscript"):
        v = package_version(pkg)
        found.append(check(pkg, v is not None, v or "not installed", f"pip install {pkg}"))
    return found + plugin_checks(plugins)


def plugin_checks(plugins: Sequence[Plugin]) -> list[dict[str, Any]]:
    """One row per plugin (``plugin NAME``: its module, distribution and version, loaded or the error), with
    the plugin's own fields under ``plugin`` for ``--json``; one row saying where plugins come from if none."""
    if not plugins:
        return [check("plugins", True, f"none installed (a package declares one as an {GROUP!r} entry point)")]
    return [{**check(f"plugin {p.name}", p.loaded, f"{p.value} from {p.distribution} {p.version}: "
                     + ("loaded" if p.loaded else f"failed: {p.error}"), p.fix), "plugin": p.to_json()}
            for p in plugins]
