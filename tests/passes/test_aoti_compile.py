"""AOTInductor: the .pt2 package matches eager across the batch range, its outputs keep the spec's
dim names, Inductor's cache lands in infopt's cache folder, and ``infopt.compile`` in process."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import infopt
from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from infopt.core.pass_api import PassContext
from infopt.core.target import get_target
from infopt.exporters.torch_export import export_module, exported_outputs
from infopt.passes.fx.cast_precision import cast_module
from infopt.passes.lower.aoti_compile import InductorOptions, run
from infopt.runtime.backends import runner_for_file
from infopt.runtime.backends.inductor import AotiRunner

SPEC = InputSpec.parse(["x:float32[batch,1,8,8]"], ["batch=1:8:64"])


@pytest.fixture(scope="module")
def compiled(digits, tmp_path_factory):
    model, _ = digits
    work = tmp_path_factory.mktemp("aoti")
    mp = pytest.MonkeyPatch()
    mp.setenv("INFOPT_CACHE_DIR", str(work / "cache"))
    mp.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    program = export_module(model, SPEC)
    artifact = Artifact("exported", SPEC, obj=program, output_names=("logits",))
    outcome = run(artifact, InductorOptions(), PassContext(get_target("cpu"), work))
    seen_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    mp.undo()
    return outcome, work, seen_env


def test_package_matches_eager_across_the_batch_range(compiled, digits):
    outcome, _, _ = compiled
    model, data = digits
    assert outcome.artifact.kind == "aoti" and outcome.artifact.path.suffix == ".pt2"
    runner = runner_for_file(outcome.artifact.path, ["x"], ["logits"])
    assert isinstance(runner, AotiRunner) and runner.device == "cpu"
    x = data["val"][0]
    for batch in (1, 37, 64):
        got = runner(x[:batch])
        with torch.inference_mode():
            want = model(torch.from_numpy(x[:batch])).numpy()
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert outcome.details.inductor_configs == {"freezing": True, "max_autotune": False}


def test_cuda_graphs_reach_the_package_runner_and_stay_off_for_a_cpu_package(compiled):
    from infopt.runtime import backends

    outcome, _, _ = compiled
    assert backends.named("inductor").graphs and not backends.named("onnxruntime").graphs
    runner = runner_for_file(outcome.artifact.path, ["x"], ["logits"], cuda_graphs=True)
    assert runner.device == "cpu" and runner.graphs is None
    assert backends.named("inductor").describe(runner) == "cpu (AOTInductor package)"


def test_inductor_cache_is_kept_in_infopts_cache_folder(compiled):
    outcome, work, seen_env = compiled
    cache = work / "cache" / "inductor"
    assert outcome.details.cache == str(cache)
    assert any(cache.rglob("*")), "Inductor wrote nothing into infopt's cache folder"
    assert seen_env != str(cache)  # the setting was only held during the compile


def test_outputs_keep_the_specs_dim_names(compiled):
    outcome, _, _ = compiled
    assert exported_outputs(outcome.artifact.obj, SPEC, ("logits",)) == [("logits", "float32", ("batch", 10))]


def test_outputs_of_a_copied_program_whose_input_torch_renamed():
    """An input named ``input`` (nn.Sequential's) is ``input_1`` in a copy of the program (candidates
    that share passes start from copies), while the signature still says ``input``."""
    import copy

    model = torch.nn.Sequential(torch.nn.Linear(16, 4)).eval()
    spec = InputSpec.parse(["input:float32[batch,16]"], ["batch=1:4:8"])
    program = copy.deepcopy(torch.export.export(model, (torch.randn(2, 16),),
                                                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},)))
    assert [n.name for n in program.graph.nodes if n.op == "placeholder"][-1] != "input"
    assert exported_outputs(program, spec, ("y",)) == [("y", "float32", ("batch", 4))]


def test_cast_module_computes_in_bf16_with_float32_io(digits):
    model, data = digits
    wrapped = cast_module(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in wrapped.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the caller's model is untouched
    x = torch.from_numpy(data["val"][0][:32])
    with torch.inference_mode():
        got, want = wrapped(x), model(x)
    assert got.dtype == torch.float32
    assert (got - want).abs().max() > 0  # it really computed in bf16
    assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.95


def test_infopt_compile_runs_the_recipes_inductor_options(digits, tmp_path, monkeypatch):
    model, data = digits
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # empty reads as unset; monkeypatch removes what compile sets
    compiled = infopt.compile(model, target="cpu")
    x = torch.from_numpy(data["val"][0][:16])
    with torch.inference_mode():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), atol=1e-4)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_infopt_compile_refuses_a_precision_the_target_cannot_run(digits):
    from infopt.core.errors import RecipeError

    with pytest.raises(RecipeError, match="does not run fp16"):
        infopt.compile(digits[0], target="cpu", precision="fp16")


def test_cuda_package_needs_a_gpu_here(digits, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    from infopt.core.errors import EnvironmentProblem

    artifact = Artifact("exported", SPEC, obj=export_module(digits[0], SPEC))
    with pytest.raises(EnvironmentProblem, match="CUDA GPU") as info:
        run(artifact, InductorOptions(device="cuda"), PassContext(get_target("h100"), tmp_path))
    assert info.value.exit_code == 4


def test_a_bf16_lstm_skips_onednn_only_where_the_cpu_has_no_bf16_kernels():
    from infopt.passes.lower.aoti_compile import lstm_lacks_onednn_kernel

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(6, 8, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    spec = InputSpec.parse(["x:float32[batch,3,6]"], ["batch=1:2:4"])
    float32 = export_module(Recurrent().eval(), spec)
    bf16 = export_module(cast_module(Recurrent().eval(), torch.bfloat16), spec)
    assert not lstm_lacks_onednn_kernel(float32)
    assert lstm_lacks_onednn_kernel(bf16) == (not torch.ops.mkldnn._is_mkldnn_bf16_supported())
    linear = export_module(torch.nn.Linear(6, 8).eval(), InputSpec.parse(["x:float32[batch,6]"], ["batch=1:2:4"]))
    assert not lstm_lacks_onednn_kernel(linear)
