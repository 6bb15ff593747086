"""Triton kernels on the shared page layout, each with the signature of its twin in :mod:`ssmstate.ops.reference`."""
