"""The measured roof of a ``cpu`` target: measured once, kept for a day in the cache folder, measured
again when it is older or was measured on another machine."""

from __future__ import annotations

import json
import time

from infopt.validators import machine


def test_the_roof_is_measured_once_a_day_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path))
    bandwidth, peak, how = machine.measured_roof()
    assert bandwidth > 0.1 and peak > 1e-4 and "kept" not in how
    kept = json.loads((tmp_path / "machine" / "roof.json").read_text())
    assert kept["bandwidth"] == bandwidth and kept["peak"] == peak

    again = machine.measured_roof()
    assert again[:2] == (bandwidth, peak) and "(kept for a day)" in again[2] and again[2].startswith(how)

    for stale in ({"when": time.time() - machine.ROOF_MAX_AGE_S - 60}, {"key": "another machine"}):
        (tmp_path / "machine" / "roof.json").write_text(json.dumps({**kept, **stale}))
        assert "kept" not in machine.measured_roof()[2]  # measured afresh
    (tmp_path / "machine" / "roof.json").write_text("{not json")
    assert "kept" not in machine.measured_roof()[2]  # a damaged file is measured over, not an error
