import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Without a GPU every Triton kernel runs interpreted, and TRITON_INTERPRET=1 must be set before the first kernel is
# decorated: whichever test module happens to import ssmstate's (or vLLM's) kernels first, in any selection of files.
# With a GPU it is left alone (the interpreted CPU tests then skip unless it is set by hand).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
