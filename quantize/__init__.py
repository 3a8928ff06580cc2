"""Quantization.

- ``calib_data``: calibration samples from files, iterables, DataLoaders, text or ``module:function``
- ``method_names``: the INT4 methods' names, declared once
- ``calibrators``: the registered calibration methods (minmax, percentile, entropy, MSE) and their range rules
- ``observers``: the min, max and histogram of each calibrated tensor
- ``calibrate``: calibration tables per tensor, cached by content hash
- ``onnx_int8``: the quantizable layers of an ONNX model; static QDQ and dynamic INT8
- ``smoothquant``: activation outliers moved into weights before static INT8
- ``sensitivity``: per-layer drift and the FP32 fallback under a drift budget
- ``pt2e``: PT2E static INT8 (torchao) compiled with Inductor
- ``int4_format``: the packed INT4 format, ``Int4Linear`` and the ``infopt::int4_linear`` op
- ``int4_config``: INT4 weight-only settings, one config class per method, the flat recipe form, and INT4's
  build settings (``BuildConfig.int4``)
- ``int8_settings``: INT8's build settings (``BuildConfig.int8``)
- ``int4_methods``: the handler registry (a method's statistic and its per-layer quantizer)
- ``weight_only``: the streaming, block-by-block driver that calls the config's handler
- ``rtn``, ``gptq``, ``awq``: the INT4 rounding methods, each registering its handler
"""
