"""An ONNX model that keeps its weights in a file beside it, as every model over 2 GB must and as hubs ship
large ones, builds from the command line at each precision docs/guide/targets-and-backends.md claims for ONNX
sources, and its output folder is whole: the model and the servers' copies open with their tensors from the output alone.

The weights file has a name of the exporter's choosing (``weights.bin``), not infopt's ``<model>.data``;
each pass that writes a new graph (ONNX Runtime's optimizer, INT4 on the graph) and the output step must
write the tensors beside the file they save.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """``src/model.onnx`` with every tensor in ``src/weights.bin``, and its outputs on a fixed input."""
    import onnxruntime as ort

    root = tmp_path_factory.mktemp("external")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).eval()
    program = torch.onnx.export(mlp, (torch.randn(2, 8, 256),), dynamo=True, input_names=["x"], output_names=["y"],
                                dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
    (root / "src").mkdir()
    onnx.save(program.model_proto, str(root / "src" / "model.onnx"), save_as_external_data=True,
              location="weights.bin", size_threshold=0)
    x = np.random.default_rng(0).normal(size=(4, 8, 256)).astype(np.float32)
    reference = ort.InferenceSession(str(root / "src" / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return root, x, reference


@pytest.mark.parametrize(("flag", "min_cosine"), [("--fp32", 0.99999), ("--int8", 0.99), ("--int4", 0.99)])
def test_an_onnx_model_with_its_weights_beside_it_builds_and_its_output_is_whole(source, flag, min_cosine):
    import onnxruntime as ort

    root, x, reference = source
    out = f"dist/{flag.strip('-')}"
    proc = run_cli("build", "src/model.onnx", flag, "--output", out, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    model = root / out / "model" / "model.onnx"
    version = root / out / "servers" / "triton" / "model" / "1"
    for path in (model, version / "model.onnx"):
        onnx.checker.check_model(str(path))  # every tensor it names is in the output
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        cosine = (got * reference).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(reference, axis=-1))
        assert cosine.min() >= min_cosine, (path, cosine.min())
    external = [t.name for t in onnx.load(str(model), load_external_data=False).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    assert not external or (model.parent / "model.onnx.data").is_file()  # where the model says its tensors are
