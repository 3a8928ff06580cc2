"""The C++ compiler AOTInductor packages are built with: one whose libraries a torch process can load.

A package's wrapper is a shared library that ``aoti_load_package`` opens inside a process that already
holds the shared libstdc++ (torch links it). A compiler that links libstdc++ into each library
statically gives the wrapper a second copy of the C++ runtime. The first ``std::regex`` the wrapper
builds then takes a locale facet of the wrong type, and the process ends with SIGSEGV or an abort
(``benchmarks/results/gpu_builds.md``).

So each candidate compiler builds a small library that does what the wrapper does first, and a fresh
torch process loads and calls it. The first compiler that passes builds the package. Candidates come in
Inductor's order (``$CXX``, else ``g++``), then ``g++``, ``c++`` and ``clang++`` on ``PATH``. A verdict is
kept in the cache folder, keyed by the compiler file, the Python and torch, so each machine pays the
probe (a few seconds) once.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from infopt.core.cache import cache_dir, content_key

# What the wrapper does first when it is loaded: parse its device string with std::regex.
PROBE_SOURCE = r"""
#include <regex>
#include <string>
extern "C" int infopt_probe() {
  std::regex device("([a-z]+)(:([0-9]+))?");
  std::smatch found;
  std::string text("cuda:0");
  return std::regex_match(text, found, device) && found[3] == "0" ? 1 : 0;
}
"""
PROBE_LOAD = "import ctypes, sys, torch; print('ok' if ctypes.CDLL(sys.argv[1]).infopt_probe() == 1 else 'wrong')"
VERDICTS = "cxx-verdicts"
TIMEOUT_S = 180


@dataclass(frozen=True)
class CompilerChoice:
    """The compiler to build packages with (None when no candidate works), Inductor's own choice, and
    each candidate turned down with the reason."""

    path: str | None
    default: str | None
    rejected: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def note(self) -> str:
        """One line for the build's notes when the default was turned down, else ""."""
        if self.path is None or self.default is None or self.path == self.default:
            return ""
        return f"C++ compiler {self.path}, not {self.default}: {dict(self.rejected).get(self.default, '')}"

    def problem(self) -> str:
        """Why no package can be built here, for the error message."""
        if not self.rejected:
            return "no C++ compiler is on PATH (g++, c++ or clang++), and $CXX is not set"
        return "; ".join(f"{path}: {why}" for path, why in self.rejected)


def default_compiler() -> str:
    """The compiler Inductor picks by itself: ``$CXX``, else ``g++`` (``clang++`` on macOS)."""
    return os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")


def candidates() -> list[str]:
    """Inductor's choice first, then the usual names on PATH; each resolved, none twice."""
    found: list[str] = []
    seen: set[str] = set()
    for name in (default_compiler(), "g++", "c++", "clang++"):
        path = shutil.which(name)
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        found.append(path)
    return found


@functools.cache
def package_compiler() -> CompilerChoice:
    """The first candidate whose libraries a torch process loads and runs (probed once per machine)."""
    default = shutil.which(default_compiler())
    if not sys.platform.startswith("linux"):
        return CompilerChoice(default, default)  # the probe is about ELF libraries and libstdc++
    rejected = []
    for path in candidates():
        why = verdict(path)
        if not why:
            return CompilerChoice(path, default, tuple(rejected))
        rejected.append((path, why))
    return CompilerChoice(None, default, tuple(rejected))


def verdict(compiler: str) -> str:
    """"" when a library ``compiler`` builds loads and runs in a torch process, else why not; kept on disk."""
    stat = os.stat(compiler)
    key = content_key(os.path.realpath(compiler), str(stat.st_size), str(stat.st_mtime_ns), sys.executable,
                      _torch_version(), PROBE_SOURCE, PROBE_LOAD)
    kept = cache_dir(VERDICTS) / f"{key}.json"
    try:
        return json.loads(kept.read_text())["why"]
    except (OSError, ValueError, KeyError):
        pass
    why = probe(compiler)
    partial = kept.with_name(f".{kept.name}.{os.getpid()}")
    try:
        partial.write_text(json.dumps({"compiler": compiler, "why": why}))
        os.replace(partial, kept)
    except OSError:
        partial.unlink(missing_ok=True)  # no verdict kept: the next build probes again
    return why


def probe(compiler: str) -> str:
    """Build the probe library with ``compiler`` and call it in a fresh torch process."""
    with tempfile.TemporaryDirectory(prefix="infopt-cxx-") as work:
        source, library = Path(work) / "probe.cpp", Path(work) / "probe.so"
        source.write_text(PROBE_SOURCE)
        try:
            built = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-std=c++17", str(source), "-o", str(library)],
                                   capture_output=True, text=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"it could not build a library: {e}"
        if built.returncode != 0:
            return f"it could not build a library: {_telling_line(built.stderr) or f'exit {built.returncode}'}"
        try:
            ran = subprocess.run([sys.executable, "-c", PROBE_LOAD, str(library)], capture_output=True, text=True,
                                 timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"a library it builds did not return within {TIMEOUT_S} s in a torch process"
    if ran.returncode == 0 and ran.stdout.strip() == "ok":
        return ""
    how = (f"ended a torch process with {signal.Signals(-ran.returncode).name}" if ran.returncode < 0
           else f"failed in a torch process with {_telling_line(ran.stderr) or ran.stdout.strip() or f'exit {ran.returncode}'}")
    return f"a library it builds {how}, as one that links libstdc++ statically does"


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _telling_line(text: str) -> str:
    """The first line that says "error", else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [""])[0 if errors else -1]
