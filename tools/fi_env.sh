# Source this on an offline GPU machine, from the repository root, with the FlashInfer wheels carried in .whl/
# (CONTRIBUTING.md says which and how to fetch them). It installs flashinfer-python and apache-tvm-ffi from those
# wheels into /tmp/site and puts it on PYTHONPATH, points CUDA_HOME at the toolkit that holds nvcc for FlashInfer's
# JIT, and starts the benchmarks' two checkpointing_ssu builds (tools/fi_warm.py, PDL off and on) in the background,
# logging to $OUT/warm0.log and $OUT/warm1.log (or /tmp). `wait` for them before timing FlashInfer.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || return 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
# FlashInfer's JIT cache goes to an ignored folder of the checkout, which a lent device machine keeps between calls
# while it stays warm (under $HOME the builds were redone on every call); any writable scratch folder works
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/.fi_ws}
python3 tools/fi_warm.py 0 > ${OUT:-/tmp}/warm0.log 2>&1 &
python3 tools/fi_warm.py 1 > ${OUT:-/tmp}/warm1.log 2>&1 &
