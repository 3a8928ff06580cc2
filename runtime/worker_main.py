"""The worker process of ``runtime/worker.py``: ``python -m infopt.runtime.worker_main``, spoken to over its
stdin and stdout by a :class:`~infopt.runtime.worker.WorkerRunner`, which opens one model with the backend's own
``open_runner`` and sends ``run`` and ``time`` requests, or by a :class:`~infopt.runtime.worker.Worker`, which sends
``call`` requests (a function by module and name, its arguments), until ``close`` or the end of its input."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from pathlib import Path

from infopt.runtime import backends
from infopt.runtime.clocks import cuda_timer, host_timer


def _serve(channel_in, channel_out) -> None:
    """The worker's loop: answer ``open``, ``run``, ``time`` and ``call`` requests until ``close`` or EOF."""
    runner = None
    while True:
        try:
            message = pickle.load(channel_in)
        except EOFError:
            return
        verb = message[0]
        if verb == "close":
            return
        try:
            if verb == "open":
                _, path, names, outputs, threads, device, options, (module, name), path_entries = message
                sys.path[:] = path_entries
                opener = getattr(importlib.import_module(module), name, None) if module and "<" not in name else None
                runner = (opener(Path(path), names, outputs, threads=threads, device=device, **options) if opener
                          else backends.runner_for_file(path, names, outputs, threads, device=device, **options))
                backend = backends.for_runner(runner)
                answer = (runner.kind, runner.device, backend.describe(runner) if backend else runner.kind)
            elif verb == "call":  # a module-level function by name: ``Worker.call``
                _, module, name, args, kwargs = message
                answer = getattr(importlib.import_module(module), name)(*args, **kwargs)
            elif verb == "run":
                answer = runner.run(message[1])
            else:
                answer = (cuda_timer if runner.device == "cuda" else host_timer)(runner.run, message[1])
            reply = ("ok", answer)
        except Exception as exc:  # noqa: BLE001 - the parent raises it again with its type's name
            reply = ("error", type(exc).__name__, str(exc))
        pickle.dump(reply, channel_out, protocol=pickle.HIGHEST_PROTOCOL)
        channel_out.flush()


def _first_for_the_oom_killer() -> None:
    """Should memory run out faster than the parent's watch sees it, the kernel takes this process before the
    build's (raising one's own ``oom_score_adj`` needs no privilege)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("800")
    except OSError:
        pass


def main() -> None:
    _first_for_the_oom_killer()
    for name in sys.argv[1:]:  # what the backend needs, imported before its model arrives (``worker.prestart``)
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # opening the model says what is missing
    channel_out = os.fdopen(os.dup(1), "wb")  # the protocol's; fd 1 itself now goes to stderr, where native
    os.dup2(2, 1)                             # code's prints belong
    sys.stdout = sys.stderr
    _serve(sys.stdin.buffer, channel_out)


if __name__ == "__main__":
    main()
