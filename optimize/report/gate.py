"""The gate's result as a person and a CI system read it: rows for a table, Markdown, JUnit XML.

JUnit: one ``<testsuite name="infopt gate">`` with one ``<testcase>`` per check (classname the
check's group); a failed check has a ``<failure>``, a figure that is not gated is a passing
testcase whose ``<system-out>`` says so; accuracy that nothing could judge is a ``<skipped>`` testcase.
GitHub Actions and GitLab CI both read this format.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from infopt.core.errors import UsageError
from infopt.validators.gate_result import GateCheck, GateResult

HEADERS = ["check", "candidate", "baseline", "limit", "result", "detail"]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"


def status(check: GateCheck) -> str:
    if check.skipped:
        return "SKIPPED"
    return "not gated" if check.passed is None else ("pass" if check.passed else "FAIL")


def rows(result: GateResult) -> list[list[str]]:
    return [[f"{c.group}: {c.name}", _num(c.candidate), _num(c.baseline), c.limit, status(c), c.detail] for c in result.checks]


def headline(result: GateResult) -> str:
    c, b = result.candidate, result.baseline
    verdict = "PASS" if result.passed else f"FAIL ({len(result.reasons)} check{'s' if len(result.reasons) != 1 else ''})"
    return f"infopt gate: {verdict}: {c['name']} ({c['recipe']}, {c['dist']}) against {b['name']} ({b['recipe']}, {b['dist']})"


def to_markdown(result: GateResult) -> str:
    lines = [f"### {headline(result)}", "", "| " + " | ".join(HEADERS) + " |", "|" + "|".join(" --- " for _ in HEADERS) + "|"]
    for row in rows(result):
        cells = [cell.replace("|", "\\|") for cell in row]
        if row[4] in ("FAIL", "SKIPPED"):
            cells[4] = f"**{row[4]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for reason in result.reasons:
        lines.append(f"- failed: {reason}")
    for note in result.notes:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def to_junit(result: GateResult) -> str:
    failures = sum(c.passed is False for c in result.checks)
    skipped = sum(c.skipped for c in result.checks)
    suite = ET.Element("testsuite", name="infopt gate", tests=str(len(result.checks)), failures=str(failures), errors="0",
                       skipped=str(skipped))
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", classname=f"infopt.gate.{check.group}", name=check.name)
        if check.skipped:
            ET.SubElement(case, "skipped", message=check.detail)
        elif check.passed is False:
            failure = ET.SubElement(case, "failure", message=check.describe(), type="GateFailure")
            failure.text = check.describe()
        else:
            out = ET.SubElement(case, "system-out")
            out.text = check.describe() + ("" if check.passed else " (reported, not gated)")
    root = ET.Element("testsuites", name="infopt", tests=suite.get("tests"), failures=suite.get("failures"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def check_writable(path: Path | None, flag: str) -> None:
    """Refuse, before the gate runs, a report path that cannot be written (exit 2)."""
    if path is None:
        return
    path = Path(path)
    parent = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    problem = None
    if path.is_dir():
        problem = "it is a folder"
    elif not parent.is_dir():
        problem = f"{parent} is not a folder"
    elif not os.access(path if path.exists() else parent, os.W_OK):
        problem = "permission denied"
    if problem:
        raise UsageError(f"cannot write {flag} {path}: {problem}", fix=f"pass a {flag} path in a folder you can write to")


def _write_text(path: Path, text: str, flag: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}",
                         fix=f"pass a {flag} path in a folder you can write to") from exc


def write_outputs(result: GateResult, junit: Path | None, summary: Path | None) -> list[Path]:
    """Write the JUnit file and the Markdown summary where asked; the summary is also appended to
    ``$GITHUB_STEP_SUMMARY`` when that is set (GitHub Actions' job summary)."""
    written = []
    if junit is not None:
        _write_text(junit, to_junit(result), "--junit")
        written.append(junit)
    text = to_markdown(result)
    if summary is not None:
        _write_text(summary, text, "--summary")
        written.append(summary)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as handle:
            handle.write(text)
        written.append(Path(step_summary))
    return written
