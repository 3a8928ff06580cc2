"""``infopt build FOLDER --task text-generation``: a causal LM as a generator serves it.

The decoder is captured with its KV cache (``exporters/kv_decoder.py``), lowered to ONNX with the
same exporter as every ONNX build, and written as an ONNX Runtime GenAI folder
(``exporters/servers/onnxruntime_genai.py``). That folder is what is judged: ``onnxruntime_genai``
generates from it, and its greedy tokens must equal transformers' ``generate`` on the same prompts,
every token (prompts from ``--val`` text through the folder's tokenizer, else seeded random token ids,
flagged). Then time to first token and time per output token are measured from the same folder.

The output folder is an ordinary infopt output: ``manifest.json`` (typed as every build's, the
generation figures under ``validation.generation``), the reports, ``model/model.onnx`` (the
decoder), and ``servers/onnxruntime-genai/``. This first form builds fp32 for the CPU.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from infopt.api import provenance
from infopt.api.builder import BuildResult
from infopt.api.emit import base_manifest, source_info, write_output
from infopt.api.provenance import call_text
from infopt.core.errors import BuildError, EnvironmentProblem, UsageError, ValidationFailed, first_line
from infopt.core.inputspec import DimRange, InputSpec
from infopt.core.lineage import PassRecord
from infopt.core.manifest import data_sha256
from infopt.core.recipe import Recipe
from infopt.core.step_times import StepTimes
from infopt.core.target import get_target
from infopt.exporters import kv_decoder
from infopt.exporters.servers import onnxruntime_genai as genai
from infopt.exporters.staging import claim_output, staged_output
from infopt.passes.lower.onnx_export import export_onnx
from infopt.runtime.loading import load_model
from infopt.validators import generation

TASK = "text-generation"
PROMPTS = 4
"""prompts the greedy check generates from"""
NEW_TOKENS = 16
"""tokens generated per prompt by the greedy check and the TPOT timing"""
PROMPT_TOKENS = 32
"""the longest prompt the greedy check takes from --val text (longer lines are cut)"""
TTFT_PROMPTS = (32, 128, 512)
"""prompt lengths TTFT is timed at (those the model's context holds)"""
TPOT_BATCHES = (1, 4, 8)
CONTEXT_DEFAULT = 2048
"""the context length written to genai_config.json when the model's config gives none (the most it says, else)"""


def build_generation(model: str | Path, *, output: str | Path | None = None, name: str | None = None,
                     force: bool = False, val: str | Path | None = None, precision: str = "fp32",
                     target: str = "cpu", command: list[str] | None = None, console: Any = None) -> BuildResult:
    """Build the text-generation deployable of a causal LM."""
    if precision != "fp32" or target != "cpu":
        raise UsageError(f"--task {TASK} builds fp32 for the cpu target so far; asked {precision} for {target}",
                         fix=f"drop the precision flag and --target, or build --task logits for {precision}")
    try:
        import onnxruntime_genai  # noqa: F401 - the folder's consumer, which judges the build
    except ImportError as exc:
        raise EnvironmentProblem(f"--task {TASK} judges its folder by generating from it with onnxruntime_genai, "
                                 "which is not installed", fix="pip install 'infopt[llm]'") from exc
    times = StepTimes()
    say = (lambda text: console.print(f"[dim]{text}[/dim]")) if console is not None else (lambda text: None)
    with times.step("load"):
        loaded = load_model(model)
    task = getattr(loaded.task, "name", None)
    if loaded.format != "hf-folder" or task != "causal-lm":
        raise UsageError(f"--task {TASK} needs a Hugging Face causal LM (a *ForCausalLM folder or hub id); "
                         f"{model} is {'a ' + task + ' model' if task else 'not a Hugging Face folder'}",
                         where=str(model), fix="build it without --task, or pass a causal LM's folder")
    folder = Path(loaded.source)
    if not genai.has_tokenizer(folder):
        raise UsageError(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model); the ONNX Runtime GenAI "
                         "folder needs the model's own", where=str(folder),
                         fix="save the tokenizer beside the model (tokenizer.save_pretrained(FOLDER))")
    lm = loaded.module.model.float().eval()
    name = name or loaded.name or folder.name
    out = Path(output).absolute() if output else (Path("dist") / name).absolute()
    call = call_text(model, {"task": TASK})
    with claim_output(out, force), tempfile.TemporaryDirectory(prefix="infopt-generation-") as work:
        work = Path(work)
        say("capturing the decoder with its KV cache (torch.export)")
        start = time.perf_counter()
        layout = kv_decoder.cache_layout(lm)
        program = kv_decoder.capture(lm, layout)
        captured = PassRecord("capture_kv_decoder", "torch", "exported", time.perf_counter() - start, None, True,
                              notes=[f"{layout.layers} layers, {layout.kv_heads} KV heads of {layout.head_size}; "
                                     "past length dynamic from 0"])
        say("exporting to ONNX")
        start = time.perf_counter()
        onnx_file = work / "onnx" / "model.onnx"
        onnx_file.parent.mkdir()
        export_onnx(program, onnx_file, layout.input_names(), layout.output_names())
        kv_decoder.name_dims(onnx_file, layout)
        exported = PassRecord("onnx_export", "exported", "onnx", time.perf_counter() - start,
                              sum(p.stat().st_size for p in onnx_file.parent.iterdir()), True, notes=["opset 20"])
        passes = [captured, exported]
        for record, step in ((captured, "capture"), (exported, "onnx_export")):
            times.add(step, record.seconds)
        context = _context_length(lm.config)
        config = genai.genai_config(lm.config, layout, context, folder)
        prepared = genai.write_folder(work / "genai", onnx_file, config, folder)
        prompts, source = _prompts(val, folder, layout.vocab, _special(config))
        with times.step("validation"):
            say(f"generating {NEW_TOKENS} tokens from {len(prompts)} prompts with onnxruntime_genai and transformers")
            try:
                greedy = generation.greedy_check(prepared, lm, prompts, NEW_TOKENS)
            except RuntimeError as exc:  # onnxruntime_genai's errors are RuntimeErrors
                raise BuildError(f"onnxruntime_genai could not generate from the folder: {first_line(exc)}",
                                 where=str(folder), fix="report the model's family; build --task logits meanwhile") from exc
        if greedy["equal"] != greedy["prompts"]:
            first = greedy["differences"][0]
            raise ValidationFailed(f"the ONNX Runtime GenAI folder's greedy tokens differ from transformers' generate "
                                   f"on {greedy['prompts'] - greedy['equal']} of {greedy['prompts']} prompts (prompt "
                                   f"{first['prompt']} first differs at token {first['at_token']})",
                                   fix="report the model's family; build --task logits meanwhile")
        with times.step("latency"):
            say("timing TTFT and TPOT")
            lengths = [n for n in TTFT_PROMPTS if n + NEW_TOKENS <= context] or [max(1, context - NEW_TOKENS)]
            timing = generation.time_generation(prepared, layout.vocab, lengths, list(TPOT_BATCHES), NEW_TOKENS)
        spec = _spec(layout, context)
        origin = {**source_info(folder, "hf-folder"), "task": {"name": TASK, "judged_by": "greedy tokens equal"}}
        if loaded.hub is not None:
            origin["hub"] = loaded.hub.to_json()
        weights = sum(p.numel() * p.element_size() for p in lm.parameters())
        validation = {"device": "cpu (onnxruntime_genai, CPU)", "runs_on": "cpu",
                      "notes": [f"greedy tokens of {len(prompts)} prompts from {source}, {NEW_TOKENS} each, "
                                "compared with transformers' generate"],
                      "generation": {"greedy": greedy, **timing, "weights_bytes": weights,
                                     "kv_cache_bytes_per_token": layout.kv_bytes_per_token()},
                      "verdict": {"passed": True, "reasons": [], "checks": [
                          {"name": "greedy_tokens_equal", "measured": greedy["equal"], "limit": greedy["prompts"],
                           "passed": True}]}}
        recipe = Recipe(name="fp32-onnxruntime-genai", precision="fp32", backend="onnxruntime", passes=[],
                        description="the decoder with its KV cache, for ONNX Runtime GenAI", emit=["onnxruntime-genai"])
        record = provenance.record(command, call, recipe.name, None,
                                   {"source": source, "samples": len(prompts),
                                    "sha256": data_sha256({"input_ids": np.asarray(p)} for p in prompts)})
        with staged_output(out, force) as stage:
            manifest = base_manifest(name, origin, get_target(target), recipe, spec,
                                     _outputs(layout), passes, validation,
                                     candidates=[], selection="one candidate: the decoder for ONNX Runtime GenAI",
                                     provenance=record)
            typed = write_output(stage, manifest, onnx_file, spec, "cpu", recipe.emit,
                                 products={genai.PRODUCT: prepared}, times=times)
    return BuildResult(name, out, typed, out / typed.artifacts.get("onnxruntime-genai"))


