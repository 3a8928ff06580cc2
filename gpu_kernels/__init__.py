"""Triton kernels, each beside its pure-torch reference, registered as torch custom ops."""
