"""Copy vLLM's pure-Triton Mamba prefill kernels from an installed vLLM into an ignored folder.

    python tests/gpu/copy_vllm_kernels.py [DEST]      # default DEST: .device/vllm_kernels

The vLLM wheel does not fit the GPU machine, so ``tests/gpu/test_vllm_prefill_gpu.py`` loads these
source files (``SSMSTATE_VLLM_KERNELS=DEST``) behind a small import shim. Nothing is committed: DEST is
under ``/.device/`` (git-ignored); the files stay vLLM's, with its license headers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FILES = ("causal_conv1d.py", "ssd_combined.py", "ssd_bmm.py", "ssd_chunk_scan.py", "ssd_chunk_state.py",
         "ssd_state_passing.py", "mamba_ssm.py", "triton_helpers.py")


def main() -> int:
    import vllm
    from vllm.model_executor.layers.mamba import ops

    root = Path(__file__).resolve().parents[2]
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else root / ".device" / "vllm_kernels"
    dest.mkdir(parents=True, exist_ok=True)
    src = Path(ops.__file__).parent
    for name in FILES:
        shutil.copy2(src / name, dest / name)
    (dest / "VLLM_VERSION").write_text(vllm.__version__ + "\n")
    print(f"copied {len(FILES)} kernel files of vLLM {vllm.__version__} from {src} to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
