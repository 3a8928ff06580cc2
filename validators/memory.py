"""Peak memory of an artifact: the resident memory a fresh process adds by loading the model and
running one batch.

Each artifact is measured in a child process of its own (``python -m infopt.validators.memory``),
so neither model's freed pages nor the allocator's caches flatter or penalize the other: the
child imports the runtime, resets the kernel's resident-set high-water mark (``VmHWM``, through
``/proc/self/clear_refs``), records its resident set, loads the model, runs the batch and reports
the high-water mark less that starting figure. On a CUDA runner the peak of
torch's CUDA allocator is reported beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infopt.core.errors import ValidationFailed
from infopt.core.manifest import read_manifest
from infopt.core.sample_inputs import random_feed
from infopt.core.work_folders import work_folder
from infopt.runtime.backends import manifest_runner

CHILD_TIMEOUT_S = 600


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` figure in KiB (Linux); None where there is none."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's resident-set high-water mark (``VmHWM``) to the current figure."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_since_start(start_kib: int, reset: bool) -> int:
    if reset and (hwm := _status_kib("VmHWM")) is not None:
        return max(hwm - start_kib, 0) * 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux; since the process began
    return max(peak - start_kib, 0) * 1024


def measure_here(dist: Path, batch: int) -> dict:
    """Load ``dist``'s model, run one random batch of ``batch`` samples; the memory it took."""
    import numpy as np  # noqa: F401 - loaded before the starting figure, as every runtime needs it
    import onnxruntime  # noqa: F401 - the runtime's own import is not the model's memory

    manifest = read_manifest(dist)
    spec = manifest.input_spec()
    dims = {spec.batch_symbol: batch} if spec.batch_symbol else {}
    feed = random_feed(spec, **dims)
    reset = _reset_peak()
    start = _status_kib("VmRSS") or 0
    runner = manifest_runner(dist, manifest)
    runner.run(feed)
    result = {"peak_rss_bytes": _peak_since_start(start, reset), "batch": batch if spec.batch_symbol else 1}
    if runner.device == "cuda":
        import torch

        result["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return result


def measure(dist: Path, batch: int) -> dict:
    """``measure_here`` in a fresh child process, which writes its figures to a file of ours."""
    with work_folder("memory") as tmp:
        result = Path(tmp) / "memory.json"
        cmd = [sys.executable, "-m", "infopt.validators.memory", str(dist), str(batch), str(result)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ValidationFailed(f"measuring the memory of {dist} took over {CHILD_TIMEOUT_S} s") from None
        if done.returncode != 0 or not result.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValidationFailed(f"measuring the memory of {dist} failed: {last}",
                                   fix="run `infopt validate` on it to see why it does not run")
        return json.loads(result.read_text())


if __name__ == "__main__":
    Path(sys.argv[3]).write_text(json.dumps(measure_here(Path(sys.argv[1]), int(sys.argv[2]))))
