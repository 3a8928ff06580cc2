"""Handing freed memory back: what one step of a build let go of should not stay resident for the next.

Python frees an object when its last reference goes, but objects in reference cycles (an ONNX graph's nodes and
values, a torch module's hooks) wait for the garbage collector, and glibc's allocator keeps freed heap pages for
reuse rather than returning them to the kernel. At real sizes that is gigabytes: building a Qwen2.5-0.5B shape,
the process stayed 2.9 GB above what it held after the decoder's fusion pass had dropped its graph. The
pipeline calls :func:`release` after each pass of a large build.

A checkpoint's weights loaded as stored are not on the heap at all: transformers maps the safetensors file (a
private file mapping) and the parameters are views of it, so every page read stays resident until the mapping
goes. :func:`drop_file_pages` hands back the pages of such a tensor once it is not read again (widened to float32,
say); the kernel reads them from the file if they are.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from contextlib import contextmanager

LARGE_BYTES = 1 << 30
"""below this resident size, releasing is not worth a garbage collection"""

TENSOR_HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
"""torch's switch for transparent huge pages under its CPU tensors of 2 MB and more (read once, at the first such
allocation)"""


def huge_pages_for_tensors() -> None:
    """Ask torch, before it allocates, to back its large CPU tensors with transparent huge pages (unless
    ``THP_MEM_ALLOC_ENABLE`` is set already: ``0`` turns it off). A build writes gigabytes of fresh tensors (a
    checkpoint widened to float32, an export's packed weights), and a page fault per 4 KB page was a large part of
    that: huge pages make such builds faster at the same peak memory (measured in benchmarks/results/rules.md)."""
    os.environ.setdefault(TENSOR_HUGE_PAGES, "1")


def resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MADV_DONTNEED = 4
"""Linux's madvise advice: drop the range's pages; a file mapping's are read from the file again if touched"""


def file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of regular files, from ``/proc/self/maps`` (none where it cannot be
    read)."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and not path.endswith("(deleted)"):
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    found.append((low, high))
    except (OSError, ValueError, IndexError):
        return []
    return found


def drop_file_pages(tensor, mappings: list[tuple[int, int]]) -> int:
    """Hand back the resident pages wholly inside ``tensor``'s memory where it lies in one of ``mappings`` (from
    :func:`file_mappings`); the bytes handed back. Anonymous memory is never touched (dropping it would lose what it
    holds). For a tensor read as the file holds it (weights not changed in place)."""
    start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    if not any(low <= start and start + size <= high for low, high in mappings):
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    low, high = -(-start // page) * page, (start + size) // page * page
    if high <= low:
        return 0
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return high - low if libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) == 0 else 0
    except (OSError, AttributeError):  # not glibc: the pages stay until the mapping goes
        return 0


def release(least: int = LARGE_BYTES) -> None:
    """Collect cycles and return the allocator's free pages to the kernel, when the process holds at least ``least``."""
    if resident_bytes() < least:
        return
    release_rewriter_graphs()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator returns pages its own way
        pass


_frozen_depth = 0


@contextmanager
def older_objects_frozen():
    """A build's block (or decorated function) in which the objects made before it (the imports' hundreds of
    thousands of modules, classes and functions, which live as long as the process) are left out of garbage
    collections (``gc.freeze``): each :func:`release` scanned them again, 0.3 s a pass at Qwen2.5-0.5B, 2 s of its
    INT4 build. What the build makes stays collectable, and at the end the collector sees everything again
    (``gc.unfreeze``): a Python program that calls ``infopt.build`` keeps its own collection as it was."""
    global _frozen_depth
    if _frozen_depth == 0:
        gc.freeze()
    _frozen_depth += 1
    try:
        yield
    finally:
        _frozen_depth -= 1
        if _frozen_depth == 0:
            gc.unfreeze()


def release_rewriter_graphs() -> None:
    """Let go of the last graph onnxscript's rewrite rules matched. Each rule's matcher keeps it (``_graph``) until the
    rule's next use, and with it every weight of that model: after an export, a float32 LLM's weights stayed held
    through the next pass (2 GB at 0.5B parameters). The rules are module-level objects of ``onnxscript.rewriter``."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("onnxscript.rewriter") or module is None:
            continue
        for value in list(vars(module).values()):
            rules = getattr(value, "rules", None) if not hasattr(value, "_matcher") else [value]
            if not isinstance(rules, (list, tuple)):
                continue
            for rule in rules:
                matcher = getattr(rule, "_matcher", None)
                for attribute in ("_graph", "_current_node", "_tracer", "_match"):
                    if matcher is not None and getattr(matcher, attribute, None) is not None:
                        setattr(matcher, attribute, None)
