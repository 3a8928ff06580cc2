"""``infopt build FOLDER --task text-generation``: a causal LM as a generator serves it.

The decoder is captured with its KV cache (``exporters/kv_decoder.py``), lowered to ONNX with the
same exporter as every ONNX build, and written as an ONNX Runtime GenAI folder
(``exporters/servers/onnxruntime_genai.py``). That folder is what is judged: ``onnxruntime_genai``
generates from it, and its greedy tokens must equal transformers' ``generate`` on the same prompts,
every token (prompts from ``--val`` text through the folder's tokenizer, else seeded random token ids,
flagged). A quantized folder (``--int8``, ``--int4``: ``generation_precision.py``) is judged instead under
teacher forcing on the held-out ``--val`` text: per-token top-1 agreement with the FP32 model and the
perplexity increase, each against its budget (the fp32 build reports the same figures). Then time to
first token and time per output token are measured from the same folder.

The output folder is an ordinary infopt output: ``manifest.json`` (typed as every build's, the
generation figures under ``validation.generation``), the reports, ``model/model.onnx`` (the
decoder), and ``servers/onnxruntime-genai/``. It builds for the CPU.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from infopt.api import generation_precision as quant
from infopt.api import provenance
from infopt.api.build_result import BuildResult
from infopt.api.emit import base_manifest, source_info, write_output
from infopt.api.provenance import call_text
from infopt.core.errors import BuildError, CaptureError, EnvironmentProblem, UsageError, ValidationFailed, first_line
from infopt.core.inputspec import DimRange, InputSpec
from infopt.core.lineage import PassRecord
from infopt.core.logs import quiet_third_party
from infopt.core.manifest import EXTERNAL_DATA_BYTES, data_sha256
from infopt.core.onnx_graph import save_model
from infopt.core.recipe import Recipe
from infopt.core.step_times import StepTimes
from infopt.core.target import get_target
from infopt.core.threads import physical_cores
from infopt.core.work_folders import work_folder
from infopt.exporters import kv_attention, kv_decoder
from infopt.exporters.int4_checkpoint import CHECKPOINT_PRODUCT
from infopt.exporters.servers import onnxruntime_genai as genai
from infopt.exporters.staging import claim_output, staged_output
from infopt.passes.lower.onnx_export import export_onnx
from infopt.passes.onnx import decoder_plumbing, fuse_matmuls, transformer_fusion
from infopt.passes.onnx.checks import onnxruntime_refuses
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
INT4_ACCURACY_LEVEL = 4
"""MatMulNBits' accuracy_level for --int4: 4 quantizes the activations to int8 per block inside the op, which
ONNX Runtime's CPU kernels run fastest (as ONNX Runtime GenAI's builder does for the CPU)"""
HELD_OUT = 32
"""held-out sequences (--val lines) the teacher-forced figures are measured on"""
HELD_OUT_TOKENS = 128
"""the longest held-out sequence (longer lines are cut)"""
CALIB_PASSAGES, CALIB_TOKENS = 128, 256
"""--calib lines read for INT4 GPTQ/AWQ, and the longest kept"""
CONTEXT_DEFAULT = 2048
"""the context length written to genai_config.json when the model's config gives none (the most it says, else)"""


