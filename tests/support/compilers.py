"""A C++ compiler that links libstdc++ into every shared library statically, as some toolchains do: a
library it builds ends the torch process that loads it (``runtime/cpp_compiler.py``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def static_libstdcxx_gxx(folder: Path) -> Path:
    """``folder/g++``: this machine's g++, adding ``-static-libstdc++`` to each shared-library link.
    Skips the test where there is no g++ or no static libstdc++ to link."""
    real = shutil.which("g++")
    if real is None:
        pytest.skip("needs g++")
    archive = subprocess.run([real, "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    if not Path(archive).is_absolute():
        pytest.skip("this g++ has no static libstdc++ (libstdc++.a) to link")
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "g++"
    # the assembler and linker g++ runs are found on PATH: keep the real g++'s folder there
    script.write_text(f'#!/bin/sh\nexport PATH="{Path(real).parent}:$PATH"\n'
                      f'case " $* " in *" -shared "*) exec {real} "$@" -static-libstdc++ ;; *) exec {real} "$@" ;; esac\n')
    script.chmod(0o755)
    return script
