"""Shared fixtures: the example models, trained once per session, saved in every format."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # test workers side by side: one thread each (torch, ONNX Runtime through infopt, and the
    # subprocesses they start), so two runtimes do not each spin a pool over both cores
    os.environ.setdefault("INFOPT_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["INFOPT_THREADS"]))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU; read when triton is imported

import infopt.passes  # noqa: E402,F401 - registers every bundled pass, for tests that load recipes below infopt.api
from examples.train import train_digits, train_encoder


@pytest.fixture(scope="session")
def digits():
    """A DigitsCNN trained on scikit-learn's digits, with its held-out split."""
    model, data = train_digits()
    assert data["accuracy"] >= 0.95
    return model, data


@pytest.fixture(scope="session")
def encoder():
    model, data = train_encoder()
    assert data["accuracy"] >= 0.9
    return model, data


@pytest.fixture(scope="session")
def files(tmp_path_factory, digits, encoder):
    """The example models saved the ways users save them, and their validation samples."""
    out = tmp_path_factory.mktemp("models")
    cnn, data = digits
    xte, yte = data["val"]
    torch.jit.save(torch.jit.trace(cnn, torch.from_numpy(xte[:2])), str(out / "cnn_ts.pt"))
    torch.save(cnn.state_dict(), out / "cnn_sd.pt")
    torch.save(cnn, out / "cnn_pickled.pt")
    np.savez(out / "digits_val.npz", x=xte, labels=yte)
    enc, edata = encoder
    ids, _ = edata["val"]
    from torch.export import Dim

    program = torch.export.export(enc, (torch.from_numpy(ids[:4]),),
                                  dynamic_shapes=({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=64)},))
    torch.export.save(program, str(out / "encoder.pt2"))
    torch.save(enc.state_dict(), out / "encoder_sd.pt")
    np.savez(out / "encoder_val.npz", input_ids=ids)
    return out


@pytest.fixture(scope="session")
def digits_dist(digits, files, tmp_path_factory):
    """A default-backend ONNX Runtime build of the digits CNN, for tests that read or tamper with an output
    folder (copy it first)."""
    import infopt

    model, data = digits
    x, _ = data["val"]
    out = tmp_path_factory.mktemp("built") / "digits"
    infopt.build(model, example_inputs=(torch.from_numpy(x[:2]),), backend="onnxruntime", output=out,
                 val=files / "digits_val.npz", dims=["batch=1:4:16"], progress=False)
    return out


@pytest.fixture(scope="session")
def digits_aoti(digits, tmp_path_factory):
    """An AOTInductor (``--backend inductor``) build of the digits CNN named ``digits``, for the tests that serve
    it (TorchServe, Triton; they share the xdist group ``digits-aoti``, so it is built once). Read it, or copy it."""
    import infopt
    from infopt.core.cache import cache_dir

    model, data = digits
    out = tmp_path_factory.mktemp("digits-aoti") / "dist"
    with pytest.MonkeyPatch.context() as mp:
        # infopt's own Inductor cache, as builds use it: a fresh one recompiles the AOTI headers (about 9 s)
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir("inductor")))
        infopt.build(model, example_inputs=(torch.from_numpy(data["val"][0][:8]),), target="cpu", backend="inductor",
                     name="digits", output=out, progress=False)
    return out


def pytest_collection_modifyitems(items):
    """Tests marked ``slow`` (real models, end-to-end builds) first, so that side-by-side workers
    take them one each and finish together instead of one worker running the last long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(trylast=True)
def _group_xdist_items(config, items):  # registered below under the hook's name
    """``--dist loadgroup``: a test marked ``xdist_group(NAME)`` (on itself or its module) runs on the worker
    that runs the group's other tests, so a module's expensive fixture (a trained LM, a MiniLM build) is made
    once. pytest-xdist 3.8 marks the group by setting ``item._nodeid``, which pytest 9 no longer reads (a
    node's id is ``item._id``), so on pytest 9 the groups were silently spread over the workers; this does
    what xdist means to do, where it did not."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "loadgroup", False)):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest before 9: xdist's own suffix works
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rpartition("]")[2] and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


class _GroupPlugin:
    pytest_collection_modifyitems = staticmethod(_group_xdist_items)


def pytest_configure(config):
    config.pluginmanager.register(_GroupPlugin(), "infopt-xdist-groups")
