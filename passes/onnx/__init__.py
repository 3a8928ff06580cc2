"""Passes over ONNX models."""
