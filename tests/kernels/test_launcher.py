"""The relauncher's bookkeeping, on CPU: which launches share a remembered kernel, the order it passes
the arguments in, and the fallback to Triton's own path. A CUDA launch cannot run here, so the kernel
is a stand-in with the interface Triton's autotuner and compiled kernels have (``kernel[grid](...)``
returning the compiled kernel, ``best_config.kwargs``, ``compiled[grid](*args)``); the real launch is
compared with the op and the reference in ``test_gpu_paths.py`` on a GPU."""

from __future__ import annotations

import torch

from infopt.kernels.launcher import Relauncher, specialization


class Compiled:
    def __init__(self, log, broken=False):
        self.log, self.broken = log, broken

    def __getitem__(self, grid):
        def run(*values):
            if self.broken:
                raise TypeError("launcher() missing 1 required positional argument")
            self.log.append(("fast", grid, values))
        return run


class Config:
    kwargs = {"BLOCK": 32, "SPLIT": 2}


class Autotuned:
    """What ``triton.autotune`` gives: ``configs``, ``fn`` (the jit function, with ``arg_names``)."""

    configs = [Config()]

    def __init__(self, broken=False):
        self.fn = type("Jit", (), {"arg_names": ["x_ptr", "n", "FLAG", "BLOCK", "SPLIT"]})()
        self.log, self.best_config, self.broken = [], None, broken

    def __getitem__(self, grid):
        def run(*args, **flags):
            self.best_config = Config()
            self.log.append(("triton", grid({"BLOCK": 32, "SPLIT": 2}), args, flags))
            return Compiled(self.log, self.broken)
        return run


def grid(meta):
    return (64 // meta["BLOCK"], meta["SPLIT"])


def test_specialization_tells_apart_what_triton_compiles_apart():
    base = torch.zeros(64, dtype=torch.float16)
    assert specialization([base, 32]) == specialization([torch.ones(64, dtype=torch.float16), 48])
    assert specialization([base, 32]) != specialization([base[1:], 32]), "a 2-byte offset pointer is not 16-aligned"
    assert specialization([base, 32]) != specialization([base.float(), 32])
    assert specialization([base, 32]) != specialization([base, 1]) != specialization([base, 33])
    assert specialization([base, 32]) != specialization([base, 32 << 32]), "an int past 32 bits is typed i64"
    assert specialization([None, True, 1e-6]) == (None, True, float)


def test_a_repeat_launch_uses_the_remembered_kernel_with_arguments_in_signature_order():
    kernel = Autotuned()
    launch = Relauncher(kernel)
    x = torch.zeros(8)
    launch(("k", 1), grid, [x, 64], {"FLAG": True})
    launch(("k", 1), grid, [x, 64], {"FLAG": True})
    first, second = kernel.log
    assert first == ("triton", (2, 2), (x, 64), {"FLAG": True})
    assert second == ("fast", (2, 2, 1), (x, 64, True, 32, 2)), "positional, then flags and the tuned values"
    launch(("k", 2), grid, [x, 64], {"FLAG": False})
    assert kernel.log[-1][0] == "triton", "another key is not served from the first one's kernel"


def test_a_launch_triton_rejects_turns_the_shortcut_off_for_good():
    kernel = Autotuned(broken=True)
    launch = Relauncher(kernel)
    x = torch.zeros(8)
    for _ in range(3):
        launch(("k",), grid, [x, 64], {"FLAG": True})
    assert [entry[0] for entry in kernel.log] == ["triton", "triton", "triton"]
    assert not launch.enabled and not launch.cache
