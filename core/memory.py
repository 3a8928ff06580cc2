"""Handing freed memory back: what one step of a build let go of should not stay resident for the next.

Python frees an object when its last reference goes, but objects in reference cycles (an ONNX graph's nodes and
values, a torch module's hooks) wait for the garbage collector, and glibc's allocator keeps freed heap pages for
reuse rather than returning them to the kernel. At real sizes that is gigabytes: building a Qwen2.5-0.5B shape,
the process stayed 2.9 GB above what it held after the decoder's fusion pass had dropped its graph. The
pipeline calls :func:`release` after each pass of a large build.

A checkpoint's weights are not on the heap at all: transformers maps the safetensors file (a private file
mapping) and the parameters are views of it, so every page the reference run touched stays resident until the
mapping goes, after the whole build. :func:`drop_file_pages` hands back the pages of a tensor that will not be
read again (a layer's stored weights once it is quantized); the kernel reads them from the file if they are.
An 8B checkpoint's mapped pages were 14 of the build's 21.9 GB at its peak.
"""

from __future__ import annotations

import ctypes
import gc
import os

LARGE_BYTES = 1 << 30
"""below this resident size, releasing is not worth a garbage collection"""


def resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MADV_DONTNEED = 4
"""Linux's madvise advice: drop the range's pages; a file mapping's are read from the file again if touched"""


def file_mapping(address: int) -> tuple[int, int, str] | None:
    """(start, end, path) of the mapping of a regular file that holds ``address``, from ``/proc/self/maps``; None
    where the address is anonymous memory (the heap, torch's allocations) or the maps cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= address < high:
                    path = fields[5].strip() if len(fields) == 6 else ""
                    return (low, high, path) if path.startswith("/") and not path.endswith("(deleted)") else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def drop_file_pages(tensor) -> int:
    """Hand back the resident pages wholly inside ``tensor``'s memory where it lies in a file mapping; the bytes
    handed back (0 for anonymous memory, which is never touched: dropping it would lose what it holds). For a
    tensor that is not read again, or is read as the file holds it (weights not changed in place)."""
    start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    mapping = file_mapping(start)
    if mapping is None or start + size > mapping[1]:
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
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator returns pages its own way
        pass
