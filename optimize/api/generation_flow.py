"""The text-generation task's flow (``infopt build FOLDER --task text-generation``): a causal LM as a generator serves it.

The build runs the task's recipe (``recipes/pipelines/<precision>-onnxruntime-genai.yaml``) through the same
:class:`~infopt.core.pipeline.Pipeline` as every build: INT4 of the Linear layers (``quantize_int4``, the same
pass and checkpoint rules as every INT4 build), the decoder's capture with its KV cache
(``capture_kv_decoder``), ``onnx_export``, its fusions (``fuse_decoder``), weight-only INT8 (``quantize_int8_weights``) or
the head's INT4 (``quantize_int4_head``), and the ONNX Runtime GenAI folder (``write_genai_folder``). That
folder is what is judged, by the task's evaluator (``validators/generation_eval.py``): ``onnxruntime_genai``
generates from it, its greedy tokens against transformers' ``generate`` on the same prompts (prompts from
``--val`` text through the folder's tokenizer, else seeded random token ids, flagged), and its logits under
teacher forcing on held-out ``--val`` text against the model's own (in float32; an INT4 build of a bf16 checkpoint
keeps it in bf16, the weights never held in float32, and says so): per-token top-1 agreement and the perplexity
increase, each against the recipe's budget (``--max-drift`` in its place). The reference's answers
are stored in ``validation/generation.npz``, so ``infopt validate`` judges the folder again the same way. Then
time to first token and time per output token are measured from the same folder.

The output folder is an ordinary infopt output: ``manifest.json`` (its passes and recipe as every build's, the
generation figures under ``validation.generation``), the reports, ``model/model.onnx`` (the decoder), and
``servers/onnxruntime-genai/``. It builds for the CPU.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from infopt.api import flags, provenance
from infopt.api import generation_share as share
from infopt.api.build_config import BuildConfig, flag_of
from infopt.api.build_notes import typed_details
from infopt.api.build_result import BuildResult
from infopt.api.emit import base_manifest, source_info, write_output
from infopt.api.generation_share import NEW_TOKENS, sequences_text
from infopt.api.provenance import call_text
from infopt.core.artifact import Artifact
from infopt.core.errors import BuildError, EnvironmentProblem, UsageError, ValidationFailed, first_line
from infopt.core.file_hash import hashed_ahead
from infopt.core.inputspec import InputSpec
from infopt.core.manifest import data_sha256
from infopt.core.memory import release as release_memory
from infopt.core.pass_api import Settings
from infopt.core.pipeline import Pipeline
from infopt.core.recipe import Recipe, load_recipe, recipes_for
from infopt.core.step_times import StepTimes
from infopt.core.target import get_target
from infopt.core.work_folders import work_folder
from infopt.exporters import genai_folder as genai
from infopt.exporters.int4_checkpoint import CheckpointSource
from infopt.exporters.kv_decoder import KvDecoder, cache_layout, context_length, decoder_outputs
from infopt.exporters.servers import onnxruntime_genai as genai_server
from infopt.exporters.staging import check_output, staged_output
from infopt.passes.decoder.half_scales import HalfScalesDetails
from infopt.passes.decoder.quantize_int8_weights import QuantizeInt8WeightsDetails
from infopt.passes.fx.quantize_int4 import Int4Details
from infopt.passes.lower.onnx_int4 import BLOCK_SIZES
from infopt.quantize import sampled_text
from infopt.quantize.calib_data import CalibrationSet
from infopt.quantize.layer_choice import ChoiceText, advice
from infopt.quantize.sampled_text import sampled_calibration
from infopt.runtime.loading import load_model
from infopt.runtime.memory_estimate import check_fits
from infopt.runtime.worker import Worker
from infopt.validators import generation
from infopt.validators import generation_eval as evaluator

TASK = "text-generation"
PRECISIONS = ("fp32", "int8", "int4")
"""the precisions the task's recipes build (``recipes/pipelines/<precision>-onnxruntime-genai.yaml``)"""
PROMPTS = 4
"""prompts the greedy check generates from"""
PROMPT_TOKENS = 32
"""the longest prompt the greedy check takes from --val text (longer lines are cut)"""
TTFT_PROMPTS = (32, 128, 512)
"""prompt lengths TTFT is timed at (those the model's context holds)"""
TPOT_BATCHES = (1, 4, 8)
TIMING_SHARE = 0.06
"""the TTFT/TPOT timing's budget: this share of the build's time until then. A larger model's runs are longer: the
shortest prompt's TTFT and batch 1's TPOT are timed whatever they cost, each other row once where its run is
predicted to fit what is left (the report names those left out; ``infopt validate`` times every row), then more
runs while the budget lasts. At 12 % the timing took 7 s of a Qwen2.5-1.5B-shaped INT4 build, whose reference,
judging and timing then took 28 % of it (``benchmarks/results/scale.md``), past the quarter they may take"""
HELD_OUT = 96
"""the most held-out sequences (--val lines) the teacher-forced figures are measured on (:func:`judged_sequences`
takes those that hold the tokens the model's size is judged on)"""
HELD_OUT_TOKENS = 128
"""the longest held-out sequence (longer lines are cut)"""
CALIB_PASSAGES, CALIB_TOKENS = 128, 256
"""--calib lines read for INT4 GPTQ/AWQ, and the longest kept"""
SAMPLED_PASSAGES, SAMPLED_TOKENS = 16, 128
"""sequences the model samples, and their length, that INT4 calibrates GPTQ on where no --calib is given"""
CHOICE_TOKENS, CHOICE_WINDOW = 2048, 128
"""--calib text after :data:`CALIB_PASSAGES`' (a quarter of the lines where the file holds no more) that INT4's
``int8_share: auto`` chooses its 8-bit layers on: the lines joined, each ended by the end token, cut into windows
of this many tokens, up to this many in all; held out of calibration, so a choice is not judged on what GPTQ fitted"""
HASH_AHEAD = 64 << 20
"""the folder's files of at least this many bytes are hashed for the manifest while it is judged (``file_hash``)"""
LM_INPUTS = ("input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]")
"""what the causal LM takes before its decoder is captured (INT4 calibrates on them)"""


