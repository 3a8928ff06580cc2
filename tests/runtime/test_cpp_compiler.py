"""The compiler AOTInductor packages are built with: one whose libraries end a torch process (it links
libstdc++ statically) is turned down, and the next one on PATH takes its place."""

from __future__ import annotations

import json
import shutil

import pytest

from infopt.runtime import cpp_compiler
from infopt.runtime.cpp_compiler import package_compiler, verdict
from tests.support.compilers import static_libstdcxx_gxx


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    package_compiler.cache_clear()
    yield tmp_path
    package_compiler.cache_clear()


def test_a_compiler_that_links_libstdcxx_statically_is_turned_down(fresh):
    static = static_libstdcxx_gxx(fresh / "bin")
    assert verdict(shutil.which("g++")) == ""
    why = verdict(str(static))
    assert why.startswith("a library it builds ") and "torch process" in why and "statically" in why
    kept = [json.loads(p.read_text()) for p in (fresh / "cache" / cpp_compiler.VERDICTS).glob("*.json")]
    assert sorted(k["why"] == "" for k in kept) == [False, True]  # each verdict kept for the next build


def test_the_next_compiler_on_path_takes_the_defaults_place(fresh, monkeypatch):
    static = static_libstdcxx_gxx(fresh / "bin")
    monkeypatch.setenv("CXX", str(static))
    choice = package_compiler()
    assert choice.default == str(static) and choice.path == shutil.which("g++")
    assert choice.rejected[0][0] == str(static)
    assert choice.note().startswith(f"C++ compiler {choice.path}, not {static}: a library it builds ")


def test_with_no_compiler_that_works_the_choice_says_why(fresh, monkeypatch):
    static = static_libstdcxx_gxx(fresh / "bin")
    monkeypatch.setenv("PATH", str(static.parent))  # the static g++ alone: no c++, no clang++
    monkeypatch.delenv("CXX", raising=False)
    choice = package_compiler()
    assert choice.path is None and [path for path, _ in choice.rejected] == [str(static)]
    assert str(static) in choice.problem() and "statically" in choice.problem()
