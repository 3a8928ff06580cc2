"""The output folder is written whole or not at all: force only over infopt's own folders, one build
at a time, and processes killed at any point leave either the old or the new complete output."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infopt.core.errors import OutputExistsError, UsageError
from infopt.core.manifest import file_table, verify_files
from infopt.core.manifest_schema import FileEntry
from infopt.exporters.staging import claim_output, clean_stale, staged_output
from tests.support.cli import ROOT


def write_output(stage: Path, tag: str, files: int = 3, size: int = 1024) -> None:
    (stage / "model").mkdir()
    for i in range(files):
        (stage / "model" / f"w{i}.bin").write_bytes(os.urandom(size))
    stand_in = {"schema": "infopt.manifest/1", "tag": tag, "files": file_table(stage)}  # not a build's manifest
    (stage / "manifest.json").write_text(json.dumps(stand_in))


def listed(manifest: dict) -> dict[str, FileEntry]:
    return {rel: FileEntry.model_validate(entry) for rel, entry in manifest["files"].items()}


def assert_whole(out: Path, tags: set[str]) -> str:
    """``out`` is a complete output (every listed file matches) with one of ``tags``; nothing lies beside it."""
    manifest = json.loads((out / "manifest.json").read_text())  # a stand-in manifest, not a build's
    assert verify_files(out, listed(manifest)) == []
    assert manifest["tag"] in tags
    leftovers = [p.name for p in out.parent.iterdir() if p.name != out.name]
    assert leftovers == [], leftovers
    return manifest["tag"]


def test_staged_output_renames_into_place(tmp_path):
    out = tmp_path / "dist" / "m"
    with staged_output(out, force=False) as stage:
        write_output(stage, "new")
        assert not out.exists()
    assert assert_whole(out, {"new"}) == "new"


def test_failure_leaves_nothing(tmp_path):
    out = tmp_path / "m"
    with pytest.raises(RuntimeError):
        with staged_output(out, force=False) as stage:
            (stage / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_needs_force_and_force_replaces_an_infopt_output(tmp_path):
    out = tmp_path / "m"
    with staged_output(out, force=False) as stage:
        write_output(stage, "old")
    with pytest.raises(OutputExistsError, match="--force"):
        with staged_output(out, force=False):
            pass
    with staged_output(out, force=True) as stage:
        write_output(stage, "new")
    assert assert_whole(out, {"new"}) == "new"


@pytest.mark.parametrize("content", [{"notes.txt": "mine"}, {"manifest.json": '{"schema": "someone-else/1"}'}])
def test_force_never_replaces_a_folder_infopt_did_not_write(tmp_path, content):
    out = tmp_path / "m"
    out.mkdir()
    for name, text in content.items():
        (out / name).write_text(text)
    with pytest.raises(UsageError, match="not an infopt output"):
        with staged_output(out, force=True):
            pass
    assert {p.name: p.read_text() for p in out.iterdir()} == content
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_current_folder_and_its_parents_are_refused(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    for output in (".", "..", "./"):
        with pytest.raises(UsageError, match="current folder"):
            with staged_output(Path(output), force=True):
                pass
    assert [p.name for p in tmp_path.iterdir()] == ["work"]


def test_overlong_name_is_refused_before_work(tmp_path):
    with pytest.raises(UsageError, match="at most 200"):
        with staged_output(tmp_path / ("m" * 230), force=False):
            pass
    assert list(tmp_path.iterdir()) == []


def test_unwritable_parent(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write"):
        with staged_output(blocker / "m", force=False):
            pass


HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from infopt.exporters.staging import claim_output
    with claim_output(Path(sys.argv[1]), force=True):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_second_build_into_the_same_output_fails_at_once_naming_the_first(tmp_path):
    out = tmp_path / "m"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=f"another infopt build \\(pid {holder.pid}\\) is writing"):
            with claim_output(out, force=True):
                pass
    finally:
        holder.kill()
        holder.wait()
    with claim_output(out, force=True):  # the lock died with its holder
        pass
    assert list(tmp_path.iterdir()) == []


def test_stale_siblings_are_cleaned_and_a_moved_aside_output_is_restored(tmp_path):
    out = tmp_path / "m"
    old = tmp_path / f".m.old-{1 << 22}-abcd1234"
    old.mkdir()
    write_output(old, "old")
    for name in (".m.tmp-77-zzzz", ".m.probe-77-yyyy"):
        (tmp_path / name).mkdir()
    (tmp_path / ".other.tmp-5-q").mkdir()
    (tmp_path / "m.tmp-5-keep").mkdir()  # an output of its own whose name merely looks like one
    with claim_output(out, force=True):
        assert assert_whole_parent(out) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-5-q", "m", "m.tmp-5-keep"]
    assert [p.name for p in clean_stale(tmp_path)] == [".other.tmp-5-q"]


def assert_whole_parent(out: Path) -> str:
    manifest = json.loads((out / "manifest.json").read_text())  # a stand-in manifest, not a build's
    assert verify_files(out, listed(manifest)) == []
    return manifest["tag"]


REPLACER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from infopt.exporters import staging
    import json
    from infopt.core.manifest import file_table

    def terminated(signum, frame):  # as the CLI does
        staging.stop_now()
        os._exit(143)

    def write_output(stage, tag, files, size):
        (stage / "model").mkdir()
        for i in range(files):
            (stage / "model" / f"w{i}.bin").write_bytes(os.urandom(size))
        stand_in = {"schema": "infopt.manifest/1", "tag": tag, "files": file_table(stage)}
        (stage / "manifest.json").write_text(json.dumps(stand_in))

    signal.signal(signal.SIGTERM, terminated)
    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode != "random":
        if mode.startswith("fallback"):
            staging.exchange = lambda a, b: False
        real_rename, real_replace, real_exchange = os.rename, os.replace, staging.exchange
        def killing(real, after):
            def call(*args):
                result = real(*args)
                if after:
                    os.kill(os.getpid(), signal.SIGKILL)
                return result
            return call
        point = mode.split(":")[1]
        staging.exchange = killing(real_exchange, point == "exchange")
        staging.os.replace = killing(real_replace, point == "first-rename")
        staging.os.rename = killing(real_rename, point == "second-rename")
    n = 0
    while True:
        n += 1
        with staging.staged_output(out, force=True) as stage:
            write_output(stage, f"new-{n}", files=6, size=64 * 1024)
            print(n, flush=True)
""")