class GenerationFlow:
    """The text-generation task's flow: a causal LM's decoder with its KV cache, as an ONNX Runtime GenAI folder
    judged by generating from it (fp32, INT8 or INT4 weight-only). ``orchestrator.build`` runs its stages in order.
    The INT4 settings and ``attention`` (``unfused``: attention as transformers writes it) are build settings the
    task's passes take; ``pass_options`` (pass name -> options) go over the recipe's own. ``recipe`` (a YAML file or a
    bundled name whose ``task`` is text-generation) replaces the precision's recipe; ``backend`` is ``auto`` or
    ``onnxruntime``, the task's one."""

    task = TASK

    def __init__(self, model: str | Path, config: BuildConfig, console: Any = None, command: list[str] | None = None):
        self.model, self.config, self.console, self.command = model, config, console, command
        self.times = StepTimes()
        self.force = config.emit.force

    def plan(self) -> None:
        """The task's recipe for the precision asked, checked with the settings, and the output folder checked, before
        the model loads."""
        config, console = self.config, self.console
        deploy, int4, emit = config.deploy, config.int4, config.emit
        precision, target, recipe, backend = deploy.precision, deploy.target, deploy.recipe, deploy.backend
        val, calib, max_drift = config.validation.val, config.calib.calibration, config.validation.max_drift
        int4_method, group_size, act_order = int4.int4_method, int4.group_size, int4.act_order
        output, name, force = emit.output, emit.name, self.force
        extra = config.logits_only_given()
        if extra:
            raise UsageError(f"--task {TASK} does not take {', '.join(flag_of(key) for key in extra)}",
                             fix="drop them: it builds the ONNX Runtime GenAI folder for the cpu target")
        chosen = task_recipe(recipe, backend)
        if chosen is not None:
            if precision not in (None, chosen.precision):
                raise UsageError(f"recipe {chosen.name} builds {chosen.precision}, and {precision} was asked",
                                 where=str(recipe), fix="drop the precision flag, or pass that precision's recipe")
            precision = chosen.precision
        precision = precision or "fp32"
        if precision not in PRECISIONS or target != "cpu":
            raise UsageError(f"--task {TASK} builds fp32, --int8 and --int4 for the cpu target so far; asked {precision} "
                             f"for {target}", fix=f"drop the precision flag and --target, or build --task logits for {precision}")
        if calib is not None and precision != "int4":
            raise UsageError(f"--calib calibrates --int4 (GPTQ, AWQ) of --task {TASK}; {precision} takes none"
                             + (" (its INT8 is weight-only: every weight rounded on its own, nothing to calibrate)"
                                if precision == "int8" else ""),
                             fix="drop --calib, or build --int4")
        if precision != "int4" and (int4_method or group_size or act_order or int4.max_bits_per_weight is not None):
            raise UsageError("--int4-method, --group-size, --act-order and --max-bits-per-weight apply to --int4",
                             fix="drop them, or build --int4")
        machine = get_target(target)
        flags.check_choices(config)
        settings = config.pass_settings()
        _check_int4(settings)
        recipe = (chosen or recipes_for(machine, precision, "onnxruntime", task=TASK)[0]).with_pass_options(deploy.pass_options)
        recipe.preflight(machine, calib is not None, settings)
        budgets = evaluator.with_max_drift(recipe.validation.generation, max_drift)
        try:
            import onnxruntime_genai  # noqa: F401 - the folder's consumer, which judges the build
        except ImportError as exc:
            raise EnvironmentProblem(f"--task {TASK} judges its folder by generating from it with onnxruntime_genai, "
                                     "which is not installed", fix="pip install 'infopt[llm]'") from exc
        if output:  # before the model loads: an 8B checkpoint takes minutes to load
            check_output(Path(output).absolute(), force)
        self.say = (lambda text: console.print(f"[dim]{text}[/dim]")) if console is not None else (lambda text: None)
        self.precision, self.val, self.calib, self.machine, self.settings = precision, val, calib, machine, settings
        self.recipe, self.budgets, self.output, self.name = recipe, budgets, output, name

    def load(self) -> None:
        """The causal LM (a bf16 checkpoint stays bf16 for INT4), its folder's tokenizer, the --calib text, and the
        output folder."""
        model, precision, calib, output, times = self.model, self.precision, self.calib, self.output, self.times
        deploy, machine, name = self.config.deploy, self.machine, self.name
        with times.step("load"):
            check_fits(model, f"{'an' if precision.startswith('int') else 'a'} {precision} text-generation build",
                       {"int4": "int4 in place", "fp32": "fp32 text generation"}.get(precision, "float"))
            # INT4 rounds each Linear from the weights as stored: a bf16 checkpoint stays bf16 (half the memory of
            # float32), its reference computed in bf16; float builds write float32 weights and judge against float32
            loaded = load_model(model, stored_dtype=precision == "int4")
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
        lm = loaded.module.model.eval()
        reference_dtype = str(next(lm.parameters()).dtype).removeprefix("torch.")
        lm.source_dir = str(folder)  # where the INT4 checkpoint for vLLM takes the tokenizer and config from
        calibration, choice_windows = _calibration(calib, folder, lm.config) if calib else (None, [])
        method = self.settings.get("int4_method") or "auto"
        self.parameters = sum(p.numel() for p in lm.parameters())
        self.samples_text = calib is None and precision == "int4" and sampled_text.samples_own_text(self.parameters,
                                                                                                   method)
        self.rounds_for_size = calib is None and precision == "int4" and method == "auto" and not self.samples_text
        if self.rounds_for_size:
            self.say(_past_sampling(self.parameters))
        if deploy.price_per_hour is not None:
            machine = machine.model_copy(update={"price_per_hour": deploy.price_per_hour})
        name = name or loaded.name or folder.name
        out = Path(output).absolute() if output else (Path("dist") / name).absolute()
        call = call_text(model, {"task": TASK, **({"precision": precision} if precision != "fp32" else {})})
        self.loaded, self.folder, self.lm, self.reference_dtype, self.machine = loaded, folder, lm, reference_dtype, machine
        self.calibration, self.choice_windows, self.name, self.out, self.call = calibration, choice_windows, name, out, call

    def dry_run(self) -> dict[str, Any]:
        loaded, folder, recipe, machine, out, val, calib = (self.loaded, self.folder, self.recipe, self.machine,
                                                             self.out, self.val, self.calib)
        check_output(out, self.force)
        return {"dry_run": True, "task": TASK, "name": self.name, "output": str(out), "replaces_existing": out.exists(),
                "source": str(loaded.hub.repo_id if loaded.hub else folder), "format": loaded.format,
                "target": machine.name, "inputs": InputSpec.parse(list(LM_INPUTS)).to_json(),
                "validation_data": str(val) if val is not None else "random token ids (no --val)",
                "calibration": None if calib is None else str(calib), "budget": evaluator.describe(self.budgets),
                "candidates": [{"recipe": recipe.name, "backend": recipe.backend, "precision": recipe.precision,
                                "passes": [step.name for step in recipe.passes], "skipped": None}]}

    def prepare(self) -> None:
        """Nothing to measure before the output is claimed."""

    @contextlib.contextmanager
    def workspace(self) -> Iterator[None]:
        """The work folder the passes write in, and the judging's process (ONNX Runtime GenAI is native code), started
        now: it imports while the passes run."""
        with work_folder("generation") as work, generation.judging_worker() as judge:
            self.work, self.judge_worker = Path(work), judge
            yield

    def reference(self) -> None:
        """The model's answers, before any pass rounds its weights in place: its greedy tokens on the prompts, its
        logits on the held-out text (a part of them past ``generation_share.JUDGED_PARAMETERS``), and INT4's choice text."""
        lm, folder, val, calib, budgets, say = self.lm, self.folder, self.val, self.calib, self.budgets, self.say
        if self.samples_text:  # no --calib for GPTQ: the model's own text, before any pass rounds its weights
            length = min(SAMPLED_TOKENS, context_length(lm.config))
            say(f"no --calib: the model samples {SAMPLED_PASSAGES} sequences of {length} tokens to calibrate on")
            with self.times.step("sample_calibration"):
                self.calibration = sampled_calibration(lm, SAMPLED_PASSAGES, length)
        with self.times.step("reference"):
            vocab, context = cache_layout(lm).vocab, context_length(lm.config)
            bos, eos, pad = genai.special_tokens(lm.config, vocab, folder)
            special = {bos, pad, *eos}
            self.prompts, self.prompt_source = prompts, prompt_source = _prompts(val, folder, vocab, special)
            parameters = self.parameters
            self.new_tokens = new_tokens = share.judged_tokens(parameters)
            # past JUDGED_PARAMETERS the first teacher-forced figures come from the greedy check's own prefill, and
            # held-out lines after the prompts' make up the count a teacher-forced budget judges (float32 has none)
            self.on_prompts = on_prompts = parameters > share.JUDGED_PARAMETERS
            held_out, offered, held_source = [], 0, prompt_source
            if not on_prompts or evaluator.describe(budgets, forced_only=True):
                held_out, held_source = _held_out(val, folder, vocab, special, context,
                                                  skip=len(prompts) if on_prompts else 0)
                counted = sum(map(len, prompts)) if on_prompts else 0
                offered, held_out = len(held_out), share.judged_sequences(held_out, parameters, counted)
            self.held_out, self.offered, self.held_source = held_out, offered, held_source
            say(f"the model's greedy tokens on {len(prompts)} prompts and its logits on "
                + ("those prompts" + (f" and {sequences_text(len(held_out))}" if held_out else "") if on_prompts
                   else sequences_text(len(held_out))) + f" in {self.reference_dtype}, the reference")
            self.samples = evaluator.GenerationSamples.from_model(lm, prompts, prompt_source, held_out, held_source,
                                                                  new_tokens, eos, on_prompts=on_prompts)
            self.choice = (ChoiceText.from_model(lm, self.choice_windows, budgets.min_top1, budgets.max_ppl_delta,
                                                 f"{calib} held out of calibration") if self.choice_windows else None)

    def run_pipeline(self) -> None:
        """The task's recipe run on the module: the decoder captured and exported, quantized where asked, and written
        as an ONNX Runtime GenAI folder; an INT4 checkpoint for vLLM written ahead, its module let go."""
        times, loaded = self.times, self.loaded
        pipeline = Pipeline(self.recipe, self.machine, self.work, calibration=self.calibration, console=self.console,
                            times=times, settings=self.settings, choice=self.choice)
        source = [Artifact("torch", InputSpec.parse(list(LM_INPUTS)), obj=self.lm, output_names=("logits",))]
        # from here the pipeline holds the only reference to the module, so its weights are freed once the passes are
        # past it (the export; for INT4, the checkpoint's writer at the end)
        loaded.module = loaded.artifact = self.lm = None
        # the checkpoint's sha256 for the manifest (1.1 s for 0.5B's 1 GB here, growing with the bytes) read while the
        # passes export and write
        self.origin_of = in_background(source_info, self.folder, "hf-folder")
        self.final = final = pipeline.run(source.pop())
        checkpoint = final.products.get(CheckpointSource)
        if checkpoint is not None:  # written now and its module let go: it held about 0.5 GB through the judging
            with times.step("vllm_checkpoint"):
                final.products[CheckpointSource] = checkpoint.write_ahead(self.work / "vllm-checkpoint")
                del checkpoint
                release_memory(0)
        self.decoder: KvDecoder = final.products[KvDecoder]
        self.prepared = final.products[genai.GenaiFolder].path

    def judge(self) -> None:
        """The folder judged in the judging's process: greedy tokens and teacher-forced logits against the
        reference's, each against the recipe's budgets; a failed INT4 verdict says which layers and what cap would
        pass. The folder is opened there once, for the judging and the timing."""
        prepared, prompts, held_out, new_tokens = self.prepared, self.prompts, self.held_out, self.new_tokens
        # the hashes for the manifest are waited for after the judging's step, before the timing
        with hashed_ahead(p for p in prepared.iterdir() if p.stat().st_size >= HASH_AHEAD), self.times.step("validation"):
            self.say(f"generating {new_tokens} tokens from {len(prompts)} prompts with onnxruntime_genai; teacher-forced "
                     + ("logits of their prefill" + (f" and of {sequences_text(len(held_out))}" if held_out else "")
                        if self.on_prompts else f"logits on {sequences_text(len(held_out))}"))
            try:
                self.judged = judged = evaluator.evaluate_in(self.judge_worker, prepared, self.samples, self.budgets)
            except RuntimeError as exc:  # onnxruntime_genai's errors are RuntimeErrors
                raise BuildError(f"onnxruntime_genai could not generate from the folder: {first_line(exc)}",
                                 where=str(self.folder), fix="report the model's family; build --task logits meanwhile") from exc
        self.quantization = quantization = _quantization(self.final.lineage, self.calibration)
        if not judged["verdict"]["passed"] and quantization and quantization.get("choice"):
            judged["verdict"]["reasons"].append(advice(quantization["choice"]))
        if not judged["verdict"]["passed"] and overflowed(judged, self.final.lineage):
            judged["verdict"]["reasons"].append(evaluator.OVERFLOW)
        greedy = judged["greedy"]
        if self.budgets.greedy_equal and greedy["equal"] != greedy["prompts"]:
            first = greedy["differences"][0]
            raise ValidationFailed(f"the ONNX Runtime GenAI folder's greedy tokens differ from transformers' generate "
                                   f"on {greedy['prompts'] - greedy['equal']} of {greedy['prompts']} prompts (prompt "
                                   f"{first['prompt']} first differs at token {first['at_token']})",
                                   fix="report the model's family; build --task logits meanwhile")

    def time(self) -> None:
        """TTFT and TPOT of the folder in the judging's process, within :data:`TIMING_SHARE` of the build's time so
        far; the process then closed, its decoder's memory given back before the output is written."""
        times = self.times
        if not evaluator.finite(self.judged):
            self.timing = timing = evaluator.not_timed(self.new_tokens)
        else:
            with times.step("latency"):
                budget = TIMING_SHARE * (time.perf_counter() - times.started)
                self.say(f"timing TTFT and TPOT (about {budget:.0f} s)")
                # a larger model's TPOT runs generate the greedy check's share of tokens (8 at 0.2B and up: 7 samples
                # a run, 8 tokens fewer at 0.22 s each at 1.5B in float32), after no warm-up: the judging has just
                # run the folder there
                self.timing = timing = time_folder(self.judge_worker, self.prepared, self.decoder.layout.vocab,
                                                   self.decoder.context, budget, every_row=False,
                                                   new_tokens=self.new_tokens, warm=True)
        self.judge_worker.close()
        for row in timing["tpot"]:
            row["usd_per_million_tokens"] = generation.usd_per_million(self.machine.price_per_hour, row["tokens_per_s"])

    def emit(self) -> BuildResult:
        """The output folder: the GenAI folder as the output's model, the reference's answers for ``infopt
        validate``, the manifest (the generation figures, notes, provenance), the reports and the servers' packages."""
        loaded, recipe, machine, budgets, judged, final = (self.loaded, self.recipe, self.machine, self.budgets,
                                                           self.judged, self.final)
        prompts, prepared, decoder, parameters = self.prompts, self.prepared, self.decoder, self.parameters
        forced_budgets = evaluator.describe(budgets, forced_only=True)
        judged_by = (f"teacher-forced agreement and perplexity ({forced_budgets})" if forced_budgets
                     else "greedy tokens equal")
        origin = {**self.origin_of(), "task": {"name": TASK, "judged_by": judged_by}}
        if loaded.hub is not None:
            origin["hub"] = loaded.hub.to_json()
        validation = {"device": "cpu (onnxruntime_genai, CPU)", "runs_on": "cpu", "notes": self._notes(),
                      "generation": {"greedy": judged["greedy"], "teacher_forced": judged["teacher_forced"],
                                     **self.timing, "reference_dtype": self.reference_dtype,
                                     "weights_bytes": genai.weights_bytes(prepared),
                                     "bits_per_weight": round(8 * genai.weights_bytes(prepared) / parameters, 3),
                                     "kv_cache_bytes_per_token": decoder.layout.kv_bytes_per_token(),
                                     **({"quantization": self.quantization} if self.quantization else {})},
                      "verdict": judged["verdict"]}
        record = provenance.record(self.command, self.call, recipe.name, self.calibration,
                                   {"source": self.prompt_source, "samples": len(prompts),
                                    "sha256": data_sha256({"input_ids": np.asarray(p)} for p in prompts)}, self.settings)
        with staged_output(self.out, self.force) as stage:
            validation["stored_samples"] = self.samples.save(stage / evaluator.SAMPLES_FILE)
            manifest = base_manifest(self.name, origin, machine, recipe, final.spec, decoder_outputs(decoder.layout),
                                     final.lineage, validation, candidates=[],
                                     selection="one candidate: the decoder for ONNX Runtime GenAI", provenance=record)
            # the GenAI folder's model is the output's model (no model/ copy of the weights) where it is emitted
            genai_emitted = recipe.emit is None or "onnxruntime-genai" in recipe.emit
            typed = write_output(stage, manifest, final.path, final.spec, "cpu", recipe.emit, products=final.products,
                                 times=self.times, model_in=f"{genai_server.FOLDER}/{final.path.name}" if genai_emitted else None)
        return BuildResult(self.name, self.out, typed, self.out / typed.artifacts.get("onnxruntime-genai"))

    def _notes(self) -> list[str]:
        """The report's notes on how the folder was judged: the greedy check, the teacher-forced figures and what
        they cover, the interval, the reference's dtype."""
        budgets, judged, held_out, new_tokens = self.budgets, self.judged, self.held_out, self.new_tokens
        notes = [f"greedy tokens of {len(self.prompts)} prompts from {self.prompt_source}, {new_tokens} each, compared "
                 "with transformers' generate" + ("" if budgets.greedy_equal else " of the unquantized model (reported; a "
                                                  "quantized build is judged by the teacher-forced figures)"),
                 f"teacher-forced logits of {len(self.samples.held_out)} sequences ({judged['teacher_forced']['tokens']} "
                 f"tokens) from {_forced_source(self.on_prompts, len(held_out), self.held_source, self.precision)}, "
                 f"against the {self.reference_dtype} model's (its top-1 tokens and next-token log-likelihoods are "
                 f"stored in {evaluator.SAMPLES_FILE} for `infopt validate`)"]
        if new_tokens < NEW_TOKENS or len(held_out) < self.offered:
            notes.append(share.judging_share_note(self.parameters, new_tokens, len(held_out), self.offered, self.on_prompts,
                                            judged["teacher_forced"]))
        if evaluator.describe(budgets, forced_only=True) and share.interval_note(judged["teacher_forced"]):
            notes.append(share.interval_note(judged["teacher_forced"]))
        if self.rounds_for_size:
            notes.append(_past_sampling(self.parameters))
        if self.reference_dtype != "float32":
            notes.append(f"the reference computed in {self.reference_dtype}, the checkpoint's dtype: the INT4 build keeps "
                         "the weights as stored until each layer is rounded, so no float32 copy of them is held")
        return notes


