# Source on an offline Hopper GPU machine, from the repository root, with .device/ carried: `source tools/fi_aot_env.sh`
# Unpacks .device/fi.tgz (made by tools/fi_aot.py: trimmed flashinfer-python + apache-tvm-ffi cp312 + prebuilt sm_90a
# modules at FlashInfer's AOT path flashinfer/data/aot/<uri>/<uri>.so) into /tmp/fi/site and puts it and the checkout
# on PYTHONPATH. FlashInfer loads a module found there directly: no ninja, no nvcc compile (it still runs
# `$CUDA_HOME/bin/nvcc --list-gpu-arch` once per process, a flag probe). .device/fi_src.tgz (optional) adds the
# headers a JIT build of a specialisation outside the bundle needs (four to five minutes each).
# FI_STRICT=1: such a specialisation raises MissingJITCacheError instead of building.
_fi_d=/tmp/fi
if [ ! -f $_fi_d/ok ] || [ .device/fi.tgz -nt $_fi_d/ok ]; then
  rm -rf $_fi_d && mkdir -p $_fi_d && tar xzf .device/fi.tgz -C $_fi_d || return 1
  [ -f .device/fi_src.tgz ] && tar xzf .device/fi_src.tgz -C $_fi_d
  touch $_fi_d/ok
fi
export PYTHONPATH=$_fi_d/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -n "$CUDA_HOME" ] || export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc))))
# a wrapper nvcc (e.g. /usr/local/bin/nvcc) gives a CUDA_HOME without the headers
[ -f $CUDA_HOME/include/cuda_runtime.h ] || { [ -f /usr/local/cuda/include/cuda_runtime.h ] && export CUDA_HOME=/usr/local/cuda; }
export FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$_fi_d/ws}
# flashinfer's import needs these from the machine's own site-packages (not bundled); cutlass (nvidia-cutlass-dsl)
# must be absent: with it, flashinfer imports CuTe-DSL modules the trimmed bundle leaves out
python3 -c "import importlib.util as u; m=[n for n in ('torch','numpy','requests','tqdm','packaging','pynvml','filelock','jinja2','typing_extensions') if u.find_spec(n) is None]; c=u.find_spec('cutlass'); m and print('fi_aot_env: missing', m); c and print('fi_aot_env: cutlass-dsl present; trimmed flashinfer may not import')"
[ "${FI_STRICT:-0}" = 1 ] && export FLASHINFER_DISABLE_JIT=1
unset _fi_d