def _replacer(out: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", REPLACER, str(out), mode], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("mode", ["exchange:exchange", "fallback:first-rename", "fallback:second-rename"])
def test_killed_between_the_steps_of_a_replacement(tmp_path, mode):
    out = tmp_path / "m"
    with staged_output(out, force=False) as stage:
        write_output(stage, "old")
    proc = _replacer(out, mode)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with claim_output(out, force=True):  # the next build: restores or keeps, and cleans
        pass
    tag = assert_whole(out, {"old", "new-1"})
    assert tag == ("old" if mode.endswith("first-rename") else "new-1")


def test_fifty_random_kills_leave_the_old_or_the_new_output_whole(tmp_path):
    rng = random.Random(14)
    out = tmp_path / "m"
    with staged_output(out, force=False) as stage:
        write_output(stage, "new-0")
    seen = set()
    for i in range(50):
        proc = _replacer(out, "random")
        proc.stdout.readline() if rng.random() < 0.5 else None  # half the kills after at least one replacement
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(signal.SIGKILL if i % 2 else signal.SIGTERM)
        proc.wait(timeout=30)
        with claim_output(out, force=True):
            pass
        seen.add(assert_whole(out, {f"new-{n}" for n in range(1000)}))
    assert len(seen) > 5  # the kills did land at many points of many replacements
    assert json.loads((out / "manifest.json").read_text())["schema"] == "infopt.manifest/1"
