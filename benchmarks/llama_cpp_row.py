"""llama.cpp's own quantization of a Hugging Face folder, as its users run it, for ``bench_real_llm.py``'s peer rows.

A row is three of llama.cpp's tools, timed together as one build: ``convert_hf_to_gguf.py FOLDER --outtype f32``,
then with an importance matrix ``llama-imatrix -f calib.txt`` (on the same calibration text infopt gets), then
``llama-quantize [--imatrix FILE] f32.gguf out.gguf TYPE``. The GGUF is judged through llama-cpp-python
(``tests/support/real_llm.py``'s ``judge_gguf``) and its TPOT timed by :func:`tpot`.

The tools come from llama-cpp-python's source distribution, built once with cmake
(``benchmarks/install_llama_cpp.sh``); ``--llama-cpp DIR`` (or ``LLAMA_CPP_DIR``) names its ``vendor/llama.cpp``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.bench_scale import run_measured

THREADS = 2


def tools(llama_dir: Path) -> dict[str, Path]:
    """The converter and the two tools under ``llama_dir``; a clear error where one is missing."""
    found = {"convert": llama_dir / "convert_hf_to_gguf.py", "imatrix": llama_dir / "build" / "bin" / "llama-imatrix",
             "quantize": llama_dir / "build" / "bin" / "llama-quantize"}
    missing = [str(p) for p in found.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"llama.cpp's tools are not built: {', '.join(missing)} (run benchmarks/install_llama_cpp.sh, "
                         "then pass --llama-cpp DIR)")
    return found


def build(folder: Path, out: Path, kind: str, calib: Path | None, llama_dir: Path, limit_s: float) -> dict:
    """``out`` (a GGUF) of ``folder`` in ``kind`` (``Q4_K_M``, ``Q4_0``, ``Q8_0``), with an importance matrix from
    ``calib`` where given: the steps' wall seconds summed, their peak RSS the largest."""
    paths = tools(llama_dir)
    env = {**os.environ, "PYTHONPATH": str(llama_dir / "gguf-py"), "HF_HUB_OFFLINE": "1"}
    full = out.with_name(f"{folder.name}-f32.gguf")
    steps = [[sys.executable, str(paths["convert"]), str(folder), "--outtype", "f32", "--outfile", str(full)]]
    imatrix = out.parent / f"{out.name}.imatrix"
    if calib is not None:
        steps.append([str(paths["imatrix"]), "-m", str(full), "-f", str(calib), "-o", str(imatrix), "-c", "256",
                      "-t", str(THREADS)])
    steps.append([str(paths["quantize"]), *(["--imatrix", str(imatrix)] if calib is not None else []), str(full),
                  str(out), kind, str(THREADS)])
    row = {"code": 0, "wall_s": 0.0, "peak_rss": 0, "status": "ok", "stderr": ""}
    for command in steps:
        done = run_measured(command, limit_s, env)
        row.update(code=done["code"], status=done["status"], stderr=done["stderr"],
                   wall_s=row["wall_s"] + done["wall_s"], peak_rss=max(row["peak_rss"], done["peak_rss"]))
        if done["code"] != 0:
            break
    full.unlink(missing_ok=True)
    return row


def tpot(path: Path, rounds: int, prompt: int = 32, new_tokens: int = 64, vocab: int = 49152) -> list[float]:
    """Seconds of each decode step at batch 1 through llama-cpp-python after a ``prompt``-token prompt, over
    ``rounds`` rounds (the first round is a warm-up and not kept)."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(str(path), n_ctx=prompt + new_tokens + 1, n_threads=THREADS, verbose=False)
    rng = np.random.default_rng(0)
    seconds: list[float] = []
    for round_ in range(rounds + 1):
        llm.reset()
        llm.eval(rng.integers(1, vocab, prompt).tolist())
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        for _ in range(new_tokens):
            start = time.perf_counter()
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if round_:
                seconds.append(time.perf_counter() - start)
    llm.close()
    return seconds
