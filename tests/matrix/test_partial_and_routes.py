"""What the matrix cells do not show: a failed candidate, the INT4 graph route's refusals."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest

from infopt.core.errors import BuildError
from tests.matrix import models as M
from tests.support.cli import assert_clean_failure, run_cli, run_cli_here


@pytest.fixture
def mlp_files(tmp_path):
    for fmt in ("torchscript", "onnx"):
        M.save("OddMLP", fmt, tmp_path)
    return tmp_path


def test_a_failed_candidate_is_left_out_and_listed_unless_strict(tmp_path, monkeypatch):
    """The fused-ONNX candidate is made to fail: the best of the others ships and the manifest lists the
    failure; with strict the build stops naming it and writes nothing."""
    import dataclasses

    import infopt
    import infopt.core.pipeline
    from infopt.core.pass_api import get_pass

    def broken(artifact, options, context):
        raise BuildError("fusion broke on purpose")

    def patched(name):
        found = get_pass(name)
        return dataclasses.replace(found, run=broken) if name == "transformer_fusion" else found

    monkeypatch.setattr(infopt.core.pipeline, "get_pass", patched)
    monkeypatch.chdir(tmp_path)
    model = M.make("OddMLP")
    with pytest.raises(BuildError, match="1 of 3 candidates failed: fp32-onnxruntime-fused: fusion broke") as info:
        infopt.build(model, inputs=M.OddMLP.inputs, dims=["batch=1:2:4"], backend="auto", strict=True, progress=False)
    assert "without --strict" in info.value.fix and not (tmp_path / "dist" / "oddmlp").exists()
    result = infopt.build(model, inputs=M.OddMLP.inputs, dims=["batch=1:2:4"], progress=False)
    rows = {c["recipe"]: c for c in result.manifest.candidates}
    assert rows["fp32-onnxruntime-fused"]["status"] == "failed" and "fusion broke" in rows["fp32-onnxruntime-fused"]["reason"]
    assert result.passed and rows[result.manifest.recipe["name"]]["chosen"]
    assert "fp32-onnxruntime-fused" in (result.output_dir / "report.md").read_text()


def test_the_cli_warns_of_a_failed_candidate_and_strict_exits_3(mlp_files, monkeypatch):
    """The same failure through the CLI's own entry point: one warning line on stderr and exit 0; with
    --strict, exit 3 naming the candidate, no traceback and no output folder."""
    import dataclasses

    import infopt.core.pipeline
    from infopt.core.pass_api import get_pass

    def broken(artifact, options, context):
        raise BuildError("fusion broke on purpose")

    monkeypatch.setattr(infopt.core.pipeline, "get_pass", lambda name: dataclasses.replace(get_pass(name), run=broken)
                        if name == "transformer_fusion" else get_pass(name))
    args = ["build", "OddMLP.onnx", "-q", "-o", "out"]
    proc = run_cli_here(*args, cwd=mlp_files)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: candidate")]
    assert len(warnings) == 1 and "fp32-onnxruntime-fused failed" in warnings[0] and "--strict" in warnings[0]
    assert (mlp_files / "out" / "manifest.json").exists()
    proc = run_cli_here(*args[:-2], "-o", "strict", "--strict", cwd=mlp_files)
    assert proc.returncode == 3 and "fp32-onnxruntime-fused: fusion broke on purpose" in proc.stderr
    assert "Traceback" not in proc.stderr and not (mlp_files / "strict").exists()


@pytest.mark.parametrize("source", ["OddMLP_ts.pt", "OddMLP.onnx"])
def test_int4_graph_route_quantizes_what_divides_and_names_the_rest(mlp_files, source):
    args = ["--input", M.OddMLP.inputs[0], "--dim", "batch=1:2:4"] if source.endswith(".pt") else []
    proc = run_cli("build", source, *args, "--int4", "--backend", "onnxruntime", "--json",
                   "-q", cwd=mlp_files)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads(proc.stdout)
    graph = next(p for p in manifest["passes"] if p["name"] == "quantize_int4_graph")["details"]
    assert [row["group_size"] for row in graph["layers"]] == [32]  # 96 input features: 32 divides, 128/64 do not
    assert len(graph["kept"]) == 2 and all("input features" in why for why in graph["kept"].values())
    model = onnx.load(str(mlp_files / "dist" / source.split(".")[0] / "model" / "model.onnx"))
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 1
    assert manifest["validation"]["drift"]["worst"]["cosine_mean"] >= 0.98


def test_int4_methods_and_backends_that_need_the_module_are_refused(mlp_files):
    proc = run_cli("build", "OddMLP_ts.pt", "--input", M.OddMLP.inputs[0], "--int4", "--int4-method", "gptq",
                   "--backend", "onnxruntime", "--calib", "none.npz", cwd=mlp_files)
    assert proc.returncode == 2  # the missing calibration file is caught first
    shutil.copy(mlp_files / "OddMLP_ts.pt", mlp_files / "m.pt")
    proc = run_cli("build", "m.pt", "--input", M.OddMLP.inputs[0], "--dim", "batch=1:2:4", "--int4",
                   "--int4-method", "awq", "--backend", "onnxruntime", cwd=mlp_files)
    assert_clean_failure(proc, 2, "AWQ", "--int4-method rtn", out=mlp_files / "dist" / "m")
    proc = run_cli("build", "m.pt", "--input", M.OddMLP.inputs[0], "--int4", "--backend", "inductor", cwd=mlp_files)
    assert_clean_failure(proc, 2, "needs the model's Python module", "--backend onnxruntime", out=mlp_files / "dist" / "m")


def test_a_gpu_build_whose_gpu_candidates_failed_does_not_ship_a_cpu_fallback():
    """The decision alone (no GPU here): with a failure, a survivor must run on the target's kind of
    device; a GPU target left with a CPU-only survivor is exit 3, a CPU target ships it."""
    from types import SimpleNamespace

    from infopt.api.candidates import Candidate, survivors
    from infopt.core.recipe import load_recipe

    recipe = load_recipe("fp32-onnxruntime")

    def candidate(status, device):
        c = Candidate(recipe, status=status, reason="broke" if status == "failed" else "")
        c.runner = SimpleNamespace(device=device) if status == "built" else None
        return c

    cpu_only = [candidate("failed", None), candidate("built", "cpu")]
    assert len(survivors(cpu_only, True, "cpu")) == 1
    with pytest.raises(BuildError, match="every candidate that runs on cuda failed") as info:
        survivors(cpu_only, True, "cuda")
    assert "--target cpu" in info.value.fix
    assert len(survivors([candidate("failed", None), candidate("built", "cuda"), candidate("built", "cpu")], True, "cuda")) == 2
    assert len(survivors([candidate("built", "cpu")], True, "cuda")) == 1  # no failure: a build for a GPU made here


def test_a_declared_batch_mix_decides_between_candidates_fast_at_different_batch_sizes():
    """One candidate wins at batch 1, the other at batch 32: the mix the model serves picks the one shipped."""
    from types import SimpleNamespace

    from infopt.api.candidates import Candidate, choose
    from infopt.core.recipe import load_recipe
    from infopt.validators.timing import RatioEstimate, Timings

    def built(name):
        c = Candidate(load_recipe(name), status="built")
        c.runner, c.verdict = SimpleNamespace(device="cpu"), SimpleNamespace(passed=True)
        return c

    small, large = built("fp32-onnxruntime"), built("fp32-inductor")
    def ratio(batch, value):
        return RatioEstimate(batch, value, 1.0, value, value, value, 0.97, 5, 3)

    timings = Timings([], {small.label: [ratio(1, 0.2), ratio(32, 0.8)], large.label: [ratio(1, 0.5), ratio(32, 0.2)]})
    target = SimpleNamespace(device="cpu", name="cpu", backends=("onnxruntime", "inductor"))
    assert choose([small, large], timings, target, {1: 0.95, 32: 0.05})[0] is small
    chosen, why = choose([small, large], timings, target, {1: 0.05, 32: 0.95})
    assert chosen is large and "weighted by the declared batch mix (1: 5%, 32: 95%)" in why
    assert abs(large.speedup(timings, {1: 0.05, 32: 0.95}) - (2.0 ** 0.05) * (5.0 ** 0.95)) < 1e-9


def test_on_a_gpu_target_a_candidate_validated_on_the_gpu_wins_over_a_faster_one_run_on_the_cpu():
    from types import SimpleNamespace

    from infopt.api.candidates import Candidate, choose
    from infopt.core.recipe import load_recipe
    from infopt.validators.timing import RatioEstimate, Timings

    def built(name, device):
        c = Candidate(load_recipe(name), status="built")
        c.runner, c.verdict = SimpleNamespace(device=device), SimpleNamespace(passed=True)
        return c

    def ratio(value):
        return [RatioEstimate(1, value, 1.0, value, value, value, 0.97, 5, 3)]

    on_cpu, on_gpu, also_gpu = built("fp8-onnxruntime", "cpu"), built("fp8-inductor", "cuda"), built("fp8-tensorrt", "cuda")
    target = SimpleNamespace(device="cuda", name="h100", backends=("tensorrt", "onnxruntime", "inductor"))
    timings = Timings([], {on_cpu.label: ratio(0.1), on_gpu.label: ratio(0.9), also_gpu.label: ratio(0.5)})
    chosen, why = choose([on_cpu, on_gpu], timings, target)
    assert chosen is on_gpu and why.startswith("the only candidate that passed validation on the GPU")
    assert choose([on_cpu, on_gpu, also_gpu], timings, target)[0] is also_gpu  # the fastest of those on the GPU
