"""A runner in a worker process: native code that crashes takes the worker down, not the build.

An AOTInductor package, a TensorRT engine or an execution provider's kernels run native code that Python
cannot catch: loading an AOTInductor package has ended the process with SIGSEGV (benchmarks/results/rules.md).
:class:`WorkerRunner` opens the model in a child process (``python -m infopt.runtime.worker_main``) and
sends it feeds over a pipe; when the child dies, the call raises :class:`RunnerCrashed`, which says which
signal, while doing what, and the last lines the child wrote to stderr (Python's faulthandler stack among
them). The build fails that candidate with that reason and goes on with the others.

Timing goes through the worker too: :meth:`WorkerRunner.clock` runs the model there, timed there (host clock,
or CUDA events for a CUDA model), so the pipe's round trip is not part of a latency figure.

The child's file descriptor 1 is its protocol channel; anything native code prints goes to its stderr, which
is a temporary file the parent reads back when the child dies.

Memory: while the parent waits for an answer it reads the worker's resident memory and the machine's available
memory every :data:`WATCH_S` seconds. A worker that would leave the machine less than :func:`reserve_bytes`, or
that holds more than ``INFOPT_WORKER_MEMORY`` (``12G``, ``800M``: a cap for shared machines), is stopped there and
its candidate fails with what it held and what the machine had, before the kernel's OOM killer picks a process
(the build's own, as likely as not). A worker also asks the kernel to take it first should memory run out
anyway (``oom_score_adj``), so an allocation faster than the watch ends the worker, not the build.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from infopt.core.cache import cache_dir
from infopt.core.errors import BuildError, UsageError
from infopt.runtime.memory_estimate import available_bytes
from infopt.runtime.runner import Runner

STDERR_TAIL = 1500
"""characters of the child's stderr a crash report quotes"""
WATCH_S = 0.1
"""how often the parent reads a busy worker's memory"""
MEMORY_ENV = "INFOPT_WORKER_MEMORY"
"""the most resident memory a worker may hold (``12G``, ``800M``, bytes); unset: what the machine has"""


class RunnerCrashed(BuildError):
    """The process running a model died: a signal, an abort, the kernel's OOM killer."""

    title = "runner crashed"
    word = "crashed"
    """how a candidate's reason starts (``out of memory`` where infopt stopped the worker for memory)"""


def describe_exit(code: int) -> str:
    """How a process ended, in words: ``SIGSEGV (a segmentation fault)``, ``exit 1``."""
    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
    meaning = {"SIGSEGV": "a segmentation fault in native code", "SIGABRT": "native code called abort()",
               "SIGKILL": "killed: the kernel's OOM killer ends a process so when memory runs out",
               "SIGBUS": "a bus error in native code", "SIGILL": "an illegal instruction in native code",
               "SIGFPE": "an arithmetic fault in native code"}.get(name)
    return f"{name} ({meaning})" if meaning else name


def reserve_bytes() -> int:
    """The memory a worker must leave the machine: 5% of it, at most 1 GiB (the kernel, the build's own process)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 2**30
    return min(2**30, total // 20)


def memory_cap() -> int | None:
    """``INFOPT_WORKER_MEMORY`` in bytes; None when unset."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return None
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = (text[:-1], text[-1].upper()) if text[-1].upper() in units else (text, "")
    try:
        value = float(number) * units.get(unit, 1)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"{MEMORY_ENV}={text!r} is not an amount of memory", fix="set it as 12G, 800M or bytes, or unset it")
    return int(value)


def resident_bytes(pid: int) -> int | None:
    """A process's resident memory (``VmRSS``); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


class MemoryWatch:
    """Whether a busy worker must be stopped for memory (see the module doc); one per :class:`WorkerRunner`."""

    def __init__(self, pid: int):
        self.pid, self.cap, self.reserve = pid, memory_cap(), reserve_bytes()
        self.peak = 0

    def verdict(self) -> str | None:
        """None while the worker may go on; else what it held and what there was, in words."""
        held = resident_bytes(self.pid)
        if held is None:
            return None
        self.peak = max(self.peak, held)
        if self.cap is not None and held > self.cap:
            return f"it held {_gb(held)}, past {MEMORY_ENV}={os.environ[MEMORY_ENV]} ({_gb(self.cap)})"
        free = available_bytes()
        if free is not None and free < self.reserve:
            return (f"it needs more than the {_gb(held)} it held, and this machine had {_gb(held + free)} for it "
                    f"({_gb(free)} left)")
        return None


_SPARES: list[tuple[subprocess.Popen, Any]] = []
"""workers started ahead (:func:`prestart`), each already importing what its backend needs"""


def _spawn(imports: Sequence[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Any]:
    stderr = tempfile.TemporaryFile("w+b")
    env = {**os.environ, **(env or {}), "PYTHONFAULTHANDLER": "1"}
    # Inductor's cache in infopt's folder, as the build's compile keeps it, not torchinductor_<user> in $TMPDIR
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir("inductor")))
    process = subprocess.Popen([sys.executable, "-m", "infopt.runtime.worker_main", *imports],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env)
    return process, stderr


def prestart(imports: Sequence[str]) -> None:
    """Start a worker now, importing ``imports`` (``Backend.worker_imports``: ``torch._inductor`` takes 5 s here)
    while the build captures, exports and compiles; the next :class:`WorkerRunner` takes it instead of starting
    its own. :func:`discard_spares` ends those not taken."""
    _SPARES.append(_spawn(tuple(imports)))


def discard_spares() -> None:
    while _SPARES:
        process, stderr = _SPARES.pop()
        process.kill()
        process.wait()
        stderr.close()


atexit.register(discard_spares)


MEMORY_FIX = (f"build on a machine with more memory, or with smaller batches (--batch-sizes, --dim); {MEMORY_ENV} caps "
              "a worker on a shared machine")
CRASH_FIX = ("this runtime's native code crashed on this machine: try another --backend, or report the lines above "
             "with `infopt doctor`'s output")


def huge_pages_env() -> dict[str, str]:
    """The environment a worker that allocates a model's weights at once starts with: glibc's ``malloc`` asks for
    transparent huge pages on its large mappings (``glibc.malloc.hugetlb=1``, glibc 2.35 on; older ones ignore it)
    where the kernel leaves them to ``madvise``. Opening a Qwen2.5-1.5B-shaped float32 GenAI folder (6.2 GB of
    weights repacked) took 8.2-12.4 s without it here, 7.0-7.5 s with it (four opens each); decode times within
    noise."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")]
    return {"GLIBC_TUNABLES": ":".join([*tunables, "glibc.malloc.hugetlb=1"])}