def build_generation(model: str | Path, *, output: str | Path | None = None, name: str | None = None,
                     force: bool = False, val: str | Path | None = None, precision: str = "fp32",
                     target: str = "cpu", calib: str | Path | None = None, max_drift: str | None = None,
                     int4_method: str | None = None, group_size: int | None = None, act_order: bool = False,
                     price_per_hour: float | None = None, attention: str = "fused", command: list[str] | None = None,
                     console: Any = None) -> BuildResult:
    """Build the text-generation deployable of a causal LM (fp32, dynamic INT8 or INT4 weight-only)."""
    if precision not in quant.PRECISIONS or target != "cpu":
        raise UsageError(f"--task {TASK} builds fp32, --int8 and --int4 for the cpu target so far; asked {precision} "
                         f"for {target}", fix=f"drop the precision flag and --target, or build --task logits for {precision}")
    if calib is not None and precision != "int4":
        raise UsageError(f"--calib calibrates --int4 (GPTQ, AWQ) of --task {TASK}; {precision} takes none"
                         + (" (its INT8 is dynamic: activations are quantized per call)" if precision == "int8" else ""),
                         fix="drop --calib, or build --int4")
    if precision != "int4" and (int4_method or group_size or act_order):
        raise UsageError("--int4-method, --group-size and --act-order apply to --int4", fix="drop them, or build --int4")
    limits = quant.budgets(precision, max_drift)
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
    context = _context_length(lm.config)
    calibration = generation.text_ids(calib, folder, "--calib", CALIB_PASSAGES, min(CALIB_TOKENS, context)) if calib else None
    name = name or loaded.name or folder.name
    out = Path(output).absolute() if output else (Path("dist") / name).absolute()
    call = call_text(model, {"task": TASK, **({"precision": precision} if precision != "fp32" else {})})
    with claim_output(out, force), work_folder("generation") as work:
        work = Path(work)
        passes, quantization, deployed, products = [], None, lm, {}
        if precision == "int4":
            say("quantizing the Linear layers to INT4")
            with times.step("quantize"):
                deployed, record, quantization, checkpoint = quant.int4_decoder(
                    lm, int4_method or "auto", group_size, act_order, calibration, folder, say)
            passes.append(record)
            if checkpoint is not None:
                products[CHECKPOINT_PRODUCT] = checkpoint
        elif precision == "int8":
            deployed = quant.prepare_for_int8(lm)
        say("capturing the decoder with its KV cache (torch.export)")
        start = time.perf_counter()
        layout = kv_decoder.cache_layout(deployed)
        unfused = kv_attention.fusable(deployed, context) if attention == "fused" else "--attention unfused"
        attention_note, program, fused = _capture(deployed, layout, unfused, context)
        passes.append(PassRecord("capture_kv_decoder", "torch", "exported", time.perf_counter() - start, None, True,
                                 notes=[f"{layout.layers} layers, {layout.kv_heads} KV heads of {layout.head_size}; "
                                        "past length dynamic from 0", attention_note]))
        times.add("capture", passes[-1].seconds)
        say("exporting to ONNX")
        start = time.perf_counter()
        onnx_file = work / "onnx" / "model.onnx"
        onnx_file.parent.mkdir()
        nbits = export_onnx(program, onnx_file, layout.input_names(), layout.output_names(),
                            int4_accuracy_level=INT4_ACCURACY_LEVEL, translations=kv_attention.translation_table())
        kv_decoder.name_dims(onnx_file, layout)
        fusion_note = _fuse_ops(onnx_file)
        head = quant.int4_head(onnx_file, quantization["group_sizes"][0] if quantization["group_sizes"] else 128,
                               INT4_ACCURACY_LEVEL) if precision == "int4" else None
        notes = ["opset 20"] + ([f"{nbits} MatMulNBits (4-bit weights), accuracy level {INT4_ACCURACY_LEVEL} "
                                 "(activations to int8 per block inside the op)"] if nbits else [])
        passes.append(PassRecord("onnx_export", "exported", "onnx", time.perf_counter() - start,
                                 sum(p.stat().st_size for p in onnx_file.parent.iterdir()), True,
                                 notes=notes + [fusion_note] + ([head] if head else [])))
        times.add("onnx_export", passes[-1].seconds)
        if precision == "int8":
            say("quantizing the decoder's MatMuls to dynamic INT8")
            with times.step("quantize"):
                record, quantization = quant.int8_onnx(onnx_file, work / "onnx-int8" / "model.onnx")
            passes.append(record)
            onnx_file = work / "onnx-int8" / "model.onnx"
        threads = physical_cores()
        config = genai.genai_config(lm.config, layout, context, folder, threads=threads, share_buffer=fused)
        prepared = genai.write_folder(work / "genai", onnx_file, config, folder)
        prompts, source = _prompts(val, folder, layout.vocab, _special(config))
        held_out, held_source = _held_out(val, folder, layout.vocab, _special(config), context)
        with times.step("validation"):
            say(f"generating {NEW_TOKENS} tokens from {len(prompts)} prompts with onnxruntime_genai and transformers; "
                f"teacher-forced logits on {len(held_out)} held-out sequences")
            try:
                greedy = generation.greedy_check(prepared, lm, prompts, NEW_TOKENS)
                forced = generation.agreement(generation.eager_logits(lm, held_out),
                                              generation.teacher_forced(prepared, held_out), held_out)
            except RuntimeError as exc:  # onnxruntime_genai's errors are RuntimeErrors
                raise BuildError(f"onnxruntime_genai could not generate from the folder: {first_line(exc)}",
                                 where=str(folder), fix="report the model's family; build --task logits meanwhile") from exc
        if precision == "fp32" and greedy["equal"] != greedy["prompts"]:
            first = greedy["differences"][0]
            raise ValidationFailed(f"the ONNX Runtime GenAI folder's greedy tokens differ from transformers' generate "
                                   f"on {greedy['prompts'] - greedy['equal']} of {greedy['prompts']} prompts (prompt "
                                   f"{first['prompt']} first differs at token {first['at_token']})",
                                   fix="report the model's family; build --task logits meanwhile")
        checks = limits.checks(forced)
        if precision == "fp32":
            checks.insert(0, {"name": "greedy_tokens_equal", "measured": greedy["equal"], "limit": greedy["prompts"],
                              "passed": True})
        failed = [c for c in checks if not c["passed"]]
        with times.step("latency"):
            say("timing TTFT and TPOT")
            lengths = [n for n in TTFT_PROMPTS if n + NEW_TOKENS <= context] or [max(1, context - NEW_TOKENS)]
            timing = generation.time_generation(prepared, layout.vocab, lengths, list(TPOT_BATCHES), NEW_TOKENS)
        machine = get_target(target)
        if price_per_hour is not None:
            machine = machine.model_copy(update={"price_per_hour": price_per_hour})
        for row in timing["tpot"]:
            row["usd_per_million_tokens"] = generation.usd_per_million(machine.price_per_hour, row["tokens_per_s"])
        spec = _spec(layout, context)
        judged = "greedy tokens equal" if precision == "fp32" else f"teacher-forced agreement and perplexity ({limits})"
        origin = {**source_info(folder, "hf-folder"), "task": {"name": TASK, "judged_by": judged}}
        if loaded.hub is not None:
            origin["hub"] = loaded.hub.to_json()
        notes = [f"greedy tokens of {len(prompts)} prompts from {source}, {NEW_TOKENS} each, compared with "
                 "transformers' generate" + (" of the FP32 model (reported; a quantized build is judged by the "
                                            "teacher-forced figures)" if precision != "fp32" else ""),
                 f"teacher-forced logits of {len(held_out)} sequences ({forced['tokens']} tokens) from {held_source}, "
                 "against the FP32 model's",
                 f"the folder's decoder runs {threads} intra-op thread{'s' if threads > 1 else ''} (this machine's "
                 "physical cores; set model.decoder.session_options.intra_op_num_threads in genai_config.json for "
                 "another machine) and " + ("writes its KV cache into one shared buffer" if fused else
                                            "concatenates its KV cache each step (attention not fused)")]
        validation = {"device": "cpu (onnxruntime_genai, CPU)", "runs_on": "cpu", "notes": notes,
                      "generation": {"greedy": greedy, "teacher_forced": forced, **timing,
                                     "weights_bytes": _weights_bytes(prepared),
                                     "kv_cache_bytes_per_token": layout.kv_bytes_per_token(),
                                     **({"quantization": quantization} if quantization else {})},
                      "verdict": {"passed": not failed, "reasons": [
                          f"{c['name']} {c['measured']:.4g} {'<' if quant.METRICS[c['name']] == 'min' else '>'} "
                          f"{c['limit']:g} ({quant.MEANING[c['name']]}); {quant.FIX}" for c in failed],
                          "checks": checks}}
        recipe = Recipe(name=f"{precision}-onnxruntime-genai", precision=precision, backend="onnxruntime", passes=[],
                        description="the decoder with its KV cache, for ONNX Runtime GenAI",
                        emit=["onnxruntime-genai", *(["vllm"] if products else [])])
        record = provenance.record(command, call, recipe.name, _calib_record(calib, calibration),
                                   {"source": source, "samples": len(prompts),
                                    "sha256": data_sha256({"input_ids": np.asarray(p)} for p in prompts)})
        with staged_output(out, force) as stage:
            manifest = base_manifest(name, origin, machine, recipe, spec,
                                     _outputs(layout), passes, validation,
                                     candidates=[], selection="one candidate: the decoder for ONNX Runtime GenAI",
                                     provenance=record)
            typed = write_output(stage, manifest, onnx_file, spec, "cpu", recipe.emit,
                                 products={genai.PRODUCT: prepared, **products}, times=times)
    return BuildResult(name, out, typed, out / typed.artifacts.get("onnxruntime-genai"))