def task_recipe(recipe: str | Path | None, backend: str = "auto") -> Recipe | None:
    """The recipe a text-generation build was given (None: the precision's own), once it is known to be the task's;
    a ``backend`` other than the task's one is bad input."""
    if backend not in ("auto", "onnxruntime"):
        raise UsageError(f"--task {TASK} builds the ONNX Runtime GenAI folder (backend onnxruntime); --backend "
                         f"{backend} has no recipe for it", fix="drop --backend, or pass --backend onnxruntime")
    if recipe is None:
        return None
    found = load_recipe(recipe)
    if found.task != TASK:
        names = ", ".join(f"{p}-onnxruntime-genai" for p in PRECISIONS)
        raise UsageError(f"recipe {found.name} builds {found.task or 'the logits graph'}, not {TASK}", where=str(recipe),
                         fix=f"pass one of the task's recipes ({names}) or a YAML with `task: {TASK}`, "
                             "or build --task logits with it")
    return found


def recipe_precision(recipe: str | Path | None) -> str | None:
    """The precision of ``recipe`` where it is this task's (None: no recipe, another task's, or one that does not
    load, which the build reports)."""
    if recipe is None:
        return None
    try:
        found = load_recipe(recipe)
    except Exception:  # noqa: BLE001 - RecipeError and whatever a broken file raises
        return None
    return found.precision if found.task == TASK else None


