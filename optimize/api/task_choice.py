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

from infopt.api.generation_precision import METRICS, PRECISIONS
from infopt.exporters.servers.onnxruntime_genai import has_tokenizer
from infopt.runtime import hub

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
                 calib: str | Path | None, max_drift: str | None, logits_flags: list[str]) -> tuple[str, str | None]:
    """``(task, why)``: ``text-generation`` for a causal LM that task can build as asked, else ``logits``;
    ``why`` completes "--task text-generation ..." for a causal LM kept on ``logits`` (None otherwise)."""
    folder = causal_lm_folder(model)
    if folder is None:
        return "logits", None
    precision = precision or "fp32"
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
