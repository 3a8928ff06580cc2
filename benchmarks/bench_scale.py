"""Question: at the sizes users deploy, how long does a text-generation build take, how much memory does it
need and how large is what it writes, beside ONNX Runtime GenAI's model builder on the same folder?

Each model is a folder with a real model's config (``tests/support/checkpoints.py``: Qwen2.5-0.5B, Qwen2.5-1.5B,
Qwen2.5-3B, Llama-3.1-8B) and random bf16 weights, written shard by shard without building the model in
memory, beside a small byte-level BPE tokenizer. Each build runs as a user runs it, in its own process, once
what was written before it is on disk (``os.sync``):

- ``infopt build FOLDER --task text-generation --val held-out.txt [--int4]``, as the README's example runs it
  (``held-out.txt``: the test sentences six to a line, 40 lines of 162-345 tokens, each cut to the judging's 128;
  ``--val none`` leaves it out;
  INT4 without ``--calib``: GPTQ on 16 sequences of 128 tokens the model samples itself, where the builder's int4
  is RTN; no drift budget, random weights agreeing little);
- precision ``int4-calib``: ``--int4 --calib calib.txt`` (GPTQ and the INT4 choice; ``calib.txt``: the test
  sentences after the first 240, six to a line, none of them in ``held-out.txt``); the builder has no calibrated
  INT4, so its row of this precision is left out and infopt's is read against the builder's ``int4``;
- ``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32|int4 -e cpu``;
- with ``--llama-cpp DIR`` (or ``LLAMA_CPP_DIR``; ``benchmarks/install_llama_cpp.sh``), once per model, llama.cpp's
  Q4_K_M of the same weights: ``benchmarks/gguf_from_folder.py FOLDER bf16.gguf`` (the BF16 tensors as stored, no
  tokenizer: ``convert_hf_to_gguf.py`` refuses the small BPE's pre-tokenizer), then
  ``llama-quantize bf16.gguf out.gguf Q4_K_M THREADS``, each in its own process; its wall time and peak the two
  together, the convert's and quantize's seconds apart in the last column.

infopt runs with an empty cache folder, as a user's first build of a model does. For each: wall time, the peak
resident memory of the whole process tree (sampled every 0.1 s), the bytes of
the folder's model files (``*.onnx`` and their external data, or the GGUF), their bits per parameter (bytes * 8
over the elements of the checkpoint's safetensors), and infopt's own steps from its manifest.
Then both folders of a precision are timed with ``onnxruntime_genai`` in interleaved rounds, the builder's
given infopt's intra-op thread count (``bench_generation.py``'s harness): TTFT of a 128-token prompt and
TPOT at batch 1 and 8. llama.cpp's GGUF is timed in the same rounds, interleaved with them, through
``llama_cpp.Llama(n_threads=<the same count>)``: TPOT at batch 1 only (a step: one token's ``eval`` and the
argmax of its logits, after a prompt of as many random token ids as the folders get), TTFT and batch 8 left "-".
A build that fails or is killed is a row with its exit status.

    python benchmarks/bench_scale.py [--models qwen2.5-0.5b,qwen2.5-1.5b] [--precisions fp32,int4,int4-calib]
                                     [--rounds 4] [--val held-out|none|FILE] [--llama-cpp DIR]
                                     [--markdown benchmarks/results/scale.md]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_generation import NEW_TOKENS, PROMPT, pct, same_threads, time_round  # noqa: E402
from benchmarks.common import RESULTS, environment, publish  # noqa: E402
from benchmarks.gguf_from_folder import parameter_count  # noqa: E402
from infopt.core.threads import physical_cores  # noqa: E402
from tests.support.checkpoints import CONFIGS, write_checkpoint  # noqa: E402

INFOPT = Path(sys.executable).with_name("infopt")
LLAMA_QUANT = "Q4_K_M"
"""llama.cpp's row: the k-quant its users pick by default"""


