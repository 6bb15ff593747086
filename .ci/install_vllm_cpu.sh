#!/usr/bin/env bash
# vLLM 0.33.0 for the integration tests on a CPU machine: no CUDA dependencies, torch and triton untouched.
# vLLM pins a CUDA torch; installing it with its dependencies would replace the CPU build.
set -euo pipefail
PY=${1:-python3}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
pip_install --no-deps vllm==0.33.0
pip_install packaging regex psutil pyzmq pydantic cbor2 "transformers>=5.16.1,<5.20" msgspec \
    cachetools cloudpickle py-cpuinfo einops blake3 requests aiohttp openai-harmony openai pillow \
    pybase64 uvloop prometheus_client xgrammar fastapi partial-json-parser llguidance
"$PY" - <<'PY'
import torch, triton, vllm
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)
PY
