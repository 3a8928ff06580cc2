"""Lowering passes: from one representation to the next (ExportedProgram -> ONNX)."""
