"""README.md is the front door and docs/guide/ the reference a user reads; docs/ARCHITECTURE.md, docs/contributing/
and docs/reference/ are for those who change infopt. Short pages, short sentences, links that reach a file and a
heading, and no dated figures in README.md or the guides (those live in benchmarks/results/). Nothing here builds
anything."""

from __future__ import annotations

import re

import pytest

from tests.support.cli import ROOT
from tests.support.prose import broken_links, median_sentence_words

README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(GUIDE.glob("*.md"))]
"""the pages a user reads: no dates"""
PROSE = [*PAGES, DOCS / "ARCHITECTURE.md", *sorted((DOCS / "contributing").glob("*.md")), DOCS / "reference" / "README.md"]
"""every page of prose: short sentences (the rest of docs/reference/ is generated tables)"""
LINKED = [*PROSE, *sorted(p for p in (DOCS / "reference").glob("*.md") if p.name != "README.md")]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]
PROSE_IDS = [str(page.relative_to(ROOT)) for page in PROSE]
LINKED_IDS = [str(page.relative_to(ROOT)) for page in LINKED]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = [BENCHMARKS / "README.md", *sorted((BENCHMARKS / "results").glob("*.md"))]
"""the benchmarks' index and the result files it lists"""

GUIDE_PAGES = {"README.md", "int8.md", "int4.md", "text-generation.md", "release-gate.md", "sweeps.md", "servers.md",
               "targets-and-backends.md", "output-folder.md", "python-api.md"}
"""The pages the README's reference moved to, one per job."""

README_COMMANDS = {
    "make demo": "tests/e2e/test_readme_commands.py::test_make_demo_commands",
    "make test": ".ci/run",
    "pip install .": "Makefile (install)",
    "infopt build model.pt --target cpu --val val.npz": "tests/e2e/test_readme_commands.py::test_first_command_default_output",
    "infopt build model.pt --int8 --calib data/calib/ --val data/val/ --max-drift cosine_mean=0.995":
        "tests/e2e/test_readme_commands.py::test_int8_example",
    "infopt build my-llama --int4 --calib train.txt --val held-out.txt -o dist/my-llama-int4":
        "tests/e2e/test_text_generation_quantized.py::test_int4_gptq_with_calibration_text_holds_agreement_and_perplexity",
    "infopt gate dist/model --baseline released/model --val data/val/ --junit gate.xml":
        "tests/e2e/test_readme_commands.py::test_gate_example",
    "infopt sweep sweep.yaml": "tests/e2e/test_sweep.py::test_a_local_sweep_reports_every_cell_and_is_not_stopped_by_a_failed_or_hung_one",
    "infopt validate dist/model": "tests/e2e/test_readme_commands.py::test_models_and_inputs_commands",
    "infopt serve dist/model": "tests/exporters/test_triton_server.py",
}
"""Every command README.md shows, and the test that runs it as typed."""

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
    for command in shown:
        where, _, test = README_COMMANDS[command].partition("::")
        path = ROOT / where.split(" (")[0]
        assert path.is_file(), f"{command}: {path} is not there"
        assert not test or f"def {test}(" in path.read_text(), f"{command}: no {test} in {where}"


def test_the_guide_has_a_page_per_job():
    assert GUIDE_PAGES <= {page.name for page in GUIDE.glob("*.md")}


def test_the_contributor_and_reference_pages_exist():
    names = {str(p.relative_to(ROOT)) for p in LINKED}
    assert {"docs/ARCHITECTURE.md", "docs/contributing/README.md", "docs/contributing/add-a-pass.md",
            "docs/contributing/add-a-backend.md", "docs/contributing/add-a-server.md",
            "docs/contributing/add-an-architecture.md", "docs/contributing/add-a-quantization-method.md",
            "docs/reference/README.md", "docs/reference/cli.md", "docs/reference/exit-codes.md",
            "docs/reference/manifest.md"} <= names


@pytest.mark.parametrize("page", PROSE, ids=PROSE_IDS)
def test_the_median_sentence_is_at_most_20_words(page):
    assert 0 < median_sentence_words(page.read_text()) <= 20


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_line_holds_a_date(page):
    """Dated figures live in benchmarks/results/; a page states the rule and links there."""
    dated = [f"{number}: {line.strip()[:80]}" for number, line in enumerate(page.read_text().splitlines(), 1)
             if DATE.search(line)]
    assert not dated, "\n".join(dated)


@pytest.mark.parametrize("page", LINKED, ids=LINKED_IDS)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", RESULTS, ids=[str(page.relative_to(ROOT)) for page in RESULTS])
def test_every_link_of_the_benchmarks_reaches_a_file(page):
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_benchmarks_readme_is_an_index_of_every_result_file():
    """benchmarks/README.md lists each question, its script and its results file; the figures are in the files."""
    index = (BENCHMARKS / "README.md").read_text()
    assert len(index.splitlines()) <= 60 and not DATE.search(index)
    listed = set(re.findall(r"\(results/([\w.]+\.md)\)", index))
    on_disk = {p.name for p in (BENCHMARKS / "results").glob("*.md")}
    assert listed <= on_disk
    for script in re.findall(r"`((?:bench|kill|crash|profile|tune|check)_\w+\.py)`", index):
        assert (BENCHMARKS / script).is_file(), script


def test_a_benchmark_s_table_goes_into_its_results_file_as_the_newest_run(tmp_path, capsys):
    """A results file holds every dated run: a benchmark run with its default --markdown adds its table before the
    runs there, after the title and summary, and leaves them as they were."""
    from benchmarks.common import publish

    results = tmp_path / "scale.md"
    older = "## Real sizes\n\n### A run, 2026-12-02\n\n| a |\n"
    results.write_text("# Real sizes (`bench_scale.py`)\n\n## Summary\n\nIn short.\n\n" + older)
    publish("## Real sizes\n\n| b |", results)
    assert results.read_text() == ("# Real sizes (`bench_scale.py`)\n\n## Summary\n\nIn short.\n\n## Real sizes\n\n"
                                   "| b |\n\n" + older)
    assert "| b |" in capsys.readouterr().out
    fresh = tmp_path / "new.md"
    publish("## T\n\n| c |", fresh)
    assert fresh.read_text() == "## T\n\n| c |\n" and not list(tmp_path.glob("*.partial"))


def test_the_link_check_sees_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("# T\n\nSee [a](there.md#a-heading), [b](nowhere.md), [c](there.md#no-such), [d](#t) and "
                    "[e](https://example.com/x.md).\n\n```md\n[f](also-nowhere.md)\n```\n")
    assert broken_links(page) == [f"{page}: nowhere.md (no {tmp_path / 'nowhere.md'})",
                                  f"{page}: there.md#no-such (no heading #no-such in {tmp_path / 'there.md'})"]


def test_the_measure_sees_long_sentences():
    long = " ".join(["Word"] * 30) + "."
    assert median_sentence_words(f"# T\n\n{long} {long} Short one.\n") == 30
