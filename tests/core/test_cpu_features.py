"""What the CPU's flags say (``core/cpu_features.py``): on x86 without VNNI, ONNX Runtime's fast int8 kernels add
pairs of products in saturating 16-bit arithmetic, and every session infopt opens asks for the exact kernels there;
without bf16 instructions, calibration multiplies in float32."""

from __future__ import annotations

import numpy as np
import pytest

from infopt.core import cpu_features, threads


@pytest.mark.parametrize(("flags", "saturate"), [("fpu sse4_1 avx avx2 fma", True),
                                                 ("fpu avx2 avx512f avx512_vnni", False),
                                                 ("fpu avx2 avx_vnni", False), ("fpu avx2 amx_int8 amx_tile", False)])
def test_the_cpu_flags_say_whether_int8_products_saturate(tmp_path, monkeypatch, flags, saturate):
    monkeypatch.setattr(cpu_features.platform, "machine", lambda: "x86_64")
    info = tmp_path / f"cpuinfo-{saturate}-{len(flags)}"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_features.int8_products_saturate(str(info)) is saturate
    assert cpu_features.int8_products_saturate(str(tmp_path / "missing")) is True  # unreadable: the safe answer
    monkeypatch.setattr(cpu_features.platform, "machine", lambda: "aarch64")
    assert cpu_features.int8_products_saturate(str(info)) is False


@pytest.mark.parametrize(("flags", "fast"), [("fpu avx avx2 fma", False), ("avx2 avx512f avx512_bf16", True),
                                             ("avx2 amx_bf16 amx_tile", True)])
def test_bf16_products_count_as_fast_on_a_gpu_or_with_bf16_instructions(tmp_path, monkeypatch, flags, fast):
    monkeypatch.setattr(cpu_features.platform, "machine", lambda: "x86_64")
    info = tmp_path / f"cpuinfo-{fast}-{len(flags)}"
    info.write_text(f"flags\t\t: {flags}\n")
    assert cpu_features.bf16_products_fast("cpu", str(info)) is fast
    assert cpu_features.bf16_products_fast("cuda", str(info)) is True
    assert cpu_features.bf16_products_fast("cpu", str(tmp_path / "missing")) is False


def test_a_session_on_a_cpu_that_saturates_computes_the_exact_int8_product(tmp_path, monkeypatch):
    """A u8 x s8 MatMulInteger whose neighbouring products sum past 16 bits (255 * 127 * 2): exact with the
    sessions' options, whatever this machine's CPU."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    monkeypatch.setattr(threads, "int8_products_saturate", lambda: True)
    weight = np.full((64, 8), 127, np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])],
        [helper.make_tensor("w", TensorProto.INT8, weight.shape, weight.flatten().tolist())])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    options = threads.ort_session_options()
    assert options.get_session_config_entry("session.x64quantprecision") == "1"
    x = np.full((4, 64), 255, np.uint8)
    got = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(got, x.astype(np.int32) @ weight.astype(np.int32))