class Worker:
    """A worker process (``python -m infopt.runtime.worker_main``) answering calls; its death is a
    :class:`RunnerCrashed` saying why, its memory watched while it works (the module doc)."""

    def __init__(self, imports: Sequence[str] = (), env: dict[str, str] | None = None, fix: str = CRASH_FIX,
                 memory_fix: str = MEMORY_FIX, spawned: tuple[subprocess.Popen, Any] | None = None):
        """``spawned``: a process :func:`prestart` started (its imports and ``env`` its own)."""
        self._process, self._stderr = spawned or _spawn(tuple(imports), env)
        self._watch, self._stopped = MemoryWatch(self._process.pid), None
        self.crash_fix, self.memory_fix = fix, memory_fix

    def call(self, function: Callable, *args, doing: str, **kwargs):
        """``function(*args, **kwargs)`` in the worker (a module-level function, imported there by name), its value
        sent back; ``doing`` says what for, should the worker die meanwhile. An exception there is raised here as
        a RuntimeError with its message (its type's name first but for a RuntimeError)."""
        return self._ask(("call", function.__module__, function.__qualname__, args, kwargs), doing)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def dead(self) -> bool:
        """Whether the worker process has ended (a crash, or ``close``)."""
        return self._process.poll() is not None

    def _ask(self, message: tuple, doing: str):
        process = self._process
        if process.poll() is not None:
            raise self._crashed(doing)
        try:
            pickle.dump(message, process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            process.stdin.flush()
            self._await_answer()
            status, *value = pickle.load(process.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError, OSError):
            raise self._crashed(doing) from None
        if status == "error":
            error_type, text = value
            raise RuntimeError(text if error_type == "RuntimeError" else f"{error_type}: {text}")
        return value[0]

    def _await_answer(self) -> None:
        """Wait until the worker's answer starts to arrive, reading its memory meanwhile; a worker that must stop
        for memory is killed here (its pipe then ends, and the caller reports why): one already past its cap or the
        machine's reserve as the call starts, too, whatever the call's length."""
        channel = self._process.stdout.fileno()
        reason = self._watch.verdict()
        while reason is None and not select.select([channel], [], [], WATCH_S)[0]:
            reason = self._watch.verdict()
        if reason is not None:
            self._stopped = reason
            self._process.kill()

    def _crashed(self, doing: str) -> RunnerCrashed:
        if self._stopped is not None:
            self._process.wait()
            stopped = RunnerCrashed(f"the process {doing} was stopped for memory: {self._stopped}; infopt stopped it "
                                 "before the kernel's OOM killer would pick a process",
                                 fix=self.memory_fix)
            stopped.word = "out of memory"
            return stopped
        try:
            code = self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().decode("utf-8", "replace").splitlines()
                 if line.strip() and not line.startswith("Extension modules:")]  # faulthandler's list of C modules
        tail = "\n".join(lines)[-STDERR_TAIL:].strip()
        return RunnerCrashed(f"the process {doing} ended with {describe_exit(code)}"
                             + (f"; its last output:\n{tail}" if tail else ""),
                             fix=self.crash_fix)

    def close(self) -> None:
        """Tell the worker to end, without waiting for it (its torch takes about a second to tear down); once."""
        if self._stderr.closed:
            return
        if self._process.poll() is None:
            try:
                pickle.dump(("close",), self._process.stdin)
                self._process.stdin.close()
            except OSError:
                self._process.kill()
        self._stderr.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the pipes may be gone already
            pass


class WorkerRunner(Worker, Runner):
    """The runner ``runtime.backend.runner_for_file`` would open for ``path``, opened and run in a worker process."""

    kind = "worker"

    def __init__(self, path: str | Path, input_names: Sequence[str] = (), output_names: Sequence[str] = (),
                 threads: int = 0, device: str = "cpu", options: dict[str, Any] | None = None,
                 opener: Callable[..., Runner] | None = None):
        self.path = Path(path)
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        super().__init__(spawned=_SPARES.pop(0) if _SPARES else None)
        # the worker calls the same ``open_runner`` (a plugin's, a test's), imported by name with this process's
        # import path; one it cannot name (a lambda) is found there by the file's suffix
        where = (opener.__module__, opener.__qualname__) if opener is not None else ("", "")
        opened = self._ask(("open", str(self.path), self.input_names, self.output_names, threads, device, options or {},
                            where, list(sys.path)), f"loading {self.path.name}")
        self.inner_kind, self.device, description = opened
        self.description = f"{description}, in a worker process"

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._ask(("run", feed), f"running {self.path.name}")

    def clock(self, fn, feed: dict[str, np.ndarray]) -> float:
        """Seconds one run takes, measured in the worker (``validators.timing``'s clock signature; ``fn`` is not
        called here: the worker runs its own model)."""
        return self._ask(("time", feed), f"timing {self.path.name}")
