"""Graph passes: FX/ExportedProgram passes, ONNX passes, and lowering passes (ONNX export)."""