def tree_rss(root) -> int:
    """Resident bytes of a process and every descendant."""
    import psutil

    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_measured(command: list[str], limit_s: float, env: dict | None = None) -> dict:
    """Run ``command``: its exit status, wall seconds, the peak RSS of its process tree, the tail of stderr."""
    import psutil

    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(root))
            if time.perf_counter() - start > limit_s:
                proc.send_signal(signal.SIGKILL)
            time.sleep(0.1)
        err.seek(0)
        tail = err.read()[-1500:]
    code = proc.returncode
    return {"code": code, "wall_s": time.perf_counter() - start, "peak_rss": peak,
            "status": "ok" if code == 0 else (f"killed by signal {-code}" if code < 0 else f"exit {code}"), "stderr": tail}


def model_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data") or p.name.endswith(".onnx.data"))


def infopt_steps(out: Path) -> str:
    """The build's longest steps, from its manifest."""
    try:
        steps = json.loads((out / "manifest.json").read_text())["timings"]["steps"]
    except (OSError, KeyError, ValueError):
        return "-"
    seconds: dict[str, float] = {}
    for step in steps:
        seconds[step["step"]] = seconds.get(step["step"], 0.0) + step["seconds"]
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.0f} s" for k, v in ranked[:5])


JUDGING_STEPS = ("reference", "validation", "latency", "curve")
"""the steps that judge and time the build (the issue's goal: at most a quarter of it)"""


def judging_share(out: Path) -> str:
    """What the judging steps took of the build, from its manifest: ``31 of 86 s (36 %)``."""
    try:
        timings = json.loads((out / "manifest.json").read_text())["timings"]
    except (OSError, KeyError, ValueError):
        return "-"
    judged = sum(s["seconds"] for s in timings["steps"] if s["step"] in JUDGING_STEPS)
    return f"{judged:.0f} of {timings['total_s']:.0f} s ({judged / timings['total_s']:.0%})"


def _six_to_a_line(path: Path, start: int, stop: int | None) -> Path:
    """``path`` written with the test sentences ``start:stop``, six to a line."""
    sentences = [s.strip() for s in (ROOT / "tests" / "data" / "sentences.txt").read_text().splitlines() if s.strip()]
    chosen = sentences[start:stop]
    path.write_text("\n".join(" ".join(chosen[i:i + 6]) for i in range(0, len(chosen), 6)) + "\n")
    return path


def held_out_text(path: Path) -> Path:
    """``path`` written with the first 240 test sentences six to a line: 40 lines of 162-345 tokens through the
    tokenizer ``tokenizer_for`` trains on them, each longer than the judging's 128-token cut."""
    return _six_to_a_line(path, 0, 240)


def calibration_text(path: Path) -> Path:
    """``path`` written with the test sentences after those of ``held_out_text``, six to a line."""
    return _six_to_a_line(path, 240, None)


def build(model: Path, work: Path, tool: str, precision: str, limit_s: float, val: Path | None = None) -> dict:
    out = work / f"{tool}-{precision}"
    if tool == "infopt":
        command = [str(INFOPT), "build", str(model), "--task", "text-generation", "-o", str(out), "-q", "--force"]
        command += ["--val", str(val)] if val is not None else []
        if precision.startswith("int4"):
            command += ["--int4", "--max-drift", "top1=0,ppl_delta=100"]
        if precision == "int4-calib":
            command += ["--calib", str(calibration_text(work / "calib.txt"))]
        folder = out / "servers" / "onnxruntime-genai"
    else:
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(work / "hf-cache")]
        folder = out
    print(f"building {tool} {precision} of {model.name}", flush=True)
    # every build starts with nothing left to write back: the checkpoint just written, or the build before's GBs
    # of output, flushed to disk during the next build slowed it (the first build, infopt's fp32 at 0.5B, took 37 s where
    # the same build by hand took 27-31 s)
    os.sync()
    # infopt's cache folder empty, as on a user's first build of the model (a rebuild reuses the ONNX export)
    row = run_measured(command, limit_s, {**os.environ, "INFOPT_CACHE_DIR": str(work / f"cache-{precision}")})
    row.update({"tool": tool, "precision": precision, "folder": folder if row["code"] == 0 else None,
                "bytes": model_bytes(folder) if row["code"] == 0 else None,
                "steps": f"{infopt_steps(out)}; judging {judging_share(out)}" if tool == "infopt" else "-"})
    print(f"  {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.1f} GB", flush=True)
    return row


