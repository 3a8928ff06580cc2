"""``infopt sweep`` in a local process pool, as a user runs it: a sweep file with relative paths, a cell
that builds, one whose model is missing, one that hangs past its timeout and one its target cannot
run; the report says each, and the others are not held up. A second run reuses the built cell."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
import yaml

from tests.support.cli import run_cli, run_cli_here

SWEEP = {
    "output": "sweeps/night",
    "models": [
        {"name": "mlp", "model": "mlp.pt", "inputs": ["x:float32[batch,4]"], "dims": ["batch=1:4:8"], "val": "val.npz"},
        {"name": "gone", "model": "missing.pt", "inputs": ["x:float32[batch,4]"]},
        {"name": "stuck", "model": "stuck.pt", "model_class": "tests.support.bad_models:Hangs", "inputs": ["x:float32[batch,4]"],
         "timeout_s": 12},
    ],
    "targets": ["cpu"],
    "precisions": ["fp32", "fp16"],
    "backends": ["onnxruntime"],
    "batch_sizes": [1],
    "max_abs": 1e-4,
}


@pytest.fixture
def workdir(tmp_path):
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    torch.jit.save(torch.jit.trace(mlp, torch.randn(2, 4)), str(tmp_path / "mlp.pt"))
    torch.save({"w": torch.zeros(1)}, tmp_path / "stuck.pt")  # loading it builds Hangs(), which never returns
    np.savez(tmp_path / "val.npz", x=np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    return tmp_path


@pytest.mark.slow
def test_a_local_sweep_reports_every_cell_and_is_not_stopped_by_a_failed_or_hung_one(workdir):
    start = time.monotonic()
    proc = run_cli("sweep", "sweep.yaml", "--jobs", "2", "--junit", "sweep.xml", cwd=workdir, timeout=400)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr  # two cells that could run did not pass
    assert "Traceback" not in proc.stderr and "stuck cpu-fp32-onnxruntime: timeout" in proc.stderr
    root = workdir / "sweeps" / "night"
    report = json.loads((root / "sweep.json").read_text())
    cells = {(c["model"], c["precision"]): c for c in report["cells"]}
    assert len(cells) == 6
    built = cells[("mlp", "fp32")]
    assert built["status"] == "passed" and built["summary"]["passed"] and built["summary"]["drift"]["max_abs"] <= 1e-4
    assert (root / "mlp" / "cpu-fp32-onnxruntime" / "manifest.json").is_file()
    verified = run_cli("verify", "sweeps/night/mlp/cpu-fp32-onnxruntime", cwd=workdir)
    assert verified.returncode == 0, verified.stdout  # the cell's folder is exactly what its build wrote
    assert built["summary"]["latency"][0]["batch"] == 1 and built["summary"]["latency"][0]["p50_ms"] > 0
    gone = cells[("gone", "fp32")]
    assert gone["status"] == "error" and gone["exit_code"] == 2 and "missing.pt" in gone["error"]
    stuck = cells[("stuck", "fp32")]
    assert stuck["status"] == "timeout" and "12 s" in stuck["error"] and 12 <= stuck["seconds"] < 50
    assert all(cells[(m, "fp16")]["status"] == "unsupported" and "does not run fp16" in cells[(m, "fp16")]["error"]
               for m in ("mlp", "gone", "stuck"))
    assert report["chosen"] == {"mlp": {"cpu": "cpu-fp32-onnxruntime"}}
    assert report["pareto"]["mlp"] == ["cpu-fp32-onnxruntime"]
    assert took < 120  # the hung cell held one worker for its timeout, not the sweep
    markdown = (root / "sweep.md").read_text()
    assert "| cpu-fp32-onnxruntime | passed |" in markdown and "chosen, front" in markdown
    html = (root / "sweep.html").read_text()
    assert 'id="pareto-mlp"' in html and "<svg" in html
    junit = (workdir / "sweep.xml").read_text()
    assert junit.count("<testcase") == 6 and 'failures="2"' in junit and 'skipped="3"' in junit

    (workdir / "sweep.yaml").write_text(yaml.safe_dump({**SWEEP, "models": SWEEP["models"][:1]}))
    again = run_cli("sweep", "sweep.yaml", "--json", "-q", cwd=workdir, timeout=400)
    statuses = {(c["model"], c["precision"]): c["status"] for c in json.loads(again.stdout)["cells"]}
    assert statuses[("mlp", "fp32")] == "reused" and again.returncode == 0  # same command, same bytes in: not rebuilt


def test_the_python_api_reads_the_same_file_and_lays_out_the_same_cells(tmp_path):
    import infopt
    from infopt.core.sweep_spec import cells, read_sweep

    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({**SWEEP, "models": SWEEP["models"][1:2]}))
    spec = read_sweep(tmp_path / "sweep.yaml")
    grid = cells(spec, tmp_path, tmp_path / "out")
    assert [c.label for c in grid] == ["cpu-fp32-onnxruntime", "cpu-fp16-onnxruntime"]
    assert grid[0].folder == tmp_path / "out" / "gone" / "cpu-fp32-onnxruntime" and grid[1].unsupported
    assert ["--max-abs", "0.0001"] == grid[0].args[grid[0].args.index("--max-abs"):][:2]
    result = infopt.sweep(tmp_path / "sweep.yaml", jobs=1)
    assert [c.status for c in result.cells] == ["error", "unsupported"] and not result.passed
    assert (tmp_path / "sweeps" / "night" / "sweep.md").is_file()


def test_a_sweep_file_with_a_mistake_is_exit_2_naming_it(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"models": [{"model": "m.pt"}], "targets": ["cpu", "tpu9"]}))
    proc = run_cli_here("sweep", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown target 'tpu9'" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"models": [{"model": "m.pt", "inptus": []}]}))
    proc = run_cli_here("sweep", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "models.0.inptus" in proc.stderr
    assert not (tmp_path / "sweeps").exists()


def test_a_gpu_cell_timed_on_a_cpu_is_neither_chosen_nor_on_the_front():
    """A local sweep on a machine without the GPU validates an h100 cell on the CPU: its figures are not the
    H100's, so the comparison shows them but picks nothing from them, and says why."""
    from infopt.report.sweep import chosen, pareto, to_markdown

    def cell(target, p50, on_target, measured_on):
        return {"model": "m", "target": target, "precision": "fp32", "backend": "onnxruntime", "status": "passed",
                "summary": {"passed": True, "drift": {"cosine_mean": 0.999}, "measured_on": measured_on,
                            "measured_on_target": on_target,
                            "latency": [{"batch": 1, "p50_ms": p50, "p99_ms": p50 * 2, "throughput": 1e3 / p50}]}}

    cpu = cell("cpu", 2.0, True, "cpu (onnxruntime CPUExecutionProvider)")
    h100 = cell("h100", 1.0, False, "cpu (onnxruntime CPUExecutionProvider)")
    assert chosen([cpu, h100]) == {"m": {"cpu": "cpu-fp32-onnxruntime"}}
    assert pareto([cpu, h100]) == [cpu]
    markdown = to_markdown([cpu, h100])
    assert "| h100-fp32-onnxruntime | passed |" in markdown  # shown, with its figures
    assert "timed on this machine, not on the target: h100 (cpu (onnxruntime CPUExecutionProvider))" in markdown
    h100["summary"]["measured_on_target"] = True  # timed on an H100 (a Ray node with one): it counts
    assert chosen([cpu, h100])["m"]["h100"] == "h100-fp32-onnxruntime" and pareto([cpu, h100]) == [h100]
