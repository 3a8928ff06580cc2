"""A text-generation folder is judged and timed in a worker process (``generation.judging_worker``): what the
functions compute there is what they compute here, and a crash in it is a failed check with its signal, not the
end of infopt."""

from __future__ import annotations

import ctypes
import json
import os

import pytest

from infopt.runtime.worker import RunnerCrashed, huge_pages_env
from infopt.validators import generation
from tests.support.cli import assert_clean_failure, run_cli

pytest.importorskip("onnxruntime_genai")


def test_the_worker_computes_what_this_process_does_and_says_what_failed_there(tmp_path):
    with generation.judging_worker() as judge:
        got, want = [[5, 6, 7], [1, 2]], [[5, 6, 8], [1, 2]]
        assert judge.call(generation.compare_tokens, got, want, doing="comparing") == generation.compare_tokens(got, want)
        assert "glibc.malloc.hugetlb=1" in judge.call(os.getenv, "GLIBC_TUNABLES", doing="reading its environment")
        with pytest.raises(RuntimeError) as raised:  # onnxruntime_genai's own error, its message kept
            judge.call(generation.hold_open, tmp_path / "missing", doing="opening a folder that is not there")
        assert "missing" in str(raised.value) and not judge.dead
        with pytest.raises(RunnerCrashed) as crashed:
            judge.call(ctypes.string_at, 0, doing="reading address zero")
    text = str(crashed.value)
    assert "reading address zero ended with SIGSEGV (a segmentation fault in native code)" in text
    assert "ONNX Runtime GenAI's native code crashed" in crashed.value.fix and judge.dead


def test_huge_pages_join_the_tunables_already_set(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0")
    assert huge_pages_env() == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert huge_pages_env() == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


@pytest.mark.slow
def test_a_judging_worker_stopped_for_memory_fails_the_build_cleanly_and_validate_and_gate_say_so(tmp_path):
    from tests.support.decoders import decoder

    decoder(tmp_path, "llama")
    proc = run_cli("build", "tiny-llama", "--task", "text-generation", "-q", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    capped = {"INFOPT_WORKER_MEMORY": "20M"}  # less than the worker's interpreter holds: stopped at its first call
    proc = run_cli("validate", "dist/tiny-llama", "--json", cwd=tmp_path, env=capped)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["passed"] is False and "opening the GenAI folder" in verdict["reasons"][0]
    assert "was stopped for memory" in verdict["reasons"][0] and "INFOPT_WORKER_MEMORY=20M" in verdict["reasons"][0]
    proc = run_cli("gate", "dist/tiny-llama", "--baseline", "dist/tiny-llama", "--json", cwd=tmp_path, env=capped)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    runtime = next(c for c in json.loads(proc.stdout)["checks"] if c["group"] == "runtime")
    assert runtime["passed"] is False and "opening the candidate's GenAI folder was stopped for memory" in runtime["detail"]
    proc = run_cli("build", "tiny-llama", "--task", "text-generation", "-o", "capped", cwd=tmp_path, timeout=600,
                   env=capped)
    assert_clean_failure(proc, 3, "opening the GenAI folder with onnxruntime_genai was stopped for memory",
                         "build a smaller precision (--int4", out=tmp_path / "capped")