def _capture(lm, layout: kv_decoder.CacheLayout, unfused: str | None, context: int):
    """(note, program, fused): the decoder with fused attention where it applies, the rotary inside where it can
    be (else as transformers writes them)."""
    if unfused is None:
        rotary = kv_attention.rotary_caches(lm, context, layout.head_size)
        fused = ("attention as ONNX Runtime's GroupQueryAttention, one op per layer (the cache's concat, grouped "
                 "KV heads and the mask inside")
        if not isinstance(rotary, str):
            try:
                return (f"{fused}, and the rotary embedding from a table of {context} positions)",
                        kv_decoder.capture(lm, layout, fused=True, rotary=rotary), True)
            except CaptureError as exc:
                rotary = f"the capture with it inside failed ({exc.what})"
        try:
            return (f"{fused}; the rotary embedding as the model computes it"
                    + (f": {rotary})" if rotary != kv_attention.NO_ROTARY else ")"),
                    kv_decoder.capture(lm, layout, fused=True), True)
        except CaptureError as exc:
            unfused = f"the fused capture failed ({exc.what})"
    return f"attention as transformers writes it, unfused: {unfused}", kv_decoder.capture(lm, layout), False


def _fuse_ops(onnx_file: Path) -> str:
    """In place, where ONNX Runtime opens the result: RMSNorm (with its residual add) as ONNX Runtime's fused
    ops, sibling projections (query/key/value, gate/up) packed into one MatMul each
    (``passes/onnx/fuse_matmuls.py``), the Reshape chains between the projections and the attention
    collapsed and the attention fed the packed query/key/value (``passes/onnx/decoder_plumbing.py``); returns
    the note saying what happened."""
    from onnx.external_data_helper import load_external_data_for_model

    big = sum(p.stat().st_size for p in onnx_file.parent.iterdir()) > EXTERNAL_DATA_BYTES
    with quiet_third_party():
        model, counts = transformer_fusion.fuse_norms_and_rotary(onnx_file)
    load_external_data_for_model(model, str(onnx_file.parent))  # a large model's tensors, for the packing
    fired = {k: v for k, v in counts.items() if v}
    rewrites = {"reshape chains collapsed": decoder_plumbing.collapse_reshapes(model),
                "projections packed": fuse_matmuls.fuse(model) + fuse_matmuls.fuse_nbits(model)}
    rewrites["attention ops taking packed QKV"] = decoder_plumbing.packed_attention_inputs(model)
    if not fired and not any(rewrites.values()):
        return "no norm, projection or reshape pattern to fuse"
    fused = onnx_file.parent.with_name(onnx_file.parent.name + "-fused") / onnx_file.name
    save_model(model, fused, external=big)  # a large model's tensors in <name>.data beside it, as exported
    del model
    refused = onnxruntime_refuses(fused, optimize=True)
    if refused:
        shutil.rmtree(fused.parent)
        return f"fusions not applied: ONNX Runtime refuses the fused graph ({refused[:200]})"
    for old in onnx_file.parent.glob(f"{onnx_file.name}*"):
        old.unlink()
    for new in fused.parent.iterdir():
        new.replace(onnx_file.parent / new.name)
    fused.parent.rmdir()
    notes = ["fused as ONNX Runtime's ops: " + ", ".join(f"{k} x{v}" for k, v in fired.items())] if fired else []
    return "; ".join(notes + [f"{k} x{v}" for k, v in rewrites.items() if v])