def is_task_recipe(recipe: str | Path) -> bool:
    """Whether ``recipe`` loads and builds this task (for choosing the task; a broken recipe is reported by the build)."""
    try:
        return load_recipe(recipe).task == TASK
    except Exception:  # noqa: BLE001 - RecipeError and whatever a broken file raises
        return False


def time_folder(worker: Worker, folder: Path, vocab: int, context: int, budget_s: float = generation.BUDGET_S,
                every_row: bool = True, new_tokens: int = NEW_TOKENS, warm: bool = False) -> dict:
    """TTFT at the prompt lengths the context holds and TPOT at :data:`TPOT_BATCHES` (``new_tokens`` a run), from the
    folder held open in ``worker`` (``generation.judging_worker``), in about ``budget_s`` (each row once however long
    that takes, or without ``every_row`` the rows that fit it); ``warm``: just judged there, so no warm-up run."""
    lengths = [n for n in TTFT_PROMPTS if n + NEW_TOKENS <= context] or [max(1, context - NEW_TOKENS)]
    return worker.call(generation.time_generation, folder, vocab, lengths, list(TPOT_BATCHES), new_tokens,
                       budget_s=budget_s, every_row=every_row, warm=warm,
                       doing="timing the GenAI folder with onnxruntime_genai")


def generation_passes() -> set[str]:
    """The passes the task's recipes run (the options ``pass_options`` may set for a text-generation build)."""
    machine = get_target("cpu")
    return {step.name for p in PRECISIONS for step in recipes_for(machine, p, "onnxruntime", task=TASK)[0].passes}


