"""The INT4 weight-only settings (no torch import): one config class per method, and the flat
:class:`Int4Config` that recipes and the ``quantize_int4`` pass take.

As in torchao, a method is a config class with a handler registered for it
(``quantize/int4_methods.py``): :class:`RTNConfig`, :class:`GPTQConfig`, :class:`AWQConfig` and
:class:`AWQGPTQConfig` each carry the settings shared by every method (group size, symmetry, device) and their own.
:class:`Int4Config` holds every method's settings side by side, the way a recipe's YAML writes them,
and :meth:`Int4Config.method_config` turns it into the chosen method's class, refusing a setting
that belongs to another method. :class:`Int4Section` is INT4's section of ``infopt.BuildConfig``: the settings a
build is asked for, with their flags.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infopt.core.errors import UsageError
from infopt.core.registry import Registry
from infopt.core.settings import Section, setting
from infopt.quantize.method_names import Int4MethodName

GridName = Literal["search", "minmax"]
"""how each group's scale and zero point are chosen: ``search`` minimizes the group's weighted squared rounding
error (``grid_search.weighted_grid``), ``minmax`` spans the group's least and greatest weight"""
GRID_HELP = ("each group's scale and zero point: search, the least rounding error weighted by each weight's "
             "importance; minmax, the group's range")


class Int4MethodConfig(BaseModel):
    """What every INT4 method is given; a method's config class adds its own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ClassVar[str]
    """the method's name, as ``--int4-method`` and recipes give it"""
    needs_data: ClassVar[bool] = True
    """whether the method calibrates on data (RTN does not)"""
    input_scales: ClassVar[bool] = False
    """whether the method may keep per-input scales before a layer (AWQ's), which no 4-bit checkpoint layout holds"""

    group_size: int = Field(128, ge=2, description="input features per scale/zero group")
    symmetric: bool = Field(False, description="symmetric grid (zero point 8) instead of min/max")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to calibrate and quantize: auto is cuda when there is a GPU")

    @field_validator("group_size")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"group size {value} must be even (two 4-bit codes per byte); 32, 64 or 128 usually fit")
        return value


METHOD_CONFIGS: Registry[type[Int4MethodConfig]] = Registry("INT4 method", lambda c: c.name)
"""The config class of each INT4 method, by name."""


@METHOD_CONFIGS.register
class RTNConfig(Int4MethodConfig):
    """Round to nearest: each weight to its group's grid; no data."""

    name: ClassVar[str] = "rtn"
    needs_data: ClassVar[bool] = False

    grid: GridName = Field("search", description=f"{GRID_HELP} (RTN weighs a weight by its magnitude)")


@METHOD_CONFIGS.register
class GPTQConfig(Int4MethodConfig):
    """GPTQ: columns rounded in turn, the rest updated to absorb the error, under the layer's Hessian."""

    name: ClassVar[str] = "gptq"

    act_order: bool = Field(False, description="GPTQ: quantize columns by decreasing Hessian diagonal (needs g_idx)")
    damp: float = Field(0.01, gt=0, description="GPTQ: damping, as a fraction of the Hessian's mean diagonal")
    block_size: int = Field(128, ge=1, description="GPTQ: columns per lazy batch update")
    group_order: bool = Field(True, description="GPTQ without act-order: whole groups by decreasing largest Hessian "
                              "diagonal, each group's columns likewise (no g_idx)")
    grid: GridName = Field("search", description=f"{GRID_HELP} (GPTQ weighs a column by its Hessian diagonal)")


class AWQScaleSearch(Int4MethodConfig):
    """The settings of AWQ's per-input scale search, shared by the methods that search one (not a method itself)."""

    input_scales: ClassVar[bool] = True

    awq_grid: int = Field(20, ge=1, description="AWQ: points on the alpha grid of the scale search")


@METHOD_CONFIGS.register
class AWQConfig(AWQScaleSearch):
    """AWQ: per-input scales and clipping searched on the layer's activations before rounding."""

    name: ClassVar[str] = "awq"

    awq_clip: bool = Field(True, description="AWQ: search a clipping ratio per row and group")


@METHOD_CONFIGS.register
class AWQGPTQConfig(GPTQConfig, AWQScaleSearch):
    """AWQ's per-input scales searched first, then GPTQ rounds the scaled weight under the scaled inputs' Hessian."""

    name: ClassVar[str] = "awq-gptq"

    group_order: bool = Field(False, description="GPTQ without act-order: whole groups by decreasing largest Hessian "
                              "diagonal; off for AWQ-GPTQ, where it lost more than the weight's own order "
                              "(benchmarks/results/real_llm.md, \"AWQ-GPTQ in the weight's own order\")")


Method = Int4MethodName
"""the names in :data:`METHOD_CONFIGS`, declared in ``method_names.py`` (a test keeps them equal)"""


class Int4Config(RTNConfig, GPTQConfig, AWQConfig):
    """Every method's settings side by side, and the method: the ``quantize_int4`` pass's options."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    method: Method = Field("gptq", description="rtn (no data), gptq, awq or awq-gptq (calibration data)")
    group_order: bool | None = Field(None, description="GPTQ without act-order: whole groups by decreasing largest "
                                     "Hessian diagonal; unset, the method's own default (GPTQ on, AWQ-GPTQ off)")

    def method_config(self) -> Int4MethodConfig:
        """The chosen method's config, with the settings given here. A setting given explicitly that
        the method does not have is refused: it would otherwise be ignored without a word."""
        config_class = METHOD_CONFIGS.named(self.method)
        own = set(config_class.model_fields)
        stray = sorted(self.model_fields_set - own - {"method"})
        if stray:
            owners = {name: [c.name.upper() for c in METHOD_CONFIGS.items.values() if name in c.model_fields]
                      for name in stray}
            said = "; ".join(f"{name} is a setting of {'/'.join(owners[name])}" for name in stray)
            raise UsageError(f"INT4 {self.method.upper()} was chosen, and {said}",
                             fix=f"leave {', '.join(stray)} out, or choose the method it belongs to (--int4-method)")
        return config_class(**self.model_dump(include=own, exclude_none=True))  # unset: the method's default


def as_method_config(config: Int4Config | Int4MethodConfig | None) -> Int4MethodConfig:
    """A method's config from either form (GPTQ with the defaults for None)."""
    if config is None:
        return GPTQConfig()
    if isinstance(config, Int4Config):
        return config.method_config()
    return config


class Int4Section(Section):
    """INT4 weight-only quantization's build settings (``infopt.BuildConfig.int4``), with their flags."""

    int4_method: str | None = setting(None, "INT4: auto, rtn, gptq, awq or awq-gptq (default: gptq with --calib; "
                                            "without, for text generation, gptq on text the model samples up to "
                                            "250M parameters, else rtn).", "--int4-method")
    group_size: int | None = setting(None, "INT4: input features per scale group (default 128).", "--group-size")
    act_order: bool = setting(False, "INT4 GPTQ: quantize columns in order of activation size (checkpoint gets "
                                     "g_idx).", "--act-order")
    int4_checkpoint: str | None = setting(
        None, "INT4: auto, gptq, awq or none: the 4-bit checkpoint written to servers/vllm/ for a Hugging Face model "
              "(auto: GPTQ layout; none after AWQ).", "--int4-checkpoint", logits_only=True)
    max_bits_per_weight: float | None = setting(
        None, "INT4 text generation: the size target, the whole model's stored bits per parameter with every table "
              "counted (default: what llama.cpp's Q4_K_M stores for the model); --calib keeps as many of the most "
              "sensitive layers in 8 bits as it holds.", "--max-bits-per-weight", generation_only=True)
