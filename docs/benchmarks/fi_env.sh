# Sourced by the device scripts that carry .whl (run_s17_*.sh): FlashInfer 0.7.2.post1 and apache-tvm-ffi from the
# carried wheels onto PYTHONPATH, the toolkit that holds nvcc as CUDA_HOME for its JIT, and its two builds
# (s15_fi_warm.py 0 and 1) started in the background so that they compile while the caller's ours-only work runs;
# the caller `wait`s before timing FlashInfer.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
# the JIT builds in an ignored folder of the checkout, which the device keeps between calls while the machine is warm
# (under $HOME they were rebuilt on every call: 208-211 s each, session 18)
export FLASHINFER_WORKSPACE_BASE=$PWD/.fi_ws
python3 docs/benchmarks/s15_fi_warm.py 0 > $OUT/warm0.log 2>&1 &
python3 docs/benchmarks/s15_fi_warm.py 1 > $OUT/warm1.log 2>&1 &
