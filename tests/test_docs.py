"""README.md is the front door and docs/guide/ the reference a user reads: short pages, short sentences, links
that lead somewhere, and no dated figures (those live in benchmarks/results/). Nothing here builds anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.prose import median_sentence_words

README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
PAGES = [README, *sorted(GUIDE.glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]

GUIDE_PAGES = {"README.md", "int8.md", "int4.md", "text-generation.md", "release-gate.md", "sweeps.md", "servers.md",
               "targets-and-backends.md", "output-folder.md", "python-api.md"}
"""The pages the README's reference moved to, one per job."""

README_COMMANDS = {
    "make demo": "tests/test_readme_commands.py::test_make_demo_commands",
    "make test": ".ci/run",
    "pip install .": "Makefile (install)",
    "infopt build model.pt --target cpu --val val.npz": "tests/test_readme_commands.py::test_first_command_default_output",
    "infopt build model.pt --int8 --calib data/calib/ --val data/val/ --max-drift cosine_mean=0.995":
        "tests/test_readme_commands.py::test_int8_example",
    "infopt build my-llama --int4 --calib train.txt --val held-out.txt -o dist/my-llama-int4":
        "tests/test_text_generation_quantized.py::test_int4_gptq_with_calibration_text_holds_agreement_and_perplexity",
    "infopt gate dist/model --baseline released/model --val data/val/ --junit gate.xml":
        "tests/test_readme_commands.py::test_gate_example",
    "infopt sweep sweep.yaml": "tests/test_sweep.py::test_a_local_sweep_reports_every_cell_and_is_not_stopped_by_a_failed_or_hung_one",
    "infopt validate dist/model": "tests/test_readme_commands.py::test_models_and_inputs_commands",
    "infopt serve dist/model": "tests/exporters/test_triton_server.py",
}
"""Every command README.md shows, and the test that runs it as typed."""

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, fences excluded."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append((number, line))
    return lines


def commands(text: str) -> list[tuple[int, str]]:
    """The command lines of the fenced blocks: what a user types, without a prompt or a trailing comment."""
    found = []
    for number, line in fenced_lines(text):
        line = re.sub(r"^\$\s+", "", line.strip())
        line = re.sub(r"\s+#.*$", "", line)
        if line.startswith(("make ", "pip install", "infopt ")):
            found.append((number, line))
    return found


def test_readme_is_a_front_door_of_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_s_first_command_comes_within_its_first_40_lines():
    first = commands(README.read_text())[0]
    assert first[0] <= 40, first


def test_the_readme_keeps_the_test_command_ci_runs():
    """``.ci/run`` runs "the test command README.md gives": ``make test``."""
    assert "make test" in [line for _, line in commands(README.read_text())]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_readme_command_has_a_test_that_runs_it():
    shown = {line for _, line in commands(README.read_text())}
    assert shown <= set(README_COMMANDS), f"commands without a test: {sorted(shown - set(README_COMMANDS))}"


def test_the_guide_has_a_page_per_job():
    assert GUIDE_PAGES <= {page.name for page in GUIDE.glob("*.md")}


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_the_median_sentence_is_at_most_20_words(page):
    assert median_sentence_words(page.read_text()) <= 20


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_line_holds_a_date(page):
    """Dated figures live in benchmarks/results/; a page states the rule and links there."""
    dated = [f"{number}: {line.strip()[:80]}" for number, line in enumerate(page.read_text().splitlines(), 1)
             if DATE.search(line)]
    assert not dated, "\n".join(dated)


def link_targets(page: Path) -> list[tuple[str, Path]]:
    """(as written, resolved) for every relative link of the page's prose."""
    targets = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor on the same page
        targets.append((target, (page.parent / target.split("#")[0]).resolve()))
    return targets


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_relative_link_points_to_a_file_that_exists(page):
    broken = [written for written, path in link_targets(page) if not path.exists()]
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