def llama_cpp_build(model: Path, work: Path, llama_dir: Path, limit_s: float) -> dict:
    """llama.cpp's Q4_K_M of ``model`` (the module doc): the BF16 GGUF written by ``gguf_from_folder.py``, then
    ``llama-quantize`` with the folders' thread count, each timed in its own process; the BF16 GGUF removed."""
    quantize = llama_dir / "build" / "bin" / "llama-quantize"
    if not quantize.is_file():
        raise SystemExit(f"llama.cpp's llama-quantize is not built: {quantize} (run benchmarks/install_llama_cpp.sh, "
                         "then pass --llama-cpp DIR)")
    full, out = work / f"{model.name}-bf16.gguf", work / f"llama.cpp-{LLAMA_QUANT}.gguf"
    env = {**os.environ, "LLAMA_CPP_DIR": str(llama_dir)}
    print(f"building llama.cpp {LLAMA_QUANT} of {model.name}", flush=True)
    os.sync()
    row = run_measured([sys.executable, str(ROOT / "benchmarks" / "gguf_from_folder.py"), str(model), str(full)],
                       limit_s, env)
    steps = f"convert {row['wall_s']:.0f} s (gguf_from_folder.py, BF16)"
    if row["code"] == 0:
        os.sync()
        done = run_measured([str(quantize), str(full), str(out), LLAMA_QUANT, str(physical_cores())], limit_s, env)
        steps += f", quantize {done['wall_s']:.0f} s"
        row.update(code=done["code"], status=done["status"], stderr=done["stderr"], wall_s=row["wall_s"] + done["wall_s"],
                   peak_rss=max(row["peak_rss"], done["peak_rss"]))
    full.unlink(missing_ok=True)
    ok = row["code"] == 0
    row.update({"tool": "llama.cpp", "precision": LLAMA_QUANT, "folder": None, "gguf": out if ok else None,
                "bytes": out.stat().st_size if ok else None, "steps": steps})
    print(f"  {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.1f} GB", flush=True)
    return row


def llama_cpp_round(llm, vocab: int, rng) -> list[float]:
    """One round of a GGUF at batch 1, as ``time_round``'s: a PROMPT-token prompt of random ids, then the seconds
    of each of NEW_TOKENS - 1 greedy steps (the token's ``eval`` and the argmax of its logits)."""
    import numpy as np

    llm.reset()
    llm.eval(rng.integers(1, vocab, PROMPT).tolist())
    token, seconds = int(np.argmax(llm.scores[llm.n_tokens - 1])), []
    for _ in range(NEW_TOKENS - 1):
        start = time.perf_counter()
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        seconds.append(time.perf_counter() - start)
    return seconds


