"""Pure tensor functions on the shared page layout: :mod:`ssmstate.ops.reference` (PyTorch, the ground truth) and
:mod:`ssmstate.ops.triton` (the same signatures as Triton kernels). They validate shapes and compute; the
lifecycle (who owns which page, when a cursor may move) is the manager's."""
