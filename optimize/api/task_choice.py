"""The task a build without ``--task`` builds.

A Hugging Face causal LM (``*ForCausalLM``, GPT-2's ``*LMHeadModel``; a folder or a hub id) builds
``text-generation`` (its decoder with the KV cache, as an ONNX Runtime GenAI folder) wherever that task
can build what was asked; anything else builds ``logits``, as every model did before. When a causal LM
falls back to ``logits``, the reason is returned, and the CLI prints it, so that the choice is never
silent: another precision or target, a flag only the logits graph takes, no tokenizer in the folder,
or ``onnxruntime_genai`` not installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from infopt.api.build_config import BuildConfig
from infopt.api.generation_flow import PRECISIONS, generation_passes, is_task_recipe, recipe_precision
from infopt.core.errors import UsageError
from infopt.exporters.genai_folder import has_tokenizer
from infopt.runtime import hub
from infopt.validators.generation_eval import METRICS

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def causal_lm_folder(model: str | Path) -> Path | None:
    """The folder of a Hugging Face causal LM (a hub id through its cached snapshot), else None."""
    folder = Path(model)
    if not folder.is_dir() and hub.is_hub_id(model):
        try:
            folder = hub.snapshot(str(model)).folder
        except Exception:  # noqa: BLE001 - the build itself reports what is wrong with the id
            return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    names = config.get("architectures") or []
    return folder if any(str(n).endswith(CAUSAL_SUFFIXES) for n in names) else None


def default_task(model: str | Path, *, precision: str | None, target: str, val: str | Path | None,
                 calib: str | Path | None, max_drift: str | None, logits_flags: list[str],
                 recipe: str | Path | None = None) -> tuple[str, str | None]:
    """``(task, why)``: ``text-generation`` for a causal LM that task can build as asked, else ``logits``;
    ``why`` completes "--task text-generation ..." for a causal LM kept on ``logits`` (None otherwise). With no
    precision asked, a text-generation ``recipe`` gives its own (``--recipe my-int4.yaml --calib t.txt`` is INT4)."""
    folder = causal_lm_folder(model)
    if folder is None:
        return "logits", None
    precision = precision or recipe_precision(recipe) or "fp32"
    metrics = [part.partition("=")[0].strip() for part in (max_drift or "").split(",") if part.strip()]
    reasons = [  # each completes "--task text-generation ..."
        (precision not in PRECISIONS, f"builds {', '.join(PRECISIONS[:-1])} and {PRECISIONS[-1]}, not {precision}"),
        (target != "cpu", f"builds for the cpu target, not {target}"),
        (bool(logits_flags), f"does not take {', '.join(logits_flags)}"),
        (val is not None and Path(val).suffix.lower() != ".txt", "takes --val as a text file"),
        (calib is not None and (precision != "int4" or Path(calib).suffix.lower() != ".txt"),
         "takes --calib as text, for --int4"),
        (any(m not in METRICS for m in metrics), f"takes --max-drift {' and '.join(METRICS)}"),
        (not has_tokenizer(folder),
         "needs the folder's tokenizer (tokenizer.json or tokenizer.model)"),
        (importlib.util.find_spec("onnxruntime_genai") is None, "needs onnxruntime_genai (pip install 'infopt[llm]')"),
    ]
    why = next((text for found, text in reasons if found), None)
    return ("logits", why) if why else ("text-generation", None)


TASKS = ("logits", "text-generation")


def generation_config(model, config: BuildConfig, example_inputs, say) -> BuildConfig | None:
    """For ``infopt.build``: the configuration of the text-generation flow when the call builds ``text-generation``
    (asked with ``task``, or the causal LM's default as :func:`default_task` chooses it), else None. ``say`` takes
    the one line that tells why a causal LM builds ``logits``. A precision not asked for is unset, so that a
    text-generation recipe keeps its own."""
    deploy = config.deploy
    task = deploy.task
    if task is not None and task not in TASKS:
        raise UsageError(f"unknown task {task!r}", fix="pass task='text-generation' or task='logits'")
    if task == "logits" or not isinstance(model, (str, Path)):
        if task == "text-generation":
            raise UsageError("task='text-generation' builds a Hugging Face causal LM from its folder or hub id, "
                             f"not a {type(model).__name__}", fix="pass the model's folder (save_pretrained) or hub id")
        return None
    options = dict(deploy.pass_options or {})
    extra = (["example_inputs"] if example_inputs is not None else []) + config.logits_only_given()
    extra += logits_choices(deploy.backend, deploy.recipe)
    if options:
        runs = generation_passes()
        extra += [f"pass_options[{name!r}]" for name in options if name not in runs]
    calib = config.calib.calibration
    if calib is not None and not isinstance(calib, (str, Path)):
        extra.append("calibration (as anything but a text file)")
    # the default precision, not asked for, leaves a text-generation recipe its own
    asked = None if deploy.recipe is not None and deploy.precision == "fp32" else deploy.precision
    if task is None:
        task, why = default_task(model, precision=asked, target=deploy.target, val=config.validation.val,
                                 calib=calib if isinstance(calib, (str, Path)) else None,
                                 max_drift=config.validation.max_drift,
                                 logits_flags=[f"{name}=" for name in extra], recipe=deploy.recipe)
        if why:
            say(f"note: building task='logits'; a causal LM's default, task='text-generation', {why}")
        if task == "logits":
            return None
    elif extra:
        raise UsageError(f"task='text-generation' does not take {', '.join(extra)}",
                         fix="drop them: it builds the ONNX Runtime GenAI folder for the cpu target")
    return BuildConfig.of(config, precision=asked, pass_options=options or None)


def logits_choices(backend: str, recipe) -> list[str]:
    """Which of ``backend`` and ``recipe`` only a logits build takes: a backend other than the task's one
    (onnxruntime), a recipe whose task is not text generation."""
    return ([] if backend in ("auto", "onnxruntime") else ["backend"]) + \
        ([] if recipe is None or is_task_recipe(recipe) else ["recipe"])
