"""A cache folder that cannot be written does not stop a build: it caches in ``$TMPDIR/infopt-cache-<uid>`` and says
so once (``core/cache.py``). Before, a home the user cannot write ended the build with a traceback."""

from __future__ import annotations

import os

import torch

from tests.support.cli import run_cli
from tests.support.payloads import Tiny


def test_an_unwritable_cache_folder_is_a_warning_and_the_build_goes_on(tmp_path):
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(tmp_path / "tiny.pt"))
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "tmp").mkdir()
    proc = run_cli("build", "tiny.pt", "--input", "x:float32[batch,4]", "--backend", "onnxruntime", "-o", "out",
                   "--batch-sizes", "1", cwd=tmp_path,
                   env={"INFOPT_CACHE_DIR": "afile/cache", "TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "cannot be written" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: infopt's cache folder afile/cache cannot be written")
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert (tmp_path / "tmp" / f"infopt-cache-{os.getuid()}" / "machine").is_dir()  # where it cached instead
