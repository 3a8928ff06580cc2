"""INT8's build settings (``infopt.BuildConfig.int8``): how calibration turns the ranges it sees into scales,
read by ``quantize_int8`` and ``smoothquant`` (their options' ``SETTINGS``). The calibration data itself is the
``calib`` section's, shared with INT4."""

from __future__ import annotations

from infopt.core.settings import Section, setting


class Int8Section(Section):
    """INT8 static quantization's calibration."""

    calib_method: str | None = setting(None, "How INT8 calibration turns ranges into scales (see `infopt recipes "
                                             "--passes`).", "--calib-method", logits_only=True)
    calib_percentile: float | None = setting(None, "Percentile kept by --calib-method percentile.",
                                             "--calib-percentile", logits_only=True)
    calib_bins: int | None = setting(None, "Histogram bins for percentile, entropy and mse.", "--calib-bins",
                                     logits_only=True)
    smoothquant_alpha: float | None = setting(None, "SmoothQuant migration strength, 0..1.", "--smoothquant-alpha",
                                              logits_only=True)
