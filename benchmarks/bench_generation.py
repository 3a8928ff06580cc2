"""Text generation on the CPU: infopt's ONNX Runtime GenAI folders against the ones ONNX Runtime GenAI's own
model builder writes for the same model folder, and against transformers' eager ``generate``.

Two models, both saved with ``save_pretrained`` beside a byte-level BPE tokenizer:

- speed: a Llama with SmolLM-135M's widths (hidden 576, 9 heads, 3 KV heads, MLP 1536, vocab 49152) and
  6 of its 30 layers, random weights;
- accuracy: the small Llama the tests train on the test sentences (``tests/e2e/test_text_generation_quantized.py``),
  judged on the held-out sentences: top-1 agreement with the FP32 model under teacher forcing, and perplexity.

Folders: ``infopt build FOLDER --task text-generation`` (fp32) and ``--int4`` (RTN, no calibration, as the
builder's int4 is), and ``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32|int4 -e cpu``.
infopt's folders declare the machine's cores as the decoder's intra-op threads; the builder's leave the
count to ONNX Runtime GenAI. So the builder's folders are timed twice: as written, and given the same
thread count in their ``genai_config.json`` ("same threads"), which isolates what the graphs themselves
do.
Each is timed with ``onnxruntime_genai`` in the same harness, in interleaved rounds: TTFT (the prompt's pass,
batch 1) and TPOT (each further token; batch 1 and 8) as p50/p90/p99 over every step of every round.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, environment  # noqa: E402
from infopt.core.threads import physical_cores  # noqa: E402
from infopt.validators.generation import new_generator  # noqa: E402

PROMPT, NEW_TOKENS, TTFT_PROMPT = 32, 32, 128


def speed_model(folder: Path) -> Path:
    import torch
    import transformers

    from tests.support.decoders import tokenizer_for

    path = folder / "smollm-widths-6-layers"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=6,
                                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    tokenizer_for(path)
    return path


def accuracy_model(folder: Path) -> tuple[Path, list[str], Path]:
    """The trained LM, its held-out sentences, and its training text as a calibration file."""
    from tests.support.decoders import SENTENCES, TRAIN_LINES, train_lm

    train_lm(folder / "trained-llama")
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    (folder / "calib.txt").write_text("\n".join(lines[:TRAIN_LINES]) + "\n")
    return folder / "trained-llama", lines[TRAIN_LINES:], folder / "calib.txt"


def build_folders(model: Path, work: Path, calib: Path | None = None) -> dict[str, Path]:
    """label -> the GenAI folder; build seconds printed. With ``calib``, an INT4 GPTQ folder too."""
    infopt = Path(sys.executable).with_name("infopt")
    jobs = {
        "infopt fp32": [str(infopt), "build", str(model), "--task", "text-generation", "-o", str(work / "infopt-fp32"),
                        "-q", "--force"],
        # no budget: random weights' top-1 is a coin toss; this script measures agreement itself
        "infopt int4": [str(infopt), "build", str(model), "--task", "text-generation", "--int4", "--max-drift",
                        "top1=0,ppl_delta=1", "-o", str(work / "infopt-int4"), "-q", "--force"],
        "builder fp32": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model),
                         "-o", str(work / "builder-fp32"), "-p", "fp32", "-e", "cpu", "-c", str(work / "hf-cache")],
        "builder int4": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model),
                         "-o", str(work / "builder-int4"), "-p", "int4", "-e", "cpu", "-c", str(work / "hf-cache")],
    }
    if calib is not None:
        jobs["infopt int4 GPTQ"] = [str(infopt), "build", str(model), "--task", "text-generation", "--int4", "--calib",
                                    str(calib), "--max-drift", "top1=0,ppl_delta=1", "-o", str(work / "infopt-gptq"),
                                    "-q", "--force"]
    folders = {}
    for label, command in jobs.items():
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
        out = Path(command[command.index("-o") + 1])
        folders[label] = out / "servers" / "onnxruntime-genai" if label.startswith("infopt") else out
        print(f"built {label} in {time.perf_counter() - start:.1f} s", flush=True)
    return folders


def same_threads(folders: dict[str, Path], work: Path) -> dict[str, Path]:
    """The builder's folders again, with the intra-op thread count infopt's folders declare."""
    out = dict(folders)
    for label in [label for label in folders if label.startswith("builder")]:
        copy = work / f"{label.replace(' ', '-')}-same-threads"
        shutil.rmtree(copy, ignore_errors=True)  # a run before in the same work folder left its copy
        shutil.copytree(folders[label], copy)
        config = json.loads((copy / "genai_config.json").read_text())
        config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = physical_cores()
        (copy / "genai_config.json").write_text(json.dumps(config, indent=2))
        out[f"{label}, same threads"] = copy
    return out


def time_round(og, model, vocab: int, rng) -> dict[str, list[float]]:
    """One round: every decode step at batch 1 and 8, then TTFT of a TTFT_PROMPT prompt (seconds). TTFT comes
    last: right after another model's run, the first pass of this one measured 96 ms where it measures 63 ms
    once this model has run (on every folder alike; the other session's threads still hold the cores)."""
    out: dict[str, list[float]] = {"ttft": [], "tpot1": [], "tpot8": []}
    for batch in (1, 8):
        ids = rng.integers(1, vocab, size=(batch, PROMPT)).astype(np.int32)
        generator = new_generator(og, model, ids, NEW_TOKENS)
        generator.append_tokens(ids)
        generator.generate_next_token()
        while not generator.is_done():
            start = time.perf_counter()
            generator.generate_next_token()
            out[f"tpot{batch}"].append(time.perf_counter() - start)
    ids = rng.integers(1, vocab, size=(1, TTFT_PROMPT)).astype(np.int32)
    generator = new_generator(og, model, ids, 1)
    start = time.perf_counter()
    generator.append_tokens(ids)
    out["ttft"].append(time.perf_counter() - start)
    return out


def eager_tpot(model_dir: Path, rounds: int) -> list[float]:
    """Per-token seconds of transformers' ``generate`` at batch 1 (after a PROMPT-token prompt): the time of
    NEW_TOKENS tokens less that of one, over NEW_TOKENS - 1, per round."""
    import torch
    import transformers

    lm = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.randint(1, lm.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))

    def run(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                        min_new_tokens=n, pad_token_id=0)
        return time.perf_counter() - start

    run(NEW_TOKENS)
    return [(run(NEW_TOKENS) - run(1)) / (NEW_TOKENS - 1) for _ in range(rounds)]