def _check_int4(settings: Settings) -> None:
    """A group size MatMulNBits does not take, refused before any work. (A method that calibrates, given no --calib,
    calibrates on the model's own samples.)"""
    group_size = settings.get("group_size")
    if group_size is not None and group_size not in BLOCK_SIZES:
        raise UsageError(f"--group-size {group_size}: ONNX Runtime's MatMulNBits takes "
                         f"{', '.join(map(str, BLOCK_SIZES))}", fix="pass --group-size 32, 64 or 128")


def _past_sampling(parameters: int) -> str:
    """Why an INT4 build given no --calib rounded by RTN, and what else it could do."""
    return (f"no --calib, and {parameters / 1e6:,.0f}M parameters: past the {sampled_text.SAMPLED_MAX_PARAMETERS / 1e6:,.0f}M up "
            "to which --int4 calibrates GPTQ on text the model samples (0.4-0.7 s a million parameters on 2 cores), "
            "its layers were rounded to the nearest points of their searched grids (RTN), which loses more; "
            "--int4-method gptq samples anyway, and --calib TEXT.txt calibrates on text like what it will serve")


def _calibration(calib, folder: Path, config) -> tuple[CalibrationSet, list[list[int]]]:
    """The --calib text as the INT4 pass's calibration set (one sample per passage, each at its own length) and the
    windows held out of it to choose on (:data:`CHOICE_TOKENS`)."""
    window = min(CHOICE_WINDOW, context_length(config) - 1)
    lines = generation.text_ids(calib, folder, "--calib", CALIB_PASSAGES + CHOICE_TOKENS // 8,
                                min(CALIB_TOKENS, context_length(config)))
    ids, rest = (lines[:CALIB_PASSAGES], lines[CALIB_PASSAGES:]) if len(lines) > CALIB_PASSAGES else \
        (lines[:len(lines) - len(lines) // 4], lines[len(lines) - len(lines) // 4:])
    end = genai.end_tokens(config, config.vocab_size, folder)
    joined = [t for row in rest for t in [*row, *end[:1]]]
    windows = [joined[i:i + window] for i in range(0, len(joined) - window + 1, window)][:CHOICE_TOKENS // window]
    batches = [{"input_ids": np.asarray([row], np.int64), "attention_mask": np.ones((1, len(row)), np.int64)}
               for row in ids]
    return (CalibrationSet(batches, len(ids), str(calib), data_sha256({"input_ids": np.asarray(row)} for row in ids)),
            windows)


def _quantization(lineage, calibration: CalibrationSet | None) -> dict | None:
    """What the quantization pass of the lineage did, as ``validation.generation.quantization`` says it."""
    for details in typed_details(lineage):
        if isinstance(details, Int4Details) and details.route is None:
            return {"precision": "int4", "method": details.method, "layers": len(details.layers),
                    "group_sizes": sorted({row["group_size"] for row in details.layers}, reverse=True),
                    "act_order": details.act_order, "kept_in_float": sorted(details.kept),
                    "bits_per_weight": details.bits_per_weight,
                    **({"choice": details.choice} if details.choice else {}),
                    "calibration_passages": calibration.count if calibration and details.method != "rtn" else 0,
                    "format": "MatMulNBits (com.microsoft), 4-bit weights"}
        if isinstance(details, QuantizeInt8WeightsDetails):
            return {"precision": "int8", "method": "weight-only", "layers": details.layers,
                    "group_sizes": details.block_sizes, "bits_per_weight": details.bits_per_weight,
                    "kept_in_float": sorted(details.kept), "head": details.head, "embedding": details.embedding,
                    "format": "MatMulNBits (com.microsoft), 8-bit weights"}
    return None



def overflowed(judged: dict, lineage) -> bool:
    """Whether the judged figures are not finite in a folder whose quantized ops compute in float16 (``half_scales``)."""
    halved = any(isinstance(d, HalfScalesDetails) and d.nodes for d in typed_details(lineage))
    return halved and not evaluator.finite(judged)


def in_background(function, *args):
    """Start ``function(*args)`` on a daemon thread (a build that fails does not wait for it); what is returned,
    called, waits for it and gives its result or raises its error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"infopt-{getattr(function, '__name__', 'task')}", daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


def _prompts(val: str | Path | None, folder: Path, vocab: int, special: set[int]) -> tuple[list[list[int]], str]:
    """Prompts for the greedy check: --val text lines through the folder's tokenizer, else random ids
    (none of them a special token)."""
    if val is None:
        return _random_ids(vocab, special, PROMPTS, 8), "random token ids (no --val)"
    return generation.text_ids(val, folder, "--val", PROMPTS, PROMPT_TOKENS), str(val)


def _forced_source(on_prompts: bool, held_out: int, held_source: str, precision: str) -> str:
    """Where the teacher-forced figures came from, in words."""
    if not on_prompts:
        return held_source
    if held_out:
        return f"the greedy check's prompts (their prefill) and {sequences_text(held_out)} after them from {held_source}"
    return (f"the greedy check's prompts (their prefill, no sequence run for the figures alone: none judges a "
            f"{precision} build past {share.JUDGED_PARAMETERS / 1e9:g}B parameters)")


def _held_out(val: str | Path | None, folder: Path, vocab: int, special: set[int], context: int, skip: int = 0):
    """Sequences for the teacher-forced figures: --val lines (up to :data:`HELD_OUT_TOKENS` tokens) after the first
    ``skip`` (the prompts'), else random ids, flagged (perplexity on random tokens says little about text)."""
    length = min(HELD_OUT_TOKENS, context - 1)  # the folder is run for one token more
    if val is None:
        return _random_ids(vocab, special, 8 + skip, min(64, length))[skip:], "random token ids (no --val: pass held-out text)"
    return generation.text_ids(val, folder, "--val", HELD_OUT, length, min_tokens=2, skip=skip), str(val)


def _random_ids(vocab: int, special: set[int], count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    choices = np.asarray([i for i in range(vocab) if i not in special])
    return [rng.choice(choices, size=length).tolist() for _ in range(count)]
