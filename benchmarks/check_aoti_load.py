"""Question: does this machine's torch load AOTInductor packages at all, apart from anything infopt does?

Tiny programs are compiled with ``torch._inductor.aoti_compile_and_package`` alone (no infopt code), each in
its own process, then each package is loaded and run in a fresh process under faulthandler, so a crash in
native code is a line of the table with its signal, not the end of the check:

- ``pointwise``: ``x * 2 + 1`` on CUDA (no weights, no buffers, one generated kernel);
- ``linear``: ``Linear(16, 16)`` in fp16 on CUDA, loaded as it is, after CUDA is initialised, and single-threaded;
- ``cpu``: the same ``Linear`` in fp32 for the CPU;
- ``so``: the ``.so`` of ``torch._inductor.aot_compile``, opened with ``AOTIModelContainerRunnerCuda``.

    python benchmarks/check_aoti_load.py          # on a GPU machine; about 2 minutes
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

COMPILE = r'''
import sys, torch
kind, device, path = sys.argv[1:4]
dtype = torch.float16 if device == "cuda" else torch.float32
class Pointwise(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1
model = (Pointwise() if kind == "pointwise" else torch.nn.Linear(16, 16)).to(device, dtype).eval()
x = torch.randn(4, 16, device=device, dtype=dtype)
program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=16)},))
if kind == "so":
    torch._inductor.aot_compile(program.module(), (x,), options={"aot_inductor.output_path": path})
else:
    torch._inductor.aoti_compile_and_package(program, package_path=path)
'''

LOAD = r'''
import sys, torch
path, how = sys.argv[1:3]
if how == "so":
    runner = torch._C._aoti.AOTIModelContainerRunnerCuda(path, 1, "cuda")
    call = lambda x: runner.run([x])
else:
    if how == "cuda-first":
        torch.zeros(1, device="cuda")
    package = torch._inductor.aoti_load_package(path, run_single_threaded=how == "single-threaded")
    call = package
device = "cpu" if how == "cpu" else "cuda"
x = torch.randn(4, 16, device=device, dtype=torch.float32 if device == "cpu" else torch.float16)
with torch.inference_mode():
    y = call(x)
print("ran", tuple((y[0] if isinstance(y, (list, tuple)) else y).shape))
'''

PROGRAMS = {"pointwise": ("pointwise", "cuda", "pw.pt2"), "linear": ("linear", "cuda", "linear.pt2"),
            "cpu": ("linear", "cpu", "cpu.pt2"), "so": ("so", "cuda", "linear.so")}
LOADS = [("pointwise", "as is"), ("linear", "as is"), ("linear", "cuda-first"), ("linear", "single-threaded"),
         ("cpu", "cpu"), ("so", "so")]


def outcome(done: subprocess.CompletedProcess) -> str:
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1]
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("Extension modules")]
    what = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return f"{what}: {lines[-1].strip() if lines else ''}"


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="aoti-load-"))
    (work / "compile.py").write_text(COMPILE)
    (work / "load.py").write_text(LOAD)
    compiling = {name: subprocess.Popen([sys.executable, str(work / "compile.py"), kind, device, str(work / file)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name, (kind, device, file) in PROGRAMS.items()}
    print("| program | load | result |\n| --- | --- | --- |")
    for name, how in LOADS:
        process = compiling[name]
        _, err = process.communicate()
        if process.returncode != 0:
            print(f"| {name} | {how} | compile failed: {err.strip().splitlines()[-1] if err.strip() else process.returncode} |")
            continue
        done = subprocess.run([sys.executable, "-X", "faulthandler", str(work / "load.py"), str(work / PROGRAMS[name][2]), how],
                              capture_output=True, text=True, timeout=120)
        print(f"| {name} | {how} | {outcome(done)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
