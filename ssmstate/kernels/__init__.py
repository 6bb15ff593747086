"""Kernels on the shared page layout: reference (PyTorch), triton, flashinfer, native."""
