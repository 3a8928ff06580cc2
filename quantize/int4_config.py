"""The INT4 weight-only settings: one typed, serializable config (no torch import).

It is the ``quantize_int4`` pass's options and the argument of
:func:`infopt.quantize.weight_only.quantize_int4`; a recipe's YAML maps onto it one to one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Method = Literal["rtn", "gptq", "awq"]


class Int4Config(BaseModel):
    """How to quantize: the method and its settings (the ``quantize_int4`` pass's options)."""

    model_config = ConfigDict(extra="forbid")

    method: Method = Field("gptq", description="rtn (no data), gptq or awq (calibration data)")
    group_size: int = Field(128, ge=2, description="input features per scale/zero group")
    symmetric: bool = Field(False, description="symmetric grid (zero point 8) instead of min/max")
    act_order: bool = Field(False, description="GPTQ: quantize columns by decreasing Hessian diagonal (needs g_idx)")
    damp: float = Field(0.01, gt=0, description="GPTQ: damping, as a fraction of the Hessian's mean diagonal")
    block_size: int = Field(128, ge=1, description="GPTQ: columns per lazy batch update")
    awq_grid: int = Field(20, ge=1, description="AWQ: points on the alpha grid of the scale search")
    awq_clip: bool = Field(True, description="AWQ: search a clipping ratio per row and group")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to calibrate and quantize: auto is cuda when there is a GPU")
    awq_rows: int = Field(2048, ge=16, description="AWQ: calibration rows kept per layer for the searches")

    @field_validator("group_size")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"group size {value} must be even (two 4-bit codes per byte); 32, 64 or 128 usually fit")
        return value
