"""Runners whose native side dies, for the worker-process tests: each is an ``open_runner`` a test puts in a
backend's descriptor; the worker (``runtime/worker.py``) imports this module and calls it by name. Kept light:
a worker imports it, and numpy."""

from __future__ import annotations

import ctypes
import os
import resource
import signal

import numpy as np

from infopt.runtime.runner import Runner


class Crashing(Runner):
    kind = "crashing"

    def __init__(self, names, how: str):
        self.input_names, self.how = tuple(names), how

    def run(self, feed):
        if self.how == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        elif self.how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)  # how the kernel's OOM killer ends a process
        elif self.how == "rlimit":
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (_address_space() + 64 * 2**20, hard))
            try:
                np.ones(2**30, np.uint8)  # 1 GiB past a limit of 64 MiB more than it has
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return [np.asarray(feed[n]) * 2 for n in self.input_names]


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def segfault_on_run(path, names, outputs=(), threads=0, device="cpu", **options):
    return Crashing(names, "segfault")


class CrashingAtBatch3(Runner):
    """The real runner of the file, but for a batch of 3 (a size only the latency step asks for, with
    ``--batch-sizes 3``), where it reads address 0."""

    def __init__(self, inner: Runner):
        self.inner, self.kind, self.device = inner, inner.kind + "-crashing-at-3", inner.device
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def run(self, feed):
        if len(next(iter(feed.values()))) == 3:
            ctypes.string_at(0)
        return self.inner.run(feed)


def segfault_at_batch_3(path, names, outputs=(), threads=0, device="cpu", **options):
    from infopt.runtime.backends import runner_for_file

    return CrashingAtBatch3(runner_for_file(path, names, outputs, threads, device=device, **options))


def abort_on_load(path, names, outputs=(), threads=0, device="cpu", **options):
    os.abort()


def killed_on_run(path, names, outputs=(), threads=0, device="cpu", **options):
    return Crashing(names, "killed")


def out_of_memory_on_run(path, names, outputs=(), threads=0, device="cpu", **options):
    return Crashing(names, "rlimit")


def doubling(path, names, outputs=(), threads=0, device="cpu", **options):
    return Crashing(names, "none")


class Growing(Runner):
    """A runner whose run takes memory 64 MiB at a time, touched, up to 4 GiB: a model that does not fit."""

    kind = "growing"

    def __init__(self, names):
        self.input_names = tuple(names)

    def run(self, feed):
        import time

        held = []
        for _ in range(64):
            held.append(np.ones(2**26, np.uint8))
            time.sleep(0.05)  # the parent reads its memory every 0.1 s: two steps a read
        return [np.asarray(feed[n]) * 2 for n in self.input_names]


def growing_on_run(path, names, outputs=(), threads=0, device="cpu", **options):
    return Growing(names)
