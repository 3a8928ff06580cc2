"""Tasks: what a Hugging Face model takes and gives, one descriptor per task (as backends and
servers are). The loader asks :func:`task_for` which task a model is, and the task gives its inputs
(from the config), the module that is exported, how it is judged, and how raw text, image or audio
files become samples for ``--val`` and ``--calib``. Adding a task is one module here and one entry
in :data:`TASKS`; the first entry whose ``matches`` holds wins, so the more particular come first."""

from __future__ import annotations

from infopt.runtime.tasks.audio import AUDIO
from infopt.runtime.tasks.base import Task
from infopt.runtime.tasks.image import IMAGE
from infopt.runtime.tasks.sentence import SENTENCE_EMBEDDING
from infopt.runtime.tasks.text import CAUSAL_LM, CLASSIFICATION, FEATURE_EXTRACTION, QUESTION_ANSWERING

TASKS: tuple[Task, ...] = (IMAGE, AUDIO, SENTENCE_EMBEDDING, CAUSAL_LM, QUESTION_ANSWERING, CLASSIFICATION,
                           FEATURE_EXTRACTION)


def task_for(model, path, config: dict) -> Task | None:
    """The first task in :data:`TASKS` that ``model`` (loaded from folder ``path``) is, or None."""
    return next((t for t in TASKS if t.matches(model, path, config)), None)


def named(name: str) -> Task:
    return next(t for t in TASKS if t.name == name)
