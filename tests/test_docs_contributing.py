"""The contributor docs stay short and connected: docs/ARCHITECTURE.md, docs/contributing/*.md and
docs/reference/README.md keep a median sentence of at most 20 words (``tests/support/prose.py``), and every
relative link in them and in docs/reference/*.md reaches a file that exists (and a heading, where it names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.prose import median_sentence_words

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

MAX_MEDIAN_WORDS = 20

PROSE = [DOCS / "ARCHITECTURE.md", *sorted((DOCS / "contributing").glob("*.md")), DOCS / "reference" / "README.md"]
LINKED = [DOCS / "ARCHITECTURE.md", *sorted((DOCS / "contributing").glob("*.md")), *sorted((DOCS / "reference").glob("*.md"))]

PENDING: set[str] = set()
"""link targets (relative to the repository root) still being written elsewhere; their links are not checked yet"""

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_the_pages_exist():
    names = {_name(p) for p in LINKED}
    assert {"docs/ARCHITECTURE.md", "docs/contributing/README.md", "docs/contributing/add-a-pass.md",
            "docs/contributing/add-a-backend.md", "docs/contributing/add-a-server.md",
            "docs/contributing/add-an-architecture.md", "docs/contributing/add-a-quantization-method.md",
            "docs/reference/README.md", "docs/reference/cli.md", "docs/reference/exit-codes.md",
            "docs/reference/manifest.md"} <= names


@pytest.mark.parametrize("path", PROSE, ids=_name)
def test_sentences_are_short(path):
    median = median_sentence_words(path.read_text())
    assert 0 < median <= MAX_MEDIAN_WORDS, f"{_name(path)}: median sentence {median} words (at most {MAX_MEDIAN_WORDS})"


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _FENCE.sub("", markdown), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-") for h in headings}


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file (or heading) is not there, outside code blocks."""
    found = []
    for target in _LINK.findall(_FENCE.sub("", path.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        name = _name(resolved)
        if name in PENDING:
            continue
        if not resolved.exists():
            found.append(f"{_name(path)}: {target} (no {name})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            found.append(f"{_name(path)}: {target} (no heading #{anchor} in {name})")
    return found


@pytest.mark.parametrize("path", LINKED, ids=_name)
def test_every_relative_link_reaches_a_file(path):
    broken = broken_links(path)
    assert not broken, "broken links:\n" + "\n".join(broken)


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
