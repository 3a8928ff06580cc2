"""Passes over a ``torch.export`` ExportedProgram's FX graph."""