def pct(values: list[float]) -> tuple[float, float, float]:
    ms = np.asarray(values) * 1e3
    return tuple(float(np.percentile(ms, q)) for q in (50, 90, 99))


def accuracy(folders: dict[str, Path], model_dir: Path, held_out: list[str]) -> list[list[str]]:
    import transformers

    from infopt.validators.generation import agreement, eager_logits, teacher_forced

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    sequences = [ids[:127] for ids in (tokenizer(line)["input_ids"] for line in held_out) if len(ids) > 1]
    lm = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    reference = eager_logits(lm, sequences)
    rows = []
    for label, folder in folders.items():
        found = agreement(reference, teacher_forced(folder, sequences), sequences)
        rows.append([label, f"{found['top1']:.4f}", f"{found['ppl']:.3f}", f"{found['ppl_reference']:.3f}",
                     f"{found['ppl_delta']:+.2%}", str(found["tokens"])])
    return rows


def main() -> None:
    import argparse

    import onnxruntime_genai as og

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="2 rounds, nothing written")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "generation.md")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        work = Path(tmp)
        model_dir = speed_model(work)
        folders = same_threads(build_folders(model_dir, work / "speed"), work / "speed")
        models = {label: og.Model(str(folder)) for label, folder in folders.items()}
        times = {label: {"ttft": [], "tpot1": [], "tpot8": []} for label in folders}
        rng = np.random.default_rng(0)
        for label, model in models.items():  # warm-up
            time_round(og, model, 49152, rng)
        for number in range(rounds):
            for label, model in models.items():
                for key, values in time_round(og, model, 49152, rng).items():
                    times[label][key] += values
            print(f"round {number + 1}/{rounds}", flush=True)
        eager = eager_tpot(model_dir, rounds)
        trained_dir, held_out, calib = accuracy_model(work)
        accuracy_rows = accuracy(build_folders(trained_dir, work / "accuracy", calib), trained_dir, held_out)

    rows = []

    def p50s(label: str) -> dict[str, float]:
        return {key: pct(times[label][key])[0] for key in ("ttft", "tpot1", "tpot8")}

    def ratios(base: dict[str, float], t: dict) -> list[str]:
        return [f"{base['tpot1'] / t['tpot1'][0]:.2f}x", f"{base['tpot8'] / t['tpot8'][0]:.2f}x",
                f"{base['ttft'] / t['ttft'][0]:.2f}x"]

    for label in folders:
        t = {key: pct(times[label][key]) for key in ("ttft", "tpot1", "tpot8")}
        precision = "int4" if "int4" in label else "fp32"
        rows.append([label, *(f"{v:.2f}" for v in t["ttft"]), *(f"{v:.2f}" for v in t["tpot1"]),
                     f"{1e3 / t['tpot1'][0]:.1f}", *(f"{v:.2f}" for v in t["tpot8"]), f"{8e3 / t['tpot8'][0]:.1f}",
                     *ratios(p50s(f"builder {precision}"), t), *ratios(p50s(f"builder {precision}, same threads"), t),
                     f"{pct(eager)[0] / t['tpot1'][0]:.2f}x"])
    e = pct(eager)
    rows.append(["transformers generate fp32", "-", "-", "-", *(f"{v:.2f}" for v in e), f"{1e3 / e[0]:.1f}",
                 "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "1.00x"])
    speed_header = ["folder", "TTFT p50 ms", "p90", "p99", "TPOT b1 p50 ms", "p90", "p99", "tokens/s b1",
                    "TPOT b8 p50 ms", "p90", "p99", "tokens/s b8", "decode b1 vs builder (same precision, as written)",
                    "decode b8 vs builder", "TTFT vs builder", "decode b1 vs builder, same threads",
                    "decode b8, same threads", "TTFT, same threads", "decode b1 vs eager generate"]
    accuracy_header = ["folder", "top-1 agreement with FP32", "perplexity", "FP32 perplexity", "ppl change", "tokens"]
    lines = ["## Text generation: infopt's GenAI folders against ONNX Runtime GenAI's model builder (CPU)", "",
             "`python benchmarks/bench_generation.py`", "",
             f"Speed: a Llama with SmolLM-135M's widths and 6 layers (random weights); TTFT of a {TTFT_PROMPT}-token "
             f"prompt at batch 1; TPOT over {NEW_TOKENS - 1} decode steps after a {PROMPT}-token prompt; {rounds} "
             f"interleaved rounds; ratios are p50 against p50 (above 1: infopt faster). infopt's folders declare "
             f"{physical_cores()} intra-op threads (the machine's cores); the builder's are timed as written and with the "
             "same thread count.", "",
             _table(speed_header, rows), "",
             "Accuracy: the small Llama trained on the test sentences, teacher-forced on the 40 held-out sentences; "
             "INT4 is RTN in both tools (infopt: group 128, each group's range clipped where that rounds with less "
             "error; the builder: block 32, symmetric), and infopt's GPTQ calibrates on the training sentences.", "",
             _table(accuracy_header, accuracy_rows), "", *(f"- {line}" for line in environment()),
             f"- onnxruntime-genai {og.__version__ if hasattr(og, '__version__') else ''}".rstrip()]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        args.markdown.write_text(text)


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


if __name__ == "__main__":
    main()
