"""The backend and server registries are complete, and extending either is one registration.

docs/ARCHITECTURE.md lists the files to touch to add a backend or a server; these tests keep that
list honest: everything the bundled targets and recipes name is registered, every backend has a
runner and a server, and a backend or server registered from outside the packages is used by the
real build and load paths without any other change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import infopt
from infopt.core.artifact import STAGE
from infopt.core.errors import UsageError
from infopt.core.manifest import read_manifest
from infopt.core.recipe import bundled_recipes, load_recipe
from infopt.core.target import targets
from infopt.exporters import servers
from infopt.exporters.servers import emitter as emitter_registry
from infopt.runtime import backend as backend_registry
from infopt.runtime import backends
from infopt.runtime.runner import Runner


def test_every_backend_a_target_or_recipe_names_is_registered():
    known = backends.registered()
    named = {b for t in targets().values() for b in t.backends}
    named |= {load_recipe(path).backend for path in bundled_recipes().values()}
    assert named and named <= set(known), named - set(known)


def test_every_server_a_recipe_or_backend_names_is_registered():
    emitters = {e.name for e in servers.registered()}
    assert {"triton", "torchserve", "kserve"} <= emitters
    for path in bundled_recipes().values():
        assert set(load_recipe(path).emit or ()) - {"onnx"} <= emitters, path
    for e in servers.registered():
        assert e.serves and set(e.serves) <= set(STAGE), e.name


def test_every_backend_is_served_by_some_server():
    for b in backends.registered().values():
        assert any(e.serves_backend(b) for e in servers.registered()), b.name


def test_each_backend_is_whole():
    found = backends.registered()
    suffixes = [b.suffix for b in found.values()]
    assert len(set(suffixes)) == len(suffixes)
    for b in found.values():
        assert b.representation in STAGE and b.suffix.startswith(".") and b.runner_kind
        assert callable(b.open_runner) and all(isinstance(b.unavailable(p, d), (str, type(None)))
                                               for p in ("fp32", "bf16") for d in ("cpu", "cuda"))
        assert backends.for_file(f"model{b.suffix}") is b


def test_an_unknown_model_file_is_a_clear_error():
    with pytest.raises(UsageError, match="not a model file any backend runs"):
        backends.runner_for_file("weights.bin")


class _DoublingRunner(Runner):
    kind = "doubling"

    def __init__(self, path: Path, input_names):
        self.scale = float(Path(path).read_text())
        self.input_names = tuple(input_names)

    def run(self, feed):
        return [feed[n] * self.scale for n in self.input_names]


def test_a_backend_registered_from_one_module_is_opened_by_suffix(tmp_path, monkeypatch):
    toy = backend_registry.Backend(name="toy", representation="onnx", suffix=".toy", runner_kind="doubling",
                                   open_runner=lambda path, names, outs, threads=0, device="cpu": _DoublingRunner(path, names))
    monkeypatch.setitem(backend_registry.BACKENDS.items, "toy", toy)
    (tmp_path / "m.toy").write_text("2.0")
    runner = backends.runner_for_file(tmp_path / "m.toy", ["x"])
    np.testing.assert_array_equal(runner(np.arange(3.0)), [0.0, 2.0, 4.0])
    assert backends.named("toy") is toy and backends.for_runner(runner) is toy


def test_a_server_registered_from_one_module_is_written_into_a_real_build(tmp_path, monkeypatch):
    """A new server is one registration: it is written for the representations it serves, hashed into the
    manifest; and a server that does not serve a backend's representation gets no folder."""
    def write(job: servers.EmitJob) -> Path:
        folder = job.stage / "servers" / "toy"
        folder.mkdir(parents=True)
        names = ",".join(i.name for i in job.manifest.inputs.inputs)
        (folder / "serve.txt").write_text(f"{job.name} {job.backend.name} {job.staged_model.name} {names}\n")
        return folder

    monkeypatch.setitem(emitter_registry.EMITTERS.items, "toy", servers.ServerEmitter("toy", 40, write, {"onnx": "a text file"}))
    torchserve = emitter_registry.EMITTERS.items["torchserve"]
    monkeypatch.setitem(emitter_registry.EMITTERS.items, "torchserve",
                        servers.ServerEmitter("torchserve", torchserve.order, torchserve.write, {"aoti": "only"}))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    result = infopt.build(model, example_inputs=(torch.randn(2, 6),), backend="onnxruntime", output=tmp_path / "mlp",
                          progress=False, batch_sizes=[1])
    manifest = read_manifest(result.output_dir)
    assert manifest.artifacts.get("toy") == "servers/toy"
    assert (result.output_dir / "servers/toy/serve.txt").read_text() == "sequential onnxruntime model.onnx input\n"
    assert "servers/toy/serve.txt" in manifest.files
    assert "triton" in manifest.artifacts and "kserve" in manifest.artifacts
    assert "torchserve" not in manifest.artifacts and not (result.output_dir / "servers" / "torchserve").exists()


def _outcome_details(call):
    """The details a ``PassOutcome(...)`` call passes: its fourth argument or ``details=``."""
    import ast

    given = call.args[3] if len(call.args) > 3 else next((k.value for k in call.keywords if k.arg == "details"), None)
    return None if given is None or (isinstance(given, ast.Dict) and not given.keys) else given


def test_every_bundled_pass_that_records_details_declares_their_type():
    """Read from the source, so a pass whose details only a slow test would reach is caught here too:
    details are never a dict literal, and a pass that returns any names its PassDetails type."""
    import ast

    from tests.support.cli import ROOT

    problems = []
    for path in sorted((ROOT / "passes").rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("PassOutcome", "Pass")]
        given = [d for c in calls if c.func.id == "PassOutcome" and (d := _outcome_details(c)) is not None]
        declared = any(k.arg == "details" for c in calls if c.func.id == "Pass" for k in c.keywords)
        problems += [f"{path.name}:{d.lineno} details as a dict literal" for d in given if isinstance(d, ast.Dict)]
        if given and not declared:
            problems.append(f"{path.name}: returns details but its Pass(...) declares no details type")
    assert problems == []


def test_a_passes_own_preflight_runs_before_the_build_loads_anything(tmp_path, monkeypatch):
    """A pass's pre-flight is its own (``Pass.check``): the builder runs every step's before it loads the
    model, and names no pass itself. Here the INT8 pass's check is replaced by one that refuses."""
    from dataclasses import replace

    from infopt.core import pass_api

    seen = []

    def check(options, target, has_calibration):
        seen.append((type(options).__name__, target.name, has_calibration))
        raise UsageError("the toy pre-flight refused", fix="nothing to do")

    real = pass_api.get_pass("quantize_int8")
    monkeypatch.setitem(pass_api.PASSES.items, "quantize_int8", replace(real, check=check))
    with pytest.raises(UsageError, match="the toy pre-flight refused"):
        infopt.build(tmp_path / "no-such-model.pt", precision="int8", output=tmp_path / "out", progress=False)
    assert seen == [("QuantizeInt8Options", "cpu", False)]  # the missing model file was never looked at
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="static INT8 needs calibration data"):  # the real check
        real.preflight({"mode": "static"}, targets()["cpu"], False)
    real.preflight({"mode": "static"}, targets()["cpu"], True)


def test_a_task_added_to_the_list_is_what_the_loader_and_the_build_use(tmp_path, monkeypatch):
    """A new task is one descriptor and one entry in ``TASKS``: a toy task (a BERT's [CLS] vector, judged by
    cosine) placed first is the one a BERT folder loads as, and the build exports, judges and records it."""
    import json

    import transformers

    from infopt.runtime import tasks
    from infopt.runtime.tasks.base import Task
    from infopt.runtime.tasks.text import TEXT_SUFFIXES, read_with_folder_tokenizer, token_spec, wrapper_class

    def module(model, path):
        return wrapper_class()(model, str(path), ("cls_vector",), pool=lambda hidden, mask: hidden[:, 0])

    toy = Task("cls-vector", "cosine", lambda model, path, config: type(model).__name__ == "BertModel",
               lambda model, path, config: token_spec(64), module, TEXT_SUFFIXES, read_with_folder_tokenizer)
    monkeypatch.setattr(tasks, "TASKS", (toy, *tasks.TASKS))
    folder = tmp_path / "tiny-bert"
    transformers.BertModel(transformers.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, vocab_size=128,
                                                   max_position_embeddings=64)).save_pretrained(folder)
    result = infopt.build(folder, backend="onnxruntime", output=tmp_path / "out", progress=False, batch_sizes=[1])
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["source"]["task"] == {"name": "cls-vector", "judged_by": "cosine"}
    assert [(o["name"], o["shape"]) for o in manifest["outputs"]] == [("cls_vector", ["batch", 32])]
    assert manifest["validation"]["verdict"]["passed"]


