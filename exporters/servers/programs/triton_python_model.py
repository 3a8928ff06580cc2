"""Triton Python-backend model: runs the AOTInductor package ``model.pt2`` beside this file.

``load_package`` and ``infer`` hold the inference logic and need only torch and numpy;
``TritonPythonModel`` adapts them to Triton's request and response objects.

Triton's Python backend exchanges tensors with the server through NumPy 1.x: under NumPy 2 the inputs
arrive as zeros and the outputs leave empty, with no error (Triton 2.51 and 2.52 list NumPy 2 as
unsupported). The model therefore refuses to load under NumPy 2, saying so, unless
``INFOPT_TRITON_NUMPY2=1`` says the Triton in use handles it.
"""

import json
import os
from pathlib import Path

import numpy as np


def load_package(path, device="cpu"):
    """Load the ``.pt2`` package; ``device`` is "cpu" or "cuda[:N]" (the package's own device)."""
    import torch

    index = int(device.split(":")[1]) if device.startswith("cuda:") else -1
    if index >= 0:
        torch.cuda.set_device(index)
    return torch._inductor.aoti_load_package(str(path), device_index=index)


def infer(package, arrays):
    """Run the package on numpy arrays in input order; the outputs as numpy arrays."""
    import torch
    from torch.utils._pytree import tree_leaves

    device = package.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
    # a fresh copy: AOTInductor packages index inputs by their strides, and numpy keeps odd strides
    # on size-1 dims of a "contiguous" view, which gives wrong results
    args = [torch.from_numpy(np.array(a, order="C", copy=True)).to(device) for a in arrays]
    with torch.inference_mode():
        result = package(*args)
    return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]


def check_numpy(version=None, allowed=None):
    """Raise where NumPy is 2 or later and ``INFOPT_TRITON_NUMPY2`` is not 1: the backend would serve zeros."""
    version = np.__version__ if version is None else version
    allowed = os.environ.get("INFOPT_TRITON_NUMPY2") == "1" if allowed is None else allowed
    if int(version.split(".")[0]) >= 2 and not allowed:
        raise RuntimeError(f"NumPy {version} in the Python environment Triton runs this model in: Triton's Python "
                           "backend passes tensors through NumPy 1.x, and under NumPy 2 requests would get zeros in "
                           "and empty outputs back. Install numpy<2 in that environment (set "
                           "INFOPT_TRITON_NUMPY2=1 where the Triton in use supports NumPy 2)")


class TritonPythonModel:
    def initialize(self, args):
        check_numpy()
        config = json.loads(args["model_config"])
        self.input_names = [i["name"] for i in config["input"]]
        self.output_names = [o["name"] for o in config["output"]]
        device = "cpu"
        if args.get("model_instance_kind") == "GPU":
            device = "cuda:" + str(args.get("model_instance_device_id", 0))
        self.package = load_package(Path(__file__).with_name("model.pt2"), device)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            try:
                arrays = [pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names]
                outputs = infer(self.package, arrays)
                tensors = [pb_utils.Tensor(n, np.ascontiguousarray(o)) for n, o in zip(self.output_names, outputs)]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # one bad request must not take the model down
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses
