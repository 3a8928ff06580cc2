"""TorchServe handler for an infopt artifact: the model file and ``infopt_io.json`` beside it.

Needs numpy and onnxruntime (``.onnx``) or torch (``.pt2``). Request bodies are
``{"inputs": {"<name>": nested list}}`` or KServe v2-style ``{"inputs": [{"name", "shape",
"datatype", "data"}]}``; the batch dim is part of each input. A request that cannot run gets
status 400 and ``{"error": ...}``; the model failing on a valid request gets status 500.
"""

import json
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

V2_DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "bfloat16": "BF16", "int64": "INT64",
                "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}


def wire_dtype(dtype):
    """The numpy dtype an input of the spec's ``dtype`` is read into (numpy has no bfloat16)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def load_onnx(path, io, gpu_id):
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if io["device"] == "cuda" and gpu_id is not None and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(gpu_id)}))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=providers)
    names = [t["name"] for t in io["inputs"]]

    def run(arrays):
        return session.run(None, dict(zip(names, arrays)))

    return run


def load_aoti(path, io, gpu_id):
    import torch
    from torch.utils._pytree import tree_leaves

    index = -1
    if io["device"] == "cuda":
        index = int(gpu_id or 0)
        torch.cuda.set_device(index)
    package = torch._inductor.aoti_load_package(str(path), device_index=index)
    device = package.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
    dtypes = [getattr(torch, t["dtype"]) for t in io["inputs"]]

    def run(arrays):
        # a fresh C-ordered copy: an AOTInductor package indexes inputs by their strides, and numpy
        # keeps odd strides on size-1 dims of views it calls contiguous
        args = [torch.from_numpy(np.array(a, order="C", copy=True)).to(device=device, dtype=d)
                for a, d in zip(arrays, dtypes)]
        with torch.inference_mode():
            result = package(*args)
        leaves = [t.detach().cpu() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
        return [(t.float() if t.dtype == torch.bfloat16 else t).numpy() for t in leaves]

    return run


class InfoptHandler:
    """Parses each request, runs requests with equal non-batch dims together, answers each one."""

    def __init__(self):
        self.io = None
        self.model = None

    def initialize(self, context):
        props = context.system_properties
        folder = Path(props["model_dir"])
        self.io = json.loads((folder / "infopt_io.json").read_text())
        load = load_aoti if self.io["format"] == "aoti" else load_onnx
        self.model = load(folder / self.io["model_file"], self.io, props.get("gpu_id"))
        logger.info("loaded %s (%s) for %s", self.io["model_file"], self.io["format"], self.io["name"])

    def handle(self, data, context):
        answers = [None] * len(data)
        parsed = []
        for idx, row in enumerate(data):
            try:
                parsed.append((idx, *self.parse(row)))
            except ValueError as exc:
                answers[idx] = self.error(context, idx, 400, str(exc))
        groups = self.groups(parsed)
        logger.info("batch of %d requests in %d groups", len(data), len(groups))
        for group in groups:
            try:
                results = self.run_group(group)
            except Exception as exc:  # the model failed: answer, keep the worker
                logger.exception("the model failed on %d requests", len(group))
                for idx, _, _ in group:
                    answers[idx] = self.error(context, idx, 500, f"the model failed: {type(exc).__name__}: {exc}")
                continue
            for (idx, style, _), outputs in zip(group, results):
                context.set_response_content_type(idx, "application/json")
                answers[idx] = json.dumps(self.render(style, outputs))
        return answers

    # ---- requests ------------------------------------------------------------------------------
    def parse(self, row):
        """(style, arrays in input order) for one request; ValueError says what is wrong with it."""
        body = row.get("body") if row.get("body") is not None else row.get("data")
        if isinstance(body, (bytes, bytearray)):
            try:
                body = json.loads(body)
            except ValueError as exc:
                raise ValueError(f"the request body is not JSON: {exc}") from None
        names = [t["name"] for t in self.io["inputs"]]
        usage = 'send {"inputs": {' + ", ".join(f'"{n}": [...]' for n in names) + "}}"
        if not isinstance(body, dict) or "inputs" not in body:
            raise ValueError(f"the request has no \"inputs\": {usage}")
        given = body["inputs"]
        if isinstance(given, dict):
            style, values = "infopt", given
        elif isinstance(given, list):
            style, values = "v2", self.v2_values(given)
        else:
            raise ValueError(f"\"inputs\" must be an object or a list: {usage}")
        missing = [n for n in names if n not in values]
        unknown = [n for n in values if n not in names]
        if missing or unknown:
            problems = [f"missing input {', '.join(missing)}"] if missing else []
            problems += [f"unknown input {', '.join(map(str, unknown))}"] if unknown else []
            raise ValueError(f"{'; '.join(problems)}: this model takes {', '.join(names)}")
        arrays = [self.to_array(t, values[t["name"]]) for t in self.io["inputs"]]
        self.check_dims(arrays)
        return style, arrays

    @staticmethod
    def v2_values(items):
        values = {}
        for item in items:
            if not isinstance(item, dict) or "name" not in item or "data" not in item:
                raise ValueError("each v2 input needs \"name\" and \"data\" (and \"shape\", \"datatype\")")
            data = np.asarray(item["data"]) if "shape" in item else item["data"]
            if "shape" in item:
                try:
                    data = data.reshape([int(d) for d in item["shape"]])
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"input {item['name']}: data does not fit shape {item['shape']}: {exc}") from None
            values[item["name"]] = data
        return values

    @staticmethod
    def to_array(tensor, value):
        name, dtype = tensor["name"], tensor["dtype"]
        try:
            array = np.asarray(value)
        except ValueError:
            raise ValueError(f"input {name} is not a rectangular nested list") from None
        if array.dtype.kind not in "biuf":
            raise ValueError(f"input {name} must hold numbers of dtype {dtype}, not {array.dtype}")
        want = wire_dtype(dtype)
        if want.kind in "iub" and array.dtype.kind == "f" and not np.all(np.mod(array, 1) == 0):
            raise ValueError(f"input {name} is {dtype} and got fractional values")
        if want.kind == "b" and array.dtype.kind != "b" and not np.all((array == 0) | (array == 1)):
            raise ValueError(f"input {name} is bool and got values other than 0 and 1")
        if want.kind == "u" and np.any(array < 0):
            raise ValueError(f"input {name} is {dtype} and got negative values")
        shape = tensor["shape"]
        if array.ndim != len(shape):
            raise ValueError(f"input {name} has shape {list(array.shape)}, expected [{', '.join(map(str, shape))}]")
        return array.astype(want)

    def check_dims(self, arrays):
        """Static dims match; each symbol has one value across inputs, within its range."""
        bound = {}
        for tensor, array in zip(self.io["inputs"], arrays):
            for axis, (want, got) in enumerate(zip(tensor["shape"], array.shape)):
                if isinstance(want, int):
                    if want != got:
                        raise ValueError(f"input {tensor['name']} has {got} on axis {axis}, expected {want}")
                    continue
                if bound.setdefault(want, got) != got:
                    raise ValueError(f"dim {want} is {bound[want]} on one input and {got} on {tensor['name']}")
                limits = self.io["dims"].get(want)
                top = None if want == self.io["batch"] else limits and limits["max"]
                if got < 1 or (limits and got < limits["min"]) or (top is not None and got > top):
                    span = f"{limits['min']}..{limits['max']}" if limits else ">= 1"
                    raise ValueError(f"dim {want} of input {tensor['name']} is {got}, outside {span}")

    # ---- running -------------------------------------------------------------------------------
    def groups(self, parsed):
        """Requests that can be concatenated on the batch dim: equal shapes past it."""
        if self.io["batch"] is None:
            return [[p] for p in parsed]
        keyed = {}
        for item in parsed:
            keyed.setdefault(tuple(a.shape[1:] for a in item[2]), []).append(item)
        return list(keyed.values())

    def run_group(self, group):
        """Outputs per request: one call per chunk of at most ``max_batch`` rows."""
        if len(group) == 1 and self.io["batch"] is None:
            return [self.model(group[0][2])]
        rows = [item[2][0].shape[0] for item in group]
        joined = [np.concatenate([item[2][i] for item in group]) for i in range(len(self.io["inputs"]))]
        step = self.io["max_batch"] or sum(rows)
        chunks = [self.model([a[start:start + step] for a in joined]) for start in range(0, sum(rows), step)]
        outputs = [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]
        cuts = np.cumsum(rows)[:-1]
        per_output = [np.split(o, cuts) for o in outputs]
        return [[parts[k] for parts in per_output] for k in range(len(group))]

    # ---- responses -----------------------------------------------------------------------------
    def render(self, style, outputs):
        names = [o["name"] for o in self.io["outputs"]]
        if style == "infopt":
            return {"outputs": {n: np.asarray(o).tolist() for n, o in zip(names, outputs)}}
        return {"model_name": self.io["name"],
                "outputs": [{"name": n, "shape": list(np.shape(o)), "datatype": V2_DATATYPES.get(spec["dtype"], "FP32"),
                             "data": np.asarray(o).ravel().tolist()}
                            for n, spec, o in zip(names, self.io["outputs"], outputs)]}

    @staticmethod
    def error(context, idx, code, message):
        context.set_response_status(code, message, idx)
        context.set_response_content_type(idx, "application/json")
        return json.dumps({"error": message, "code": code})