def test_a_passes_own_report_section_is_shown_without_the_report_naming_it(digits_dist, monkeypatch):
    """``PassDetails.sections``: the report asks each recorded pass's typed details for its sections; a pass whose
    details give one (here a toy on whichever pass of a real build recorded details) appears in report.md."""
    from dataclasses import replace

    from infopt.core import pass_api
    from infopt.core.section import Section
    from infopt.report.markdown import to_markdown

    manifest = read_manifest(digits_dist)
    record = next(r for r in manifest.passes if r.details and not r.skipped)
    real = pass_api.get_pass(record.name)
    class ToyDetails(real.details):
        def sections(self):
            return [Section("Toy pass section", ["details"], [[type(self).__mro__[1].__name__]])]

    monkeypatch.setitem(pass_api.PASSES.items, record.name, replace(real, details=ToyDetails))
    report = to_markdown(manifest)
    assert "## Toy pass section" in report and f"| {real.details.__name__} |" in report


def test_a_calibration_method_registered_from_outside_is_offered_checked_and_used(tmp_path, monkeypatch):
    """A calibration method is one registration (``quantize/calibrators.py``): a toy rule (the observed range
    widened by a quarter) registered here is offered by name, an unknown name is refused where it is given,
    and a static INT8 build calibrates every tensor with the toy's rule."""
    import json

    from infopt.api import flags
    from infopt.quantize import calibrators

    seen: list[tuple[float, float]] = []

    def widened(observer):
        seen.append((observer.lo, observer.hi))
        return observer.lo * 1.25, observer.hi * 1.25

    monkeypatch.setattr(calibrators.CALIBRATORS, "items", dict(calibrators.CALIBRATORS.items))
    calibrators.register(calibrators.Calibrator("widened", widened, False, "the observed range and a quarter more"))
    assert calibrators.names()[-1] == "widened"
    from infopt.api.build_config import BuildConfig

    widened_config = BuildConfig.of(calib_method="widened")
    flags.check_choices(widened_config)
    assert widened_config.pass_settings() == {"calib_method": "widened"}
    with pytest.raises(UsageError, match="unknown --calib-method 'narrowed'") as refused:
        flags.check_choices(BuildConfig.of(calib_method="narrowed"))
    assert "widened" in refused.value.fix

    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))  # calibrated here, not read from a cache
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32))
    common = {"inputs": ["x:float32[batch,16]"], "precision": "int8", "calibration": tmp_path / "calib.npz",
              "max_drift": "cosine_mean=0.9", "batch_sizes": [1], "progress": False}
    with pytest.raises(UsageError, match="unknown calibration method 'narrowed'"):  # from a recipe's options
        infopt.build(model, output=tmp_path / "refused", pass_options={"quantize_int8": {"method": "narrowed"}}, **common)
    result = infopt.build(model, output=tmp_path / "out", pass_options={"quantize_int8": {"method": "widened",
                                                                                          "choose": "first"}}, **common)
    table = json.loads((result.output_dir / "quantization" / "calibration.json").read_text())
    assert table["method"] == "widened" and seen
    assert sorted(map(tuple, table["ranges"].values())) == sorted((lo * 1.25, hi * 1.25) for lo, hi in seen)


def test_a_passes_own_notes_are_what_the_build_says_of_it(tmp_path, monkeypatch):
    """``PassDetails.notes``: the build asks the typed details of each pass of the shipped lineage for its notes;
    a toy in place of the INT8 pass's notes is what the manifest says, and the INT8 pass's own are gone. (The
    input has a sequence dim so that the Linears export as MatMuls, which dynamic INT8 covers.)"""
    import json
    from dataclasses import replace

    from infopt.core import pass_api

    real = pass_api.get_pass("quantize_int8")

    class ToyDetails(real.details):
        def notes(self):
            return [f"toy note: {self.mode} INT8, {len(self.layers)} layers"]

    monkeypatch.setitem(pass_api.PASSES.items, "quantize_int8", replace(real, details=ToyDetails))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    result = infopt.build(model, inputs=["x:float32[batch,4,16]"], precision="int8", max_drift="cosine_mean=0.9",
                          batch_sizes=[1], pass_options={"quantize_int8": {"choose": "first"}},
                          output=tmp_path / "out", progress=False)
    notes = json.loads((result.output_dir / "manifest.json").read_text())["validation"]["notes"]
    assert "toy note: dynamic INT8, 2 layers" in notes
    assert not any(n.startswith("INT8 is dynamic") for n in notes), notes  # the real pass's note, not asked for


def test_the_pass_api_still_resolves_from_its_old_module():
    """Plugins written before ``core/pass_api.py`` import the Pass API from ``infopt.core.registry``: it still
    resolves, to the same objects, with a DeprecationWarning naming the new module."""
    import infopt.core.pass_api as pass_api
    import infopt.core.registry as registry

    with pytest.warns(DeprecationWarning, match="moved to infopt.core.pass_api.Pass"):
        from infopt.core.registry import Pass
    assert Pass is pass_api.Pass and registry.Registry is not None
    with pytest.raises(AttributeError):
        registry.no_such_name  # noqa: B018