def _context_length(config) -> int:
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return min(value, CONTEXT_DEFAULT)
    return CONTEXT_DEFAULT


def _outputs(layout: kv_decoder.CacheLayout) -> list[tuple[str, str, tuple]]:
    cache = ("batch_size", layout.kv_heads, "total_sequence_length", layout.head_size)
    return [("logits", "float32", ("batch_size", "sequence_length", layout.vocab)),
            *((name, "float32", cache) for name in layout.output_names()[1:])]


def _spec(layout: kv_decoder.CacheLayout, context: int) -> InputSpec:
    cache = f"float32[batch_size,{layout.kv_heads},past_sequence_length,{layout.head_size}]"
    spec = InputSpec.parse(["input_ids:int64[batch_size,sequence_length]",
                            "attention_mask:int64[batch_size,total_sequence_length]",
                            *(f"{n}:{cache}" for n in layout.input_names()[2:])])
    return spec.with_dims({"batch_size": DimRange(1, 1, 64), "sequence_length": DimRange(1, 1, context),
                           "total_sequence_length": DimRange(1, min(128, context), context),
                           "past_sequence_length": DimRange(1, min(128, context), context)})


def _special(config: dict) -> set[int]:
    """The bos, eos and pad ids of ``genai_config.json``: ONNX Runtime GenAI masks a prompt's pad tokens out."""
    ids = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config["model"][key]
        ids.update(value if isinstance(value, list) else [value])
    return ids


def _prompts(val: str | Path | None, folder: Path, vocab: int, special: set[int]) -> tuple[list[list[int]], str]:
    """Prompts for the greedy check: --val text lines through the folder's tokenizer, else random ids
    (none of them a special token)."""
    if val is None:
        rng = np.random.default_rng(0)
        choices = np.asarray([i for i in range(vocab) if i not in special])
        return [rng.choice(choices, size=8).tolist() for _ in range(PROMPTS)], "random token ids (no --val)"
    path = Path(val)
    if path.suffix.lower() != ".txt" or not path.is_file():
        raise UsageError(f"--val for --task {TASK} is a text file of prompts, one per line; got {val}",
                         where=str(val), fix="pass a .txt file")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = [ids[:PROMPT_TOKENS] for ids in (tokenizer(line)["input_ids"] for line in lines) if ids][:PROMPTS]
    if not prompts:
        raise UsageError(f"{val} gives no prompt: no line tokenizes to anything", where=str(val),
                         fix="pass a text file with one prompt per line")
    return prompts, str(val)

