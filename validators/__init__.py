"""Judging an artifact: drift against the eager reference, latency, and the verdict."""
