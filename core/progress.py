"""Progress that a person at a terminal and a CI log can both read.

On a terminal: rich's live bar and spinners, cleared when done. When stderr is not a terminal, or
``CI`` is set: plain lines with the seconds since the build started, one when a step starts and one
when it is done, and a step's own news at most every ``DETAIL_EVERY_S`` seconds (a live bar there
writes nothing a log keeps, or blank lines).
"""

from __future__ import annotations

import os
import time

DETAIL_EVERY_S = 5.0


def plain(console) -> bool:
    """Whether ``console`` gets plain lines rather than a live display."""
    return bool(os.environ.get("CI")) or not console.is_terminal


def _text(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup).plain


class StepLines:
    """The part of ``rich.progress.Progress`` the pipeline uses, written as timestamped lines."""

    started = time.perf_counter()

    def __init__(self, console):
        self.console = console
        self.tasks: dict[int, dict] = {}
        self.head: str | None = None
        self.last_line = 0.0

    def __enter__(self) -> "StepLines":
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def line(self, text: str) -> None:
        self.last_line = time.perf_counter()
        self.console.print(f"[{self.last_line - StepLines.started:5.0f} s] {text}", markup=False, highlight=False,
                           soft_wrap=True)

    def add_task(self, description: str, total: int | None = None, completed: int = 0) -> int:
        self.tasks[len(self.tasks)] = {"total": total, "completed": completed}
        return len(self.tasks) - 1

    def update(self, task: int, description: str | None = None, **_) -> None:
        if description is None:
            return
        text = _text(description)
        task_state = self.tasks[task]
        if self.head is None:  # the first description after a step ends names the next step
            self.head = text
            self.line(f"{text} ({task_state['completed'] + 1}/{task_state['total']})")
        elif time.perf_counter() - self.last_line >= DETAIL_EVERY_S:
            self.line(text)

    def advance(self, task: int, advance: int = 1) -> None:
        self.tasks[task]["completed"] += advance
        if self.head is not None:
            self.line(f"{self.head} done")
        self.head = None


class StatusLine:
    """``console.status`` as two plain lines: when the work starts and when it is done."""

    def __init__(self, console, text: str):
        self.text, self.lines = _text(text), StepLines(console)

    def start(self) -> None:
        self.lines.line(self.text)

    def update(self, text: str) -> None:
        self.lines.line(f"{self.text}: done")
        self.text = _text(text)
        self.lines.line(self.text)

    def stop(self) -> None:
        self.lines.line(f"{self.text}: done")


def bar(console):
    """A progress display for ``console`` (None: none)."""
    if console is None:
        return None
    if plain(console):
        return StepLines(console)
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=console, transient=True)


def status(console, text: str):
    """A spinner with ``text`` (plain lines off a terminal); call ``start()`` and ``stop()``. None without a console."""
    if console is None:
        return None
    return StatusLine(console, text) if plain(console) else console.status(text)