def _weights_bytes(folder: Path) -> int:
    """What the deployed model's files hold (its weights, as stored: 4-bit, int8 or float)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


def _calib_record(calib, calibration):
    """The calibration text as provenance records it (source, count, digest), or None."""
    if calib is None:
        return None
    return SimpleNamespace(source=str(calib), count=len(calibration),
                           digest=data_sha256({"input_ids": np.asarray(ids)} for ids in calibration))


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
        return _random_ids(vocab, special, PROMPTS, 8), "random token ids (no --val)"
    return generation.text_ids(val, folder, "--val", PROMPTS, PROMPT_TOKENS), str(val)


def _held_out(val: str | Path | None, folder: Path, vocab: int, special: set[int], context: int):
    """Sequences for the teacher-forced figures: --val lines (up to :data:`HELD_OUT_TOKENS` tokens), else
    random ids, flagged (perplexity on random tokens says little about text)."""
    length = min(HELD_OUT_TOKENS, context - 1)  # the folder is run for one token more
    if val is None:
        return _random_ids(vocab, special, 8, min(64, length)), "random token ids (no --val: pass held-out text)"
    return generation.text_ids(val, folder, "--val", HELD_OUT, length, min_tokens=2), str(val)


def _random_ids(vocab: int, special: set[int], count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    choices = np.asarray([i for i in range(vocab) if i not in special])
    return [rng.choice(choices, size=length).tolist() for _ in range(count)]
