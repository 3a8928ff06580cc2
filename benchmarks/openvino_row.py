"""OpenVINO's own weight compression of a Hugging Face folder, as its users run it, for ``bench_real_llm.py``'s
``openvino`` rows.

    python benchmarks/openvino_row.py build SOURCE OUT --bits 4 --ratio 0.8 --calib calib.txt
    python benchmarks/openvino_row.py judge OUT --windows windows.json --logits DIR
    python benchmarks/openvino_row.py tpot OUT --rounds 3 --seconds tpot.json

``build`` is what an optimum-intel user writes: ``OVModelForCausalLM.from_pretrained(SOURCE, export=True,
quantization_config=OVWeightQuantizationConfig(...))``, then ``save_pretrained``. INT8 is NNCF's data-free default
(asymmetric, per channel); INT4 is INT4_ASYM at group size 128 with AWQ and scale estimation on every line of the
calibration text (``num_samples`` all of them), ``ratio`` of the ratio-defining layers in 4 bits and the rest, as
NNCF chooses them from the data, in INT8_ASYM. SmolLM2's 576-wide rows do not divide by 128: NNCF refuses them
unless told ``group_size_fallback="adjust"``, which puts them in group 64, as optimum-intel's own configurations
of small models do.

``judge`` writes each window's logits (``OVModelForCausalLM(input_ids=...).logits``, from an empty state) for the
parent to turn into figures with ``tests/support/real_llm.py``'s machinery, and the greedy tokens from optimum-intel's
``generate`` under the configuration ``generate_eager`` gives the reference. ``tpot`` times greedy decode steps at
batch 1 as ``llama_cpp_row.tpot`` does. Both run with ``ov_config={"INFERENCE_NUM_THREADS": "2"}`` and OpenVINO's
other defaults, as a user gets them (on a CPU with AMX: bf16 inference, a u8 KV cache, activations quantized
dynamically in groups of 32); ``judge`` records them in ``runtime.json``.

The modes (the functions ``quantize``, ``judge_here``, ``tpot_here``) run in a virtualenv of their own
(``benchmarks/install_openvino.sh``: optimum-intel pins a transformers the project's is past), whose python
``--openvino-python PATH`` (or ``OPENVINO_PYTHON``) names; the functions ``build``, ``judge`` and ``tpot`` are the
bench's side, each running one mode there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

THREADS = 2
OV_CONFIG = {"INFERENCE_NUM_THREADS": str(THREADS)}
SCRIPT = Path(__file__).resolve()
RUNTIME = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "INFERENCE_NUM_THREADS")


def child_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def run_child(python: Path, *args: str) -> None:
    """One mode in the OpenVINO virtualenv; its stderr's tail in the error where it fails."""
    done = subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True, env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"openvino_row.py {args[0]} failed ({done.returncode}):\n{done.stderr[-1500:]}")


def build(python: Path, folder: Path, out: Path, args: list[str], limit_s: float) -> dict:
    """``out`` (an OpenVINO IR folder) of ``folder`` with ``args`` (``--bits``, ``--ratio``, ``--calib``): the build's
    exit status, wall seconds and peak RSS, as ``run_measured`` gives them."""
    from benchmarks.bench_scale import run_measured

    return run_measured([str(python), str(SCRIPT), "build", str(folder), str(out), *args], limit_s, child_env())


def files_bytes(out: Path) -> int:
    """The IR's bytes: ``openvino_model.xml`` and its weights, ``openvino_model.bin``."""
    return sum(p.stat().st_size for p in out.glob("openvino_model.*") if p.suffix in (".xml", ".bin"))


def judge(python: Path, out: Path, sequences: list[list[int]], reference, work: Path) -> dict:
    """The IR judged as ``judge_gguf`` judges a GGUF: its logits on the same token ids, their figures computed here
    (``infopt.validators.generation.figures``), against the reference with ``figures_against``; and ``runtime``,
    the properties OpenVINO compiled it with."""
    from infopt.validators.generation import figures
    from tests.support.real_llm import figures_against

    windows, logits = work / "windows.json", out / "logits"
    windows.write_text(json.dumps(sequences))
    run_child(python, "judge", str(out), "--windows", str(windows), "--logits", str(logits))
    top1, nll = [], []
    for i, window in enumerate(sequences):
        path = logits / f"{i}.npy"
        got = figures(np.load(path), window)
        path.unlink()
        top1.append(got[0])
        nll.append(got[1])
    greedy = np.load(logits / "greedy.npy").tolist()
    return {**figures_against(reference, top1, nll, greedy),
            "runtime": json.loads((logits / "runtime.json").read_text())}


