"""InputSpec: the names, dtypes and shapes a model takes, with named dynamic dims.

A shape dim is an int (static) or a symbol such as ``batch`` whose range is min:opt:max.
``x:float32[batch,3,224,224]`` is the text form (``--input``); ``batch=1:8:64`` sets a range
(``--dim``). The same symbol in two inputs is the same dim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from infopt.core.errors import InputSpecError

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16",
                 "bf16": "bfloat16", "double": "float64", "long": "int64", "int": "int32"}
DEFAULT_RANGE = (1, 8, 64)
"""min, opt, max of a symbolic dim that no ``--dim`` sets."""

_INPUT_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*([A-Za-z0-9_]+)\s*\[([^\]]*)\]\s*$")
_DIM_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*:\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class DimRange:
    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise InputSpecError(
                f"dim range {self.min}:{self.opt}:{self.max} is not ordered",
                fix="give min:opt:max with 1 <= min <= opt <= max, for example --dim batch=1:8:64",
            )


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def __str__(self) -> str:
        return f"{self.name}:{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))


@dataclass(frozen=True)
class InputSpec:
    inputs: tuple[TensorSpec, ...]
    dims: Mapping[str, DimRange] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise InputSpecError(f"input names repeat: {', '.join(names)}", fix="give each --input its own name")
        dims = dict(self.dims)
        for sym in self.symbols:
            dims.setdefault(sym, DimRange(*DEFAULT_RANGE))
        unknown = set(dims) - set(self.symbols)
        if unknown:
            raise InputSpecError(
                f"--dim names {', '.join(sorted(unknown))}, which no input uses",
                fix=f"use one of the symbols in the input shapes: {', '.join(self.symbols) or '(none)'}",
            )
        object.__setattr__(self, "dims", dims)

    def __str__(self) -> str:
        return " ".join(str(t) for t in self.inputs)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def symbols(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.inputs:
            for s in t.symbols:
                seen.setdefault(s)
        return tuple(seen)

    @property
    def batch_symbol(self) -> str | None:
        """The symbol that leads every input's shape, if there is one: the batch dim."""
        firsts = {t.shape[0] if t.shape else None for t in self.inputs}
        if len(firsts) == 1:
            (first,) = firsts
            if isinstance(first, str):
                return first
        return None

    def concrete_shape(self, tensor: TensorSpec, pick: str = "opt", **overrides: int) -> tuple[int, ...]:
        """The shape with each symbol replaced by its min, opt or max, or an override."""
        out = []
        for d in tensor.shape:
            if isinstance(d, int):
                out.append(d)
            else:
                out.append(overrides.get(d, getattr(self.dims[d], pick)))
        return tuple(out)

    def with_dims(self, dims: Mapping[str, DimRange]) -> "InputSpec":
        return InputSpec(self.inputs, {**self.dims, **dims})

    # ---- serialization -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in self.inputs],
            "dims": {k: {"min": v.min, "opt": v.opt, "max": v.max} for k, v in self.dims.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "InputSpec":
        inputs = tuple(TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in data["inputs"])
        dims = {k: DimRange(v["min"], v["opt"], v["max"]) for k, v in data.get("dims", {}).items()}
        return cls(inputs, dims)

    # ---- parsing ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, inputs: Sequence[str], dims: Sequence[str] = ()) -> "InputSpec":
        """Parse ``--input`` values (``x:float32[batch,3,224,224]``) and ``--dim`` values."""
        if not inputs:
            raise InputSpecError("no inputs given", fix='pass --input "name:dtype[d0,d1,...]"')
        return cls(tuple(parse_tensor(text) for text in inputs), dict(parse_dim(text) for text in dims))

    @classmethod
    def from_examples(cls, examples: Sequence[Any], names: Sequence[str] | None = None,
                      dynamic_batch: bool = True) -> "InputSpec":
        """Infer the spec from example tensors or arrays; dim 0 becomes ``batch`` if asked."""
        names = list(names) if names else [f"input_{i}" for i in range(len(examples))]
        if len(names) != len(examples):
            raise InputSpecError(f"{len(examples)} example inputs for {len(names)} names ({', '.join(names)})",
                                 fix="pass one example tensor per input of forward()")
        tensors = []
        batch = None
        for name, ex in zip(names, examples):
            shape = tuple(int(d) for d in ex.shape)
            if dynamic_batch and shape:
                batch = shape[0] if batch is None else batch
                shape = ("batch",) + shape[1:]
            tensors.append(TensorSpec(name, dtype_name(ex.dtype), shape))
        dims = {}
        if dynamic_batch and batch is not None:
            lo, opt, hi = DEFAULT_RANGE
            dims["batch"] = DimRange(lo, max(opt, batch), max(hi, batch))
        return cls(tuple(tensors), dims)


def parse_tensor(text: str) -> TensorSpec:
    match = _INPUT_RE.match(text)
    if not match:
        raise InputSpecError(
            f"cannot read input spec {text!r}",
            fix='write it as name:dtype[d0,d1,...], for example --input "x:float32[batch,3,224,224]"',
        )
    name, dtype, dims = match.groups()
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPES:
        raise InputSpecError(f"unknown dtype {dtype!r} in {text!r}", fix=f"use one of {', '.join(DTYPES)}")
    shape: list[int | str] = []
    for raw in (d.strip() for d in dims.split(",")) if dims.strip() else ():
        if raw.isdigit() and int(raw) > 0:
            shape.append(int(raw))
        elif re.fullmatch(r"[A-Za-z_]\w*", raw):
            shape.append(raw)
        else:
            raise InputSpecError(
                f"dim {raw!r} in {text!r} is neither a positive int nor a symbol name",
                fix="write static dims as ints and dynamic dims as names such as batch or seq",
            )
    return TensorSpec(name, dtype, tuple(shape))


def parse_dim(text: str) -> tuple[str, DimRange]:
    match = _DIM_RE.match(text)
    if not match:
        raise InputSpecError(f"cannot read dim range {text!r}", fix="write it as name=min:opt:max, for example --dim batch=1:8:64")
    name, lo, opt, hi = match.groups()
    return name, DimRange(int(lo), int(opt), int(hi))


def dtype_name(dtype: Any) -> str:
    """The spec's dtype name for a torch or numpy dtype."""
    text = str(dtype).replace("torch.", "")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise InputSpecError(f"inputs of dtype {dtype} are not supported", fix=f"use one of {', '.join(DTYPES)}")
    return text
