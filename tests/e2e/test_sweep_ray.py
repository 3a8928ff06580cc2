"""``infopt sweep --ray ADDRESS`` on a real Ray: a two-node cluster on this machine (``ray.cluster_utils``),
one node a stand-in GPU node (one GPU and the ``accelerator_type:H100`` label Ray gives nodes with an
H100). The sweep's GPU cells must run there and only there; a cell that hangs is stopped at its
timeout; a cell whose worker is killed is retried once, built when the retry lives and reported when
it is killed again; the others finish and the report says each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from infopt.api.sweep_ray import task_options, unplaceable
from infopt.core.target import get_target
from tests.support.cli import ROOT, run_cli, run_cli_here


def test_a_gpu_cell_asks_for_its_gpu_and_is_refused_where_no_node_has_one():
    h100 = task_options(get_target("h100"), 2)
    assert h100 == {"num_cpus": 1, "num_gpus": 1, "accelerator_type": "H100"}
    assert task_options(get_target("cpu"), 3) == {"num_cpus": 3}
    assert task_options(get_target("gpu"), 2) == {"num_cpus": 1, "num_gpus": 1}
    cpu_only = [{"CPU": 8.0}]
    with_l4 = [{"CPU": 8.0}, {"CPU": 4.0, "GPU": 1.0, "accelerator_type:L4": 1.0}]
    assert "no node of the Ray cluster has an H100 GPU" in unplaceable(h100, with_l4)
    assert unplaceable(h100, [*with_l4, {"CPU": 2.0, "GPU": 8.0, "accelerator_type:H100": 1.0}]) is None
    assert unplaceable({"num_cpus": 1, "num_gpus": 1}, cpu_only) == "no node of the Ray cluster has a GPU"
    assert unplaceable({"num_cpus": 16}, with_l4) == "no node of the Ray cluster has 16 CPUs (cpus_per_cell)"


@pytest.fixture
def cluster(monkeypatch):
    ray_utils = pytest.importorskip("ray.cluster_utils")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers' builds import tests.support.bad_models
    monkeypatch.setenv("RAY_worker_niceness", "0")  # Ray's default 15 starves the builds beside the other tests
    nodes = ray_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    gpu = nodes.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    nodes.wait_for_nodes()
    yield nodes, gpu.node_id
    nodes.shutdown()


@pytest.mark.slow
def test_a_sweep_on_ray_places_gpu_cells_on_the_gpu_node_and_reports_lost_and_hung_cells(tmp_path, cluster):
    nodes, gpu_node = cluster
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    torch.jit.save(torch.jit.trace(mlp, torch.randn(2, 4)), str(tmp_path / "mlp.pt"))
    torch.save({"lin.weight": torch.randn(2, 4), "lin.bias": torch.zeros(2)}, tmp_path / "lin.pt")
    torch.save({"w": torch.zeros(1)}, tmp_path / "stuck.pt")
    np.savez(tmp_path / "val.npz", x=np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    spec = {
        "output": "sweeps/ray",
        "models": [
            {"name": "mlp", "model": "mlp.pt", "inputs": ["x:float32[batch,4]"], "dims": ["batch=1:4:8"], "val": "val.npz"},
            {"name": "stuck", "model": "stuck.pt", "model_class": "tests.support.bad_models:Hangs", "inputs": ["x:float32[batch,4]"],
             "timeout_s": 8},
            # its first three builds kill their worker: each of the two cells has two tries, so one cell is
            # lost twice (reported) and the other is built on its retry, whichever order Ray runs them in
            {"name": "lost", "model": "lin.pt", "model_class": "tests.support.bad_models:KillsItsWorker", "inputs": ["x:float32[batch,4]"],
             "model_args": json.dumps({"log": str(tmp_path / "lost.log"), "times": 3})},
        ],
        "targets": ["cpu", "h100"],
        "precisions": ["fp32"],
        "backends": ["onnxruntime"],
        "batch_sizes": [1],
        "max_abs": 1e-4,
        "cpus_per_cell": 1,
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    proc = run_cli("sweep", "sweep.yaml", "--ray", nodes.address, "--json", cwd=tmp_path, timeout=400)
    assert proc.returncode == 1, proc.stderr  # the hung and the lost cells did not pass
    assert "Traceback" not in proc.stderr and "Ray: 2 node(s), 3 CPUs, 1 GPUs" in proc.stderr
    assert proc.stdout.lstrip().startswith("{")  # Ray's own notices (a worker died) kept off stdout
    cells = {(c["model"], c["target"]): c for c in json.loads(proc.stdout)["cells"]}
    assert len(cells) == 6
    for (model, target), cell in cells.items():
        if target == "h100" and cell["ran_on"] is not None:
            assert gpu_node in cell["ran_on"], (model, cell["ran_on"])  # GPU cells only on the H100 node
    for target in ("cpu", "h100"):
        built = cells[("mlp", target)]
        assert built["status"] == "passed" and built["summary"]["drift"]["max_abs"] <= 1e-4, built
        stuck = cells[("stuck", target)]
        assert stuck["status"] == "timeout" and "8 s" in stuck["error"]
    assert gpu_node in cells[("mlp", "h100")]["ran_on"]
    lost = sorted((cells[("lost", t)] for t in ("cpu", "h100")), key=lambda c: c["status"])
    assert [c["status"] for c in lost] == ["error", "passed"], lost
    assert "lost, and again on the retry" in lost[0]["error"] and lost[0]["ran_on"] is None
    assert len((tmp_path / "lost.log").read_text().splitlines()) == 4  # two cells, each retried once
    folder = "sweeps/ray/mlp/h100-fp32-onnxruntime"
    verified = run_cli("verify", folder, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout  # the folder that came back is what the worker built
    assert not [p.name for p in (tmp_path / "sweeps" / "ray" / "mlp").iterdir() if p.name.startswith(".")]  # no stage or lock left
    report = json.loads((tmp_path / "sweeps" / "ray" / "sweep.json").read_text())
    # the stand-in H100 node has no GPU, so the h100 cell validated on its CPU: shown, not chosen
    assert cells[("mlp", "h100")]["summary"]["measured_on_target"] is False
    assert report["chosen"]["mlp"] == {"cpu": "cpu-fp32-onnxruntime"}
    assert "timed on this machine, not on the target: h100" in (tmp_path / "sweeps" / "ray" / "sweep.md").read_text()
    assert 'id="pareto-mlp"' in (tmp_path / "sweeps" / "ray" / "sweep.html").read_text()


@pytest.mark.parametrize(("address", "code", "says"), [
    ("127.0.0.1:1", 4, "cannot reach a Ray cluster at 127.0.0.1:1"),  # nothing listens there
    ("headnode", 2, "--ray headnode: not a Ray cluster address"),
])
def test_a_ray_address_that_cannot_work_is_refused_at_once(tmp_path, address, code, says):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"models": [{"model": "m.pt", "inputs": ["x:float32[batch,4]"]}]}))
    proc = run_cli_here("sweep", "sweep.yaml", "--ray", address, cwd=tmp_path)
    assert proc.returncode == code and says in proc.stderr and "fix:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