def tpot(python: Path, out: Path, rounds: int) -> list[float]:
    """Seconds of each greedy decode step at batch 1 (:func:`tpot_here`, in the OpenVINO virtualenv)."""
    seconds = out / "tpot.json"
    run_child(python, "tpot", str(out), "--rounds", str(rounds), "--seconds", str(seconds))
    return json.loads(seconds.read_text())


def quantize(source: Path, out: Path, bits: int, ratio: float, calib: Path | None) -> None:
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

    if bits == 8:
        config = OVWeightQuantizationConfig(bits=8)
    else:
        lines = [line for line in calib.read_text().splitlines() if line.strip()]
        config = OVWeightQuantizationConfig(bits=4, sym=False, group_size=128, group_size_fallback="adjust",
                                            ratio=ratio, quant_method="awq", scale_estimation=True, dataset=lines,
                                            num_samples=len(lines), tokenizer=str(source))
    model = OVModelForCausalLM.from_pretrained(source, export=True, quantization_config=config, compile=False)
    model.save_pretrained(out)


def load(out: Path):
    from optimum.intel import OVModelForCausalLM

    return OVModelForCausalLM.from_pretrained(out, ov_config=OV_CONFIG)


def judge_here(out: Path, windows: Path, logits: Path) -> None:
    import importlib.metadata

    import torch
    from transformers import GenerationConfig

    from tests.support.real_llm import GREEDY, GREEDY_PROMPTS, PROMPT

    sequences = json.loads(windows.read_text())
    model = load(out)
    logits.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for i, window in enumerate(sequences):
            ids = torch.tensor([window])
            np.save(logits / f"{i}.npy", model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float().numpy())
        # as generate_eager: the argmax at every step, the end tokens never picked before GREEDY
        stored = model.generation_config
        greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=GREEDY, min_new_tokens=GREEDY,
                                  bos_token_id=stored.bos_token_id, eos_token_id=stored.eos_token_id,
                                  pad_token_id=model.config.pad_token_id)
        tokens = []
        for window in sequences[:GREEDY_PROMPTS]:
            ids = torch.tensor([window[:PROMPT]])
            tokens.append(model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=greedy)[0, PROMPT:].tolist())
    np.save(logits / "greedy.npy", np.array(tokens))
    compiled = model.request.get_compiled_model()
    runtime = {key: property_text(compiled.get_property(key)) for key in RUNTIME}
    runtime.update({name: importlib.metadata.version(name) for name in ("openvino", "nncf", "optimum-intel")})
    (logits / "runtime.json").write_text(json.dumps(runtime))


def property_text(value) -> str:
    """A compiled model's property as text: an element type by its short name ("bf16", not "<Type: 'bfloat16'>")."""
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)


def tpot_here(out: Path, rounds: int, seconds: Path, prompt: int = 32, new_tokens: int = 64, vocab: int = 49152) -> None:
    """Seconds of each decode step at batch 1 after a ``prompt``-token prompt, over ``rounds`` rounds (the first round
    is a warm-up and not kept): one call of the model on the token before, its state holding the cache, and the argmax."""
    import torch

    model = load(out)
    rng = np.random.default_rng(0)
    kept: list[float] = []
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            done = model(input_ids=torch.tensor([rng.integers(1, vocab, prompt).tolist()]))
            token = int(done.logits[0, -1].argmax())
            for _ in range(new_tokens):
                start = time.perf_counter()
                done = model(input_ids=torch.tensor([[token]]), past_key_values=done.past_key_values)
                token = int(done.logits[0, -1].argmax())
                if round_:
                    kept.append(time.perf_counter() - start)
    seconds.write_text(json.dumps(kept))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build")
    b.add_argument("source", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--bits", type=int, choices=(4, 8), required=True)
    b.add_argument("--ratio", type=float, default=1.0)
    b.add_argument("--calib", type=Path, default=None)
    j = sub.add_parser("judge")
    j.add_argument("out", type=Path)
    j.add_argument("--windows", type=Path, required=True)
    j.add_argument("--logits", type=Path, required=True)
    t = sub.add_parser("tpot")
    t.add_argument("out", type=Path)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--seconds", type=Path, required=True)
    options = parser.parse_args()
    if options.mode == "build":
        if options.bits == 4 and options.calib is None:
            parser.error("--bits 4 is AWQ with scale estimation, which needs --calib")
        quantize(options.source, options.out, options.bits, options.ratio, options.calib)
    elif options.mode == "judge":
        judge_here(options.out, options.windows, options.logits)
    else:
        tpot_here(options.out, options.rounds, options.seconds)


if __name__ == "__main__":
    main()
