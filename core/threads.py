"""How many threads infopt's own runs use, and the ONNX Runtime session options every run shares.

``INFOPT_THREADS=N`` caps the threads of every ONNX Runtime session infopt opens (validation,
calibration, sensitivity, latency) and of torch in the command line. Unset, each runtime takes
its own default (one thread per core). Set it where cores are shared: a CI runner running other
jobs, or test workers side by side, where two runtimes each spinning a pool over every core run
slower than each on one. Latency figures are then for that many threads, and the manifest says so.

On an x86 CPU without VNNI, every session asks ONNX Runtime for exact int8 matrix products
(``cpu_features.int8_products_saturate``).
"""

from __future__ import annotations

import os
import sys

from infopt.core.cpu_features import int8_products_saturate
from infopt.core.errors import UsageError

ENV = "INFOPT_THREADS"


def thread_cap() -> int:
    """The cap from ``$INFOPT_THREADS``, or 0 (each runtime's own default)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{ENV}={raw!r} is not a thread count", fix=f"set {ENV} to a whole number >= 1, or unset it")
    return int(raw)


def ort_session_options(optimize: bool = True, threads: int = 0):
    """``onnxruntime.SessionOptions``: quiet, all graph optimizations or none, ``threads`` (else the cap)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    threads = threads or thread_cap()
    if threads:
        options.intra_op_num_threads = threads
    if int8_products_saturate():
        # rewrites int8 weights to uint8 so the exact (slower) u8 x u8 kernels run; float models are untouched
        options.add_session_config_entry("session.x64quantprecision", "1")
    return options


def cap_torch_threads() -> None:
    """Apply the cap to torch in this process (the command line does; the Python API leaves the
    caller's torch alone). Before torch is imported, through ``OMP_NUM_THREADS``, which torch reads
    when it starts, so a command that needs no torch does not import it."""
    threads = thread_cap()
    if not threads:
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def physical_cores() -> int:
    """The physical cores this process may run on (its CPU affinity, SMT siblings counted once): the thread
    count ONNX Runtime's own default picks, and the one a deployable written for this machine declares."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "core_id") as core, open(topology + "physical_package_id") as package:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
