"""Test support for running vLLM's real engine and kernels on a CPU machine (see cpu_triton.py)."""
