"""The caches of lowered programs: a rebuild of the same program copies the ONNX file a fresh export
writes, or the AOTInductor package a compile wrote; any change to the program, its weights or the
options is another entry; a damaged entry is made again."""

from __future__ import annotations

import torch

import infopt
from tests.support.payloads import Tiny

INPUT = ["x:float32[batch,4]"]


def build(model, out, backend="onnxruntime", **options):
    lowering = "onnx_export" if backend == "onnxruntime" else "aoti_compile"
    result = infopt.build(model, inputs=INPUT, backend=backend, output=out, progress=False, batch_sizes=[1],
                          pass_options={lowering: options} if options else None)
    record = result.manifest.pass_record(lowering)
    return (out / result.manifest.artifacts.model).read_bytes(), record.details.get("cached")


def test_a_rebuild_reuses_the_export_and_gets_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = Tiny().eval()
    fresh, cached = build(model, tmp_path / "a")
    assert not cached
    (entry,) = (tmp_path / "cache" / "onnx-export").iterdir()
    again, cached = build(model, tmp_path / "b")
    assert cached and again == fresh
    uncached, cached = build(model, tmp_path / "c", cache=False)
    assert not cached and uncached == fresh  # the same bytes a fresh export writes

    with torch.no_grad():
        model.fc.weight[0, 0] += 1.0  # one weight changed: another program, another export
    changed, cached = build(model, tmp_path / "d")
    assert not cached and changed != fresh
    assert len(list((tmp_path / "cache" / "onnx-export").iterdir())) == 2

    (entry / "exported.onnx").write_bytes(b"damaged")  # a damaged entry is not used, and is written again
    torch.manual_seed(0)
    rebuilt, cached = build(Tiny().eval(), tmp_path / "e")
    assert not cached and rebuilt == fresh
    assert (entry / "exported.onnx").read_bytes() != b"damaged"


def test_a_rebuild_from_the_cache_costs_the_roof_probe_what_the_first_build_did(tmp_path, monkeypatch):
    """The export's seconds travel with the cache entry: a rebuild's first candidate is counted at what its first
    build cost, so the roof probe (which runs only after a slow first candidate) decides on the others as it did
    then, not on the seconds a copy from the cache took."""
    from types import SimpleNamespace

    from infopt.api.candidates import build_seconds

    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = Tiny().eval()
    first = infopt.build(model, inputs=INPUT, output=tmp_path / "a", progress=False, batch_sizes=[1])
    again = infopt.build(model, inputs=INPUT, output=tmp_path / "b", progress=False, batch_sizes=[1])
    fresh, cached = first.manifest.pass_record("onnx_export"), again.manifest.pass_record("onnx_export")
    assert not fresh.details.get("cached") and cached.details["cached"] is True
    assert fresh.details["seconds"] > 0 and cached.details["seconds"] == fresh.details["seconds"]
    lineage = [SimpleNamespace(details=d) for d in ({"seconds": 9.0}, cached.details, {"cached": True})]
    assert build_seconds(SimpleNamespace(artifact=SimpleNamespace(lineage=lineage)), 2.0) == 2.0 + cached.details["seconds"]
    assert build_seconds(SimpleNamespace(artifact=SimpleNamespace(lineage=lineage[:1])), 2.0) == 2.0


def test_a_rebuild_reuses_the_aoti_package_and_it_runs(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = Tiny().eval()
    compiled, cached = build(model, tmp_path / "a", backend="inductor")
    assert not cached
    again, cached = build(model, tmp_path / "b", backend="inductor")
    assert cached and again == compiled
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        assert np.allclose(infopt.load(tmp_path / "b")(x), model(torch.from_numpy(x)).numpy(), atol=1e-5)



def test_a_default_rebuild_of_a_torchscript_model_reuses_its_aoti_package(tmp_path, monkeypatch):
    """The ONNX exporter annotates the nodes of the program it is given (nodes without source lines, as a
    TorchScript model's are, print those annotations); the AOTInductor candidate of the same build
    hashes that program after it. A rebuild whose export comes from the cache must still find the
    package the first build compiled."""
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    from examples.models import DigitsCNN

    path = tmp_path / "digits_cnn.pt"  # as make demo saves it: traced, its BatchNorms folded by the build
    torch.jit.save(torch.jit.trace(DigitsCNN().eval(), torch.randn(2, 1, 8, 8)), str(path))

    def aoti_cached(out):
        result = infopt.build(path, inputs=["x:float32[batch,1,8,8]"], output=out, progress=False, batch_sizes=[1])
        (inductor,) = [c for c in result.candidates if c.label == "fp32-inductor" and c.status == "built"]
        (record,) = [r for r in inductor.artifact.lineage if r.name == "aoti_compile"]
        return record.details.get("cached")

    assert not aoti_cached(tmp_path / "a")
    assert aoti_cached(tmp_path / "b")
