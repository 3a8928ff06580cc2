"""The measures the docs tests hold a page to: words per sentence, and links that reach a file and a heading.

Code blocks, tables, headings and link-only lines are not prose and are left out. A sentence ends at
``.``, ``!`` or ``?`` followed by a space or the end of a paragraph; a list item is a sentence even
without a full stop."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`*(\"'])")


def prose_blocks(markdown: str) -> list[str]:
    """Paragraphs and list items of a markdown text, each on one line, without code, tables or headings."""
    text = _FENCE.sub("", markdown)
    blocks: list[str] = []
    current: list[str] = []

    def flush():
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "|", "<!--")):
            flush()
            continue
        if re.match(r"^([-*+]|\d+\.)\s", line):
            flush()
            line = re.sub(r"^([-*+]|\d+\.)\s+", "", line)
        current.append(line)
    flush()
    return blocks


def sentence_lengths(markdown: str) -> list[int]:
    """Words in each sentence of the text's prose."""
    lengths = []
    for block in prose_blocks(markdown):
        for sentence in _END.split(block):
            words = len(re.findall(r"\S+", sentence))
            if words:
                lengths.append(words)
    return lengths


def median_sentence_words(markdown: str) -> float:
    lengths = sentence_lengths(markdown)
    return statistics.median(lengths) if lengths else 0.0


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _FENCE.sub("", markdown), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-") for h in headings}


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file (or heading) is not there, outside code blocks."""
    found = []
    for target in _LINK.findall(_FENCE.sub("", path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            found.append(f"{path}: {target} (no {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            found.append(f"{path}: {target} (no heading #{anchor} in {resolved})")
    return found