def timed(rows: list[dict], work: Path, rounds: int, vocab: int) -> None:
    """TTFT and TPOT p50 of each built folder, the builder's with infopt's thread count; TPOT at batch 1 of each
    GGUF, with the same thread count, in the same interleaved rounds."""
    import numpy as np
    import onnxruntime_genai as og

    built = {f"{r['tool']} {r['precision']}": r for r in rows if r["folder"] is not None}
    folders = same_threads({label: r["folder"] for label, r in built.items()}, work)
    models = {label: og.Model(str(folders[f"{label}, same threads" if label.startswith("builder") else label]))
              for label in built}
    ggufs = {f"{r['tool']} {r['precision']}": r for r in rows if r.get("gguf") is not None}
    if ggufs:
        import llama_cpp

        llms = {label: llama_cpp.Llama(str(r["gguf"]), n_ctx=PROMPT + NEW_TOKENS, n_threads=physical_cores(),
                                       verbose=False) for label, r in ggufs.items()}
    else:
        llms = {}
    times = {label: {"ttft": [], "tpot1": [], "tpot8": []} for label in [*models, *llms]}
    rng = np.random.default_rng(0)
    for model in models.values():
        time_round(og, model, vocab, rng)
    for llm in llms.values():
        llama_cpp_round(llm, vocab, rng)
    for _ in range(rounds):
        for label, model in models.items():
            for key, values in time_round(og, model, vocab, rng).items():
                times[label][key] += values
        for label, llm in llms.items():
            times[label]["tpot1"] += llama_cpp_round(llm, vocab, rng)
    for label, r in built.items():
        r.update({key: pct(times[label][key])[0] for key in ("ttft", "tpot1", "tpot8")})
    for label, r in ggufs.items():
        r["tpot1"] = pct(times[label]["tpot1"])[0]
    del models
    for llm in llms.values():
        llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--tools", default="infopt,builder")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--limit-s", type=float, default=3600.0, help="a build running longer is killed")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "scale.md")
    parser.add_argument("--llama-cpp", type=Path, default=os.environ.get("LLAMA_CPP_DIR"),
                        help="llama.cpp's source tree with llama-quantize built (benchmarks/install_llama_cpp.sh), for "
                             f"a llama.cpp {LLAMA_QUANT} row per model")
    parser.add_argument("--val", default="held-out", help="infopt's --val: a .txt file, 'held-out' (the test "
                                                           "sentences, 40 lines of 162-345 tokens) or 'none'")
    args = parser.parse_args()
    from tests.support.decoders import tokenizer_for

    lines = ["| model | checkpoint | build | status | wall s | peak RSS GB | RSS / checkpoint | output MB | "
             "bits / param | TTFT ms | TPOT b1 ms | TPOT b8 ms | steps (infopt's longest; llama.cpp's two) |",
             "|" + " --- |" * 13]
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-scale-{name}-") as tmp:
            work = Path(tmp)
            model = work / name
            weights = write_checkpoint(CONFIGS[name], model)
            tokenizer_for(model)
            val = (None if args.val == "none" else held_out_text(work / "held-out.txt") if args.val == "held-out"
                   else Path(args.val).absolute())
            rows = [build(model, work, tool, precision, args.limit_s, val)
                    for precision in args.precisions.split(",") for tool in args.tools.split(",")
                    if not (tool == "builder" and precision == "int4-calib")]
            if args.llama_cpp is not None:
                rows.append(llama_cpp_build(model, work, args.llama_cpp, args.limit_s))
            params = parameter_count(model)
            timed(rows, work, args.rounds, CONFIGS[name]["vocab_size"])
            for r in rows:
                lines.append(
                    f"| {name} | {weights / 1e9:.2f} GB bf16 | {r['tool']} {r['precision']} | {r['status']} | "
                    f"{r['wall_s']:.0f} | {r['peak_rss'] / 1e9:.1f} | {r['peak_rss'] / weights:.1f}x | "
                    + (f"{r['bytes'] / 1e6:.0f} | {r['bytes'] * 8 / params:.2f}" if r["bytes"] else "- | -") + " | "
                    + " | ".join(f"{r[k]:.1f}" if k in r else "-" for k in ("ttft", "tpot1", "tpot8"))
                    + f" | {r['steps']} |")
                if r["code"] != 0:
                    print(f"{r['tool']} {r['precision']} {r['status']}:\n{r['stderr']}", flush=True)
    text = "\n".join(["## Real sizes: text-generation builds against ONNX Runtime GenAI's builder (CPU)", "",
                      f"`python benchmarks/bench_scale.py` (infopt's --val: {args.val})", "", *lines, "",
                      *(f"- {line}" for line in environment())])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
