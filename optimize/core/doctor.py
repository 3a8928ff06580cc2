"""``infopt doctor``: which backends and devices this machine has, and why not when it lacks one."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _check(component: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    return {"component": component, "ok": ok, "detail": detail, "fix": "" if ok else fix}


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor would use for CPU kernels, or None."""
    import os
    import shutil

    for name in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        found = shutil.which(name)
        if found:
            return found
    return None


def checks() -> list[dict[str, Any]]:
    found = []
    torch_version = _pkg("torch")
    found.append(_check("torch", torch_version is not None, torch_version or "not installed", "pip install torch"))
    cuda_detail, cuda_ok = "torch not installed", False
    if torch_version:
        import torch

        if torch.version.cuda is None:
            cuda_detail = "this torch is a CPU-only build"
        elif not torch.cuda.is_available():
            cuda_detail = f"torch built for CUDA {torch.version.cuda}, but no GPU or driver is visible"
        else:
            cuda_ok = True
            cuda_detail = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    found.append(_check("CUDA GPU", cuda_ok, cuda_detail,
                        "GPU targets are built here but validated on CPU; run on a GPU machine to time them"))
    ort_version = _pkg("onnxruntime") or _pkg("onnxruntime-gpu")
    providers = []
    if ort_version:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    found.append(_check("onnxruntime", ort_version is not None,
                        f"{ort_version}: {', '.join(providers)}" if ort_version else "not installed",
                        "pip install onnxruntime"))
    for provider, fix in (("CUDAExecutionProvider", "pip install onnxruntime-gpu on a CUDA machine"),
                          ("TensorrtExecutionProvider", "pip install onnxruntime-gpu and TensorRT on a CUDA machine")):
        found.append(_check(f"ORT {provider}", provider in providers,
                            "available" if provider in providers else "not in this onnxruntime build", fix))
    for module, label, fix in (("tensorrt", "TensorRT", "install TensorRT from NVIDIA's index on a CUDA machine"),
                               ("triton", "Triton (kernels)", "pip install triton (comes with CUDA torch builds)")):
        try:
            mod = importlib.import_module(module)
            found.append(_check(label, True, getattr(mod, "__version__", "installed")))
        except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
            found.append(_check(label, False, f"cannot import {module}: {type(exc).__name__}", fix))
    compiler = cpp_compiler()
    found.append(_check("C++ compiler (AOTInductor CPU)", compiler is not None, compiler or "none on PATH",
                        "install g++ (apt install g++), or set CXX; --backend inductor needs it for CPU packages"))
    for pkg in ("onnx", "onnxscript"):
        v = _pkg(pkg)
        found.append(_check(pkg, v is not None, v or "not installed", f"pip install {pkg}"))
    return found
