"""A build refused for its output folder leaves nothing behind: run as a user who cannot write the folder (root
without ``CAP_DAC_OVERRIDE``, through ``setpriv``, where the tests run as root), ``infopt build ... --output ro/m``
into a read-only ``ro`` exits 2 before any work, and ``$TMPDIR`` is as it was: no work folder, no
``torchinductor_<user>`` (Inductor's cache lives in infopt's), no worker started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.support.cli import ROOT
from tests.support.payloads import Tiny


def _as_a_user(tmp_path) -> list[str]:
    """The command prefix under which ``tmp_path/ro`` (mode 555) cannot be written."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be made unwritable to this user")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]


@pytest.mark.parametrize("home_writable", [True, False], ids=["cache-writable", "home-read-only"])
def test_a_build_into_a_read_only_folder_exits_2_and_leaves_nothing_in_tmpdir(tmp_path, home_writable):
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(tmp_path / "tiny.pt"))
    (tmp_path / "ro").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "ro").chmod(0o555)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "INFOPT_CACHE_DIR")}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"),
               HOME=str(tmp_path / ("home" if home_writable else "ro")))
    try:
        proc = subprocess.run([*_as_a_user(tmp_path), sys.executable, "-m", "infopt.cli", "build", "tiny.pt",
                               "--input", "x:float32[batch,4]", "--output", "ro/m"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error (bad input): cannot write the output folder") and "Traceback" not in proc.stderr
    assert not any((tmp_path / "ro").iterdir())
    left = sorted(p.name for p in (tmp_path / "tmp").iterdir())
    # a home that cannot be written: infopt's cache falls back to $TMPDIR/infopt-cache-<uid> (a cache kept for the
    # next build, not a work folder); nothing else
    assert left == ([] if home_writable else [f"infopt-cache-{os.getuid()}"])
    if home_writable:
        assert (tmp_path / "home" / ".cache" / "infopt" / "inductor").is_dir()
