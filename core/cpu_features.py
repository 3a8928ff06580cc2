"""What this machine's CPU computes fast, or exactly, read from its flags (``/proc/cpuinfo``).

- :func:`int8_products_saturate`: on x86 without VNNI (or AMX), a u8 x s8 matrix product adds each pair of
  neighbouring products in saturating 16-bit arithmetic (``VPMADDUBSW``), so 255 x 127 x 2 = 64,770 becomes 32,767
  and a quantized model computes something else than its QDQ graph says. ONNX Runtime then needs
  ``session.x64quantprecision`` (``threads.ort_session_options`` sets it).
- :func:`bf16_products_fast`: a bf16 matrix product is several times faster than a float32 one where the CPU has
  bf16 instructions (AVX512-BF16, AMX) or on a GPU; elsewhere it is emulated and several times slower, so
  calibration and the reference's forwards multiply in float32 there (:mod:`infopt.core.bf16_compute`).
"""

from __future__ import annotations

import functools
import platform

CPUINFO = "/proc/cpuinfo"
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""flags of the x86 instructions that add int8 products in 32 bits"""
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""flags of the x86 instructions that multiply bf16 natively"""


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


@functools.cache
def cpu_flags(cpuinfo: str = CPUINFO) -> frozenset[str] | None:
    """The first processor's flags; None where they cannot be read."""
    try:
        with open(cpuinfo) as info:
            return frozenset(next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), []))
    except OSError:
        return None


def int8_products_saturate(cpuinfo: str = CPUINFO) -> bool:
    """Whether ONNX Runtime's fast int8 kernels clip on this CPU: x86 without VNNI; an x86 CPU whose flags cannot be
    read counts as one that clips."""
    if not _x86():
        return False
    flags = cpu_flags(cpuinfo)
    return flags is None or not VNNI_FLAGS & flags


def bf16_products_fast(device: str = "cpu", cpuinfo: str = CPUINFO) -> bool:
    """Whether bf16 matrix products on ``device`` beat float32's: a GPU, a CPU with bf16 instructions, or an ARM
    CPU (whose flags name them otherwise; torch picks its kernels there)."""
    if device != "cpu":
        return True
    if not _x86():
        return True
    flags = cpu_flags(cpuinfo)
    return flags is not None and bool(BF16_FLAGS & flags)
