"""Prebuild FlashInfer's Mamba kernels for sm_90a on a CPU machine and pack them for an offline GPU machine.

FlashInfer JIT-compiles ``checkpointing_ssu`` and ``selective_state_update`` per dtype/shape specialisation, four
to five minutes of one core each, on the GPU machine. This script builds the specialisations the project's GPU
benchmarks and tests request ahead of time (nvcc needs no GPU) and packs a trimmed FlashInfer + apache-tvm-ffi
(cp312) site with the modules at FlashInfer's own AOT lookup path ``flashinfer/data/aot/<uri>/<uri>.so``, where
FlashInfer loads them without building. ``source tools/fi_aot_env.sh`` on the GPU machine unpacks it.

Steps (each skipped when its output is already in ``--work``):
  1. download the flashinfer-python and apache-tvm-ffi (cp312) wheels into ``--wheels`` and unpack them;
  2. make the build interpreter's dependencies importable (a host apache-tvm-ffi of the same version, jinja2, ...);
  3. write FlashInfer's ninja files for the specialisations (``--list`` shows them and who needs each) and build;
  4. pack ``<out>/fi.tgz`` (imports + prebuilt modules) and ``<out>/fi_src.tgz`` (headers a JIT build of another
     specialisation needs; optional on the GPU machine);
  5. ``--check``: the project's FlashInfer call sites, on CPU tensors with the kernel launch stubbed out, must load
     every module from the bundle and build none.

Needs nvcc 13.x with the CUDA headers (cuBLAS's from the nvidia-cublas wheel where the toolkit lacks them), ninja,
a C compiler, network for step 1, and a Python with torch (CPU torch is enough; without one, ``--python`` names
one, or a venv with CPU torch is made under ``--work``).

Run from the repository root:
  python tools/fi_aot.py                  # everything, then the bundle is in .device/
  python tools/fi_aot.py --check-only     # verify an existing .device/fi.tgz
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FI_VERSION = "0.7.2.post1"  # newest release whose wheel fits a 64 MiB transfer (CONTRIBUTING.md)
TVM_REQ = "apache-tvm-ffi<0.2,>=0.1.11"
TORCH_CPU = "torch==2.13.0"  # CONTRIBUTING.md's CPU test torch
# What `import flashinfer` and its JIT generators need besides torch and tvm-ffi (not bundled: the GPU machine's
# own site-packages provides them; tools/fi_aot_env.sh warns when one is missing).
HOST_DEPS = {"numpy": "numpy", "requests": "requests", "tqdm": "tqdm", "packaging": "packaging",
             "pynvml": "nvidia-ml-py", "filelock": "filelock", "jinja2": "jinja2",
             "typing_extensions": "typing-extensions"}
# The GPU machine's wheel tags (CONTRIBUTING.md: Python 3.12, x86-64 manylinux)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# Sources the spec generators render or copy into the generated folder: a JIT fallback on the GPU needs them
GEN_SOURCES = ("checkpointing_ssu_customize_config.jinja", "checkpointing_ssu.cu", "checkpointing_ssu_kernel_inst.cu",
               "checkpointing_ssu_jit_binding.cu", "selective_state_update_customize_config.jinja",
               "selective_state_update_dtype_inst.jinja", "selective_state_update.cu",
               "selective_state_update_kernel_inst.cu", "flashinfer_mamba_binding.cu", "replayssm_materialize.cu")
# bench_verify.py's default --configs with W <= 16 (FlashInfer's limit): T in {4, 2, 8}
BENCH_VERIFY_FI_T = (4, 2, 8)


def log(msg: str) -> None:
    print(f"fi_aot: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


# -- which specialisations -------------------------------------------------------------------------------------------

def module_consts(rel: str) -> dict[str, Any]:
    """Module-level literal constants of a project file, read without importing it (benchmarks import Triton)."""
    out: dict[str, Any] = {}
    for node in ast.parse((REPO / rel).read_text()).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        tgt = node.targets[0]
        try:
            val = ast.literal_eval(node.value)
        except ValueError:
            continue
        if isinstance(tgt, ast.Name):
            out[tgt.id] = val
        elif isinstance(tgt, ast.Tuple) and isinstance(val, tuple) and len(val) == len(tgt.elts):
            out.update({e.id: v for e, v in zip(tgt.elts, val) if isinstance(e, ast.Name)})
    return out


def plan() -> list[dict[str, Any]]:
    """The specialisations, as keyword sets for ``gen_spec``, each with ``why``: who calls FlashInfer with it.

    A FlashInfer module is keyed on every dtype and on head_dim P, state_size N, T, W, heads per group, groups and
    PDL; ``selective_state_update`` (the native scheme) on P, N and T only. Geometries come from the benchmarks'
    and tests' own constants and the model presets."""
    import torch
    from ssmstate.geometry import load_model

    f32, bf16 = torch.float32, torch.bfloat16
    bv = module_consts("benchmarks/bench_verify.py")  # Nemotron-H-8B layer: H, P, N, G
    ds = module_consts("benchmarks/bench_decode_step.py")  # MODELS, K, W
    tf = module_consts("tests/gpu/test_flashinfer_gpu.py")  # H, P, N, G, K, W
    specs: dict[str, dict[str, Any]] = {}

    def add(why: str, kind: str = "ckpt", state: torch.dtype = f32, dt: torch.dtype = bf16,
            scale: torch.dtype | None = None, pdl: bool = False, **geo: int) -> None:
        if kind == "ssu":  # its key has no H, G, W or PDL
            kw = dict(kind=kind, state=state, dt=dt, P=geo["P"], N=geo["N"], T=geo["T"])
        else:
            kw = dict(kind=kind, state=state, dt=dt, scale=scale, pdl=pdl, **geo)
        key = repr(sorted((k, str(v)) for k, v in kw.items()))
        specs.setdefault(key, {**kw, "why": []})["why"].append(why)

    T, W = ds["K"] + 1, ds["W"]
    for model in ds["MODELS"]:  # bench_decode_step's vllm_pair / fi_backend and native variants (FlashInfer's PDL off)
        g = load_model(model).mamba_geometry(state_dtype=f32, act_dtype=bf16)
        geo = dict(P=g.head_dim, N=g.state_size, G=g.groups_per_rank, hpg=g.heads_per_rank // g.groups_per_rank,
                   T=T, W=W)
        add(f"bench_decode_step {model}", **geo)
        add(f"bench_decode_step {model} native", "ssu", **geo)
    geo = dict(P=bv["P"], N=bv["N"], G=bv["G"], hpg=bv["H"] // bv["G"], W=W)
    for t in BENCH_VERIFY_FI_T:
        add(f"bench_verify T={t}", T=t, **geo)
    add("bench_verify native", "ssu", T=T, **geo)
    for pdl in (False, True):  # bench_layer_chain and tools/fi_warm.py (bench_verify's geometry): the only enable_pdl
        add("bench_layer_chain", T=T, pdl=pdl, **geo)
    for st in (torch.int8, torch.float8_e4m3fn):  # 8-bit checkpoints with fp32 decode scales
        add("bench_verify_quant, tests/gpu/test_quant_gpu.py", state=st, scale=f32, T=T, **geo)
    # tests/gpu/test_flashinfer_gpu.py passes fp32 dt/D/dt_bias: its own build of each module
    geo = dict(P=tf["P"], N=tf["N"], G=tf["G"], hpg=tf["H"] // tf["G"], T=tf["K"] + 1, W=tf["W"])
    add("tests/gpu/test_flashinfer_gpu.py", dt=f32, **geo)
    add("tests/gpu/test_flashinfer_gpu.py native", "ssu", dt=f32, **geo)
    # FlashInfer's autotuner times every tactic behind its stream-delay kernel: without this module each tactic
    # fails while profiling and the tuner stores none (FlashInferBackend.tune(), bench_decode_step's vllm_pair,
    # bench_verify's tuned column, tests/gpu/test_flashinfer_tune_gpu.py)
    specs["trtllm_utils"] = {"kind": "util", "why": ["FlashInfer's autotuner: the delay kernel it profiles tactics "
                                                     "behind (FlashInferBackend.tune())"]}
    return list(specs.values())


def gen_spec(s: dict[str, Any]):
    """FlashInfer's JitSpec for one planned specialisation (x/B/C bf16, A fp32, int32 state indices)."""
    import torch

    f32, bf16, i32 = torch.float32, torch.bfloat16, torch.int32
    if s["kind"] == "util":
        from flashinfer.jit.tllm_utils import gen_trtllm_utils_module

        return gen_trtllm_utils_module()
    if s["kind"] == "ssu":
        from flashinfer.jit.mamba.selective_state_update import gen_selective_state_update_sm90_module

        # (state, input, weight, A, stateIndex, scale, dim, dstate, ntokens, cu_seqlens, num_accepted, philox)
        return gen_selective_state_update_sm90_module(s["state"], bf16, s["dt"], f32, i32, None, s["P"], s["N"],
                                                      s["T"], i32, i32, 0)
    from flashinfer.jit.mamba.checkpointing_ssu import gen_checkpointing_ssu_module

    # (state, input, dt, weight, A, stateIndex, scale, dim, dstate, npredicted, max_window, hpg, ngroups, philox,
    #  pdl); D and dt_bias ("weight") share dt's dtype at every call site here
    return gen_checkpointing_ssu_module(s["state"], bf16, s["dt"], s["dt"], f32, i32, s["scale"], s["P"], s["N"],
                                        s["T"], s["W"], s["hpg"], s["G"], 0, s["pdl"])


# -- stages run inside the build / check environment -----------------------------------------------------------------

def stage_write(out: str) -> None:
    """Write each spec's build.ninja; report the names, the cache folder and flashinfer's import closure."""
    import flashinfer
    import flashinfer.autotuner  # noqa: F401
    import flashinfer.mamba  # noqa: F401
    from flashinfer.jit import env as jit_env

    names, why = [], {}
    for s in plan():
        spec = gen_spec(s)
        spec.write_ninja()
        names.append(spec.name)
        why[spec.name] = s["why"]
    root = os.path.dirname(flashinfer.__file__)
    closure = sorted({m.__file__ for m in list(sys.modules.values())
                      if getattr(m, "__file__", None) and m.__file__.startswith(root)})
    Path(out).write_text(json.dumps({"names": names, "why": why, "jit_dir": str(jit_env.FLASHINFER_JIT_DIR),
                                     "fi_root": os.path.dirname(root), "closure": closure}, indent=1))


def stage_check() -> None:
    """The project's FlashInfer call sites on CPU tensors: each module must load (a real tvm_ffi load of the bundled
    .so) from FlashInfer's AOT folder, and nothing may be built. The kernel launch is replaced by a no-op."""
    import torch
    import tvm_ffi
    import flashinfer
    import flashinfer.jit.core as core
    import flashinfer.jit.cpp_ext as cpp_ext
    from flashinfer.jit import env as jit_env

    loaded: dict[str, str] = {}
    built: list[str] = []

    class NoLaunch:
        def __getattr__(self, fn: str):
            return lambda *a, **k: None

    def load(self, so_path=None):
        if so_path is not None:
            mod = tvm_ffi.load_module(str(so_path))
            fn = next(f for p, f in (("checkpointing_ssu", "checkpointing_ssu"), ("trtllm_utils", "delay_kernel"),
                                     ("", "selective_state_update")) if self.name.startswith(p))
            getattr(mod, fn)
            loaded[self.name] = str(so_path)
        return NoLaunch()

    def build(self, *a, **k):
        built.append(self.name)

    def no_ninja(*a, **k):
        raise RuntimeError("ninja called")

    core.JitSpecNvcc.load, core.JitSpecNvcc.build = load, build
    cpp_ext.run_ninja = core.run_ninja = no_ninja
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
    from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
    from ssmstate.backends import flashinfer as fb
    from ssmstate.geometry import load_model
    import flashinfer.mamba  # noqa: F401

    # CPU tensors have no compute capability or SM count: answer as an H100/H200 does
    sys.modules["flashinfer.mamba.selective_state_update"].get_compute_capability = lambda device: (9, 0)
    sys.modules["flashinfer.mamba.checkpointing_ssu"]._sm_count = lambda device: 132
    torch.cuda.is_current_stream_capturing = lambda: False

    class PretendCuda:  # FlashInfer asserts .is_cuda on some inputs
        def __enter__(self):
            torch.Tensor.is_cuda = property(lambda self: True)

        def __exit__(self, *a):
            del torch.Tensor.is_cuda

    ds = module_consts("benchmarks/bench_decode_step.py")
    tf = module_consts("tests/gpu/test_flashinfer_gpu.py")
    T, W = ds["K"] + 1, ds["W"]
    geoms = [load_model(m).mamba_geometry(state_dtype=torch.float32, act_dtype=torch.bfloat16) for m in ds["MODELS"]]

    def backend_calls(g0, scheme: str, wdt: torch.dtype, state: torch.dtype = torch.float32, K: int = T - 1) -> None:
        """FlashInferBackend.verify as bench_decode_step's vllm_pair / fi_backend and the GPU tests call it."""
        g = Mamba2Geometry(num_heads=g0.heads_per_rank, head_dim=g0.head_dim, state_size=g0.state_size,
                           n_groups=g0.groups_per_rank, conv_kernel=4, num_layers=1, state_dtype=state,
                           act_dtype=torch.bfloat16)
        s = SpecConfig(K, window=W)
        lay = PageLayout.replay(g, s) if scheme == "replay" else PageLayout.native(g, s)
        m = StateManager(lay, 1 + 4 * lay.pages_per_request, device="cpu", backend="reference", max_batch=4)
        m.backend = fb.FlashInferBackend()
        for r in "abc":
            m.admit(r)
        H, P, G, N = g.num_heads, g.head_dim, g.n_groups, g.state_size
        for algo in ("auto", "monolith", "two-kernel") if scheme == "replay" and state == torch.float32 else ("auto",):
            m.backend.algorithm = algo
            for qs in (K + 1, [K + 1, 2, 3]):  # dense, varlen
                plan_ = m.begin_step(["a", "b", "c"], qs)
                L = plan_.total_tokens
                x, B, C = (torch.randn(L, H, P).bfloat16(), torch.randn(L, G, N).bfloat16(),
                           torch.randn(L, G, N).bfloat16())
                dt, D, dtb = torch.randn(L, H).to(wdt), torch.randn(H).to(wdt), torch.rand(H).to(wdt)
                with PretendCuda():
                    m.verify(0, plan_, x, dt, B, C, -torch.rand(H) - 0.5, D=D, dt_bias=dtb)
                m.commit(plan_, [1] * 3) if scheme == "native" else m.rollback(plan_)

    for g in geoms:
        backend_calls(g, "replay", torch.bfloat16)
    tgeom = Mamba2Geometry(num_heads=tf["H"], head_dim=tf["P"], state_size=tf["N"], n_groups=tf["G"], conv_kernel=4,
                           num_layers=1)
    backend_calls(tgeom, "native", torch.float32, K=tf["K"])
    backend_calls(tgeom, "replay", torch.float32, K=tf["K"])
    for st in (torch.int8, torch.float8_e4m3fn):  # tests/gpu/test_quant_gpu.py's manager test
        backend_calls(geoms[0], "replay", torch.bfloat16, state=st)

    import bench_layer_chain as blc
    import bench_verify as bv
    import bench_verify_quant as bvq

    bv.DEV = "cpu"
    for t, state in [(t, torch.float32) for t in BENCH_VERIFY_FI_T] + [(T, torch.int8), (T, torch.float8_e4m3fn)]:
        lay = bvq.layout_of(state, t, W)
        pool = bv.Pool(lay, 4, 2, seed=0)
        call = bv.fi_caller(pool, 2, t, W)
        ids = torch.tensor([1, 2], dtype=torch.int32)
        for algo in ("auto", "monolith", "two-kernel") if state == torch.float32 else ("monolith",):
            with PretendCuda():
                call(ids, algo)()
        if t == T and state == torch.float32:
            co = torch.randn(2 * t, bv.H * bv.P + 2 * bv.G * bv.N, dtype=torch.bfloat16)
            chain = blc.fi_setup(flashinfer, pool, lay, 2, co, pool.out[:2 * t])
            for pdl in (False, True):
                for algo in ("auto", "monolith"):
                    chain(ids, algo, pdl)()
    # bench_decode_step / bench_verify's native step: selective_state_update with bf16 dt/D/dt_bias
    from flashinfer.mamba import selective_state_update

    for g in geoms:
        H, P, N, G, rows = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, 2
        st = torch.zeros(1 + rows * T, H, P, N)
        x = torch.randn(rows, T, H, P).bfloat16()
        dt4 = torch.randn(rows, T, H, 1).bfloat16().expand(rows, T, H, P)
        A3 = torch.rand(H)[:, None, None].expand(H, P, N)
        D2 = torch.randn(H).bfloat16()[:, None].expand(H, P)
        Bm = torch.randn(rows, T, G, N).bfloat16()
        table = torch.arange(1, 1 + rows * T, dtype=torch.int32).view(rows, T)
        selective_state_update(st, x, dt4, A3, Bm, Bm.clone(), D2, dt_bias=D2, dt_softplus=True,
                               state_batch_indices=table, dst_state_batch_indices=table, pad_slot_id=0,
                               num_accepted_tokens=torch.ones(rows, dtype=torch.int32), out=torch.empty_like(x),
                               cache_steps=T)
    # FlashInferBackend.tune() / FlashInfer's autotuner: the delay kernel it profiles every tactic behind
    from flashinfer.tllm_utils import get_trtllm_utils_module

    get_trtllm_utils_module()
    aot = str(jit_env.FLASHINFER_AOT_DIR)
    outside = sorted(k for k, v in loaded.items() if not v.startswith(aot))
    unused = sorted(set(os.listdir(aot)) - set(loaded))  # in the bundle, but no call site here asks for it
    for k in sorted(loaded):
        print(f"  loaded {k}")
    print(f"loaded {len(loaded)} modules from the bundle, built {len(built)} {built}, loaded from elsewhere "
          f"{len(outside)} {outside}, bundled but unused {len(unused)} {unused}")
    if built or outside or not loaded:
        sys.exit(1)
    print("check passed" + (" (a bundled module no call site asks for is only dead weight)" if unused else ""))


# -- steps on the driving machine ------------------------------------------------------------------------------------

def fetch_wheels(wheels: Path) -> tuple[Path, Path]:
    def find() -> tuple[list[str], list[str]]:
        return (glob.glob(str(wheels / f"flashinfer_python-{FI_VERSION}-*.whl")),
                glob.glob(str(wheels / "apache_tvm_ffi-*-cp312-*.whl")))

    fi, tvm = find()
    if not (fi and tvm):
        wheels.mkdir(parents=True, exist_ok=True)
        plat = [a for p in PLATFORMS for a in ("--platform", p)]
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             "--implementation", "cp", *plat, "-d", str(wheels), f"flashinfer-python=={FI_VERSION}", TVM_REQ])
        fi, tvm = find()
    return Path(sorted(fi)[-1]), Path(sorted(tvm)[-1])


def unpack(whl: Path, dest: Path, marker: str) -> Path:
    if not (dest / marker).exists():
        shutil.rmtree(dest, ignore_errors=True)
        log(f"unpacking {whl.name} -> {dest}")
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)
    return dest.resolve()  # resolved: the ninja command lines (and so ninja's up-to-date checks) carry these paths


def probe(py: str, code: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env)
    return r.stdout.strip() if r.returncode == 0 else None


def build_python(args: argparse.Namespace, work: Path, tvm_version: str) -> tuple[str, Path]:
    """The interpreter that generates and builds, and a folder with what it lacks (host tvm-ffi, jinja2, ...)."""
    py = args.python or sys.executable
    if probe(py, "import torch") is None:
        venv = work / "venv"
        py = str(venv / "bin" / "python")
        if probe(py, "import torch") is None:
            run([sys.executable, "-m", "venv", str(venv)])
            run([py, "-m", "pip", "install", "-q", TORCH_CPU, "--index-url", "https://download.pytorch.org/whl/cpu"])
    host = work / "host"
    have_tvm = probe(py, "import tvm_ffi; print(tvm_ffi.__version__)")
    missing = [pkg for mod, pkg in HOST_DEPS.items() if probe(py, f"import {mod}") is None]
    if have_tvm != tvm_version:
        if have_tvm is not None:
            log(f"build Python has apache-tvm-ffi {have_tvm}; installing {tvm_version} into {host} ahead of it")
        missing.append(f"apache-tvm-ffi=={tvm_version}")  # the same version as the bundled cp312 one: same ABI
    if missing and not (host / ".done").exists():
        run([py, "-m", "pip", "install", "-q", "--target", str(host), *missing])
        (host / ".done").write_text(" ".join(missing))
    return py, host


def cuda_home(args: argparse.Namespace) -> str:
    if args.cuda_home or os.environ.get("CUDA_HOME"):
        return args.cuda_home or os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    return "/usr/local/cuda"


def cublas_headers(work: Path, wheels: Path, home: str) -> str:
    """A folder with cuBLAS's headers: the toolkit's own, else those of the nvidia-cublas wheel of nvcc's major
    version (trtllm_utils includes cublasLt.h for its types only; nothing links cuBLAS)."""
    if os.path.exists(f"{home}/include/cublasLt.h"):
        return f"{home}/include"
    inc = work / "cublas"
    if not (inc / "cublasLt.h").exists():
        major = run([f"{home}/bin/nvcc", "--version"], capture_output=True, text=True).stdout.split("release ")[1][:2]
        # CUDA 13's wheel is nvidia-cublas 13.x; earlier majors' are nvidia-cublas-cu<major>
        req, pattern = (("nvidia-cublas>=13,<14", "nvidia_cublas-13.*.whl") if major == "13" else
                        (f"nvidia-cublas-cu{major}", f"nvidia_cublas_cu{major}-*.whl"))
        found = glob.glob(str(wheels / pattern))
        if not found:
            run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), req])
            found = glob.glob(str(wheels / pattern))
        inc.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(sorted(found)[-1]) as z:
            for name in z.namelist():
                if "/include/" in name and name.endswith(".h"):
                    (inc / os.path.basename(name)).write_bytes(z.read(name))
    return str(inc)


def libcuda_stub(work: Path, home: str) -> str:
    """A folder with a libcuda.so to link against: the toolkit's stub, else an empty one (soname libcuda.so.1)."""
    for d in (f"{home}/lib64/stubs", f"{home}/targets/x86_64-linux/lib/stubs"):
        if os.path.exists(f"{d}/libcuda.so"):
            return d
    d = work / "stubs"
    if not (d / "libcuda.so").exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / "s.c").write_text("void fi_aot_cuda_stub(void) {}\n")
        run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so"),
             str(d / "s.c")])
    return str(d)


def stage_env(pythonpath: list[str], home: str, workspace: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), CUDA_HOME=home, FLASHINFER_CUDA_ARCH_LIST="9.0a",
               FLASHINFER_WORKSPACE_BASE=str(workspace), PYTHONUNBUFFERED="1")
    return env


def bundle(info: dict[str, Any], fiw: Path, tvm: Path, all_ninja: Path, out: Path, src: bool) -> None:
    """Trimmed site: flashinfer's import closure + the packages on the mamba/autotuner call path, the prebuilt
    modules at flashinfer/data/aot/<uri>/<uri>.so, apache-tvm-ffi cp312 without its sources."""
    stage = Path(tempfile.mkdtemp(prefix="fi_aot_"))
    site, hdr = stage / "site", stage / "src" / "site"
    fi_root = info["fi_root"]
    rel = lambda p: os.path.relpath(p, fiw)  # noqa: E731
    keep = {os.path.relpath(f, fi_root) for f in info["closure"]}
    for pat in ("flashinfer/*.py", "flashinfer/jit/**/*.py", "flashinfer/trace/**/*.py", "flashinfer/autotuner/**/*.py",
                "flashinfer/mamba/**/*.py", "flashinfer/tuning_configs/**/*.py", "flashinfer/py.typed",
                "flashinfer_python-*.dist-info/**"):
        keep |= {rel(p) for p in glob.glob(str(fiw / pat), recursive=True) if os.path.isfile(p)}
    for f in list(keep):  # each kept module's packages must import
        d = os.path.dirname(f)
        while d.startswith("flashinfer"):
            if (fiw / d / "__init__.py").exists():
                keep.add(f"{d}/__init__.py")
            d = os.path.dirname(d)
    keep |= {f"flashinfer/data/csrc/{c}" for c in GEN_SOURCES if (fiw / "flashinfer/data/csrc" / c).exists()}
    # headers the builds read (ninja's depfile record), for fi_src.tgz
    deps = subprocess.run(["ninja", "-C", info["jit_dir"], "-f", str(all_ninja), "-t", "deps"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    prefix = f"{fiw}/flashinfer/data/"
    headers = {rel(d.strip()) for d in deps if d.startswith("    ") and d.strip().startswith(prefix)}
    headers |= {rel(p) for p in glob.glob(str(fiw / "flashinfer/data/include/flashinfer/mamba/**"), recursive=True)
                if os.path.isfile(p)}

    def cp(root: Path, r: str, dst_root: Path) -> None:
        (dst_root / r).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / r, dst_root / r)

    for r in sorted(keep):
        cp(fiw, r, site)
    for r in sorted(headers - keep):
        cp(fiw, r, hdr)
    for name in info["names"]:
        dst = site / "flashinfer/data/aot" / name / f"{name}.so"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(info["jit_dir"]) / name / f"{name}.so", dst)
    for root, _, files in os.walk(tvm):
        for f in files:
            r = os.path.relpath(os.path.join(root, f), tvm)
            if not (r.startswith(("tvm_ffi/3rdparty/libbacktrace", "tvm_ffi/src/", "tvm_ffi/cython/"))
                    or "__pycache__" in r):
                cp(tvm, r, site)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "fi.tgz", "w:gz", compresslevel=9) as t:
        t.add(site, arcname="site")
    if src:
        with tarfile.open(out / "fi_src.tgz", "w:gz", compresslevel=9) as t:
            t.add(hdr, arcname="site")
    shutil.rmtree(stage)
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in (out / "fi.tgz", out / "fi_src.tgz")
                      if p.exists() and (src or p.name == "fi.tgz"))
    log(f"packed {len(info['names'])} modules: {sizes}")


def check(py: str, tvm_host: str | None, out: Path, home: str, work: Path, host: Path) -> int:
    """Unpack the bundle to a temporary folder and run stage_check against it (``host``: the build Python's
    FlashInfer dependencies that step 2 installed, after the bundle's own packages)."""
    with tempfile.TemporaryDirectory(prefix="fi_aot_check_") as d:
        with tarfile.open(out / "fi.tgz") as t:
            t.extractall(d)
        # the bundle's tvm-ffi is cp312; another build Python loads its own tvm-ffi of the same version instead
        path = ([tvm_host] if tvm_host else []) + [f"{d}/site", str(host), str(REPO)]
        env = stage_env(path, home, work / "check_ws")
        env["FLASHINFER_DISABLE_JIT"] = "1"  # a missing module raises instead of building
        # the prebuilt modules need libcudart.so.13 to load (torch with CUDA provides it on the GPU machine)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [f"{home}/lib64", env.get("LD_LIBRARY_PATH")]))
        return subprocess.run([py, __file__, "--stage", "check"], env=env).returncode


def tvm_overlay(py: str, host: Path, work: Path) -> str | None:
    """A folder that holds only the build Python's own tvm_ffi (None on cp312, where the bundled one loads)."""
    if probe(py, "import sys; print(sys.version_info[:2] == (3, 12))") == "True":
        return None
    if (host / "tvm_ffi").exists():
        src = str(host / "tvm_ffi")
    else:
        src = probe(py, "import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))")
    ov = work / "tvm_host"
    shutil.rmtree(ov, ignore_errors=True)
    ov.mkdir(parents=True)
    (ov / "tvm_ffi").symlink_to(src)
    return str(ov)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "fi_aot",
                    help="build folder: unpacked wheels (fiw/, tvm312/), FlashInfer's cache (ws/), host packages "
                         "(host/); reused on the next run, so only changed modules rebuild (default %(default)s)")
    ap.add_argument("--wheels", type=Path, default=REPO / ".whl", help="wheel folder (default %(default)s)")
    ap.add_argument("--out", type=Path, default=REPO / ".device", help="where fi.tgz goes (default %(default)s)")
    ap.add_argument("--python", help="build Python with torch (default: this one; without torch, a venv in --work)")
    ap.add_argument("--cuda-home", help="CUDA toolkit (default $CUDA_HOME, else nvcc's)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2,
                    help="parallel nvcc jobs, each one core and a few GiB (default %(default)s)")
    ap.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                    help="build only the modules whose name contains SUBSTR (repeatable); the others must already "
                         "be built in --work, since the bundle packs all of them")
    ap.add_argument("--no-build", action="store_true", help="pack what --work already holds")
    ap.add_argument("--no-src", action="store_true", help="skip fi_src.tgz")
    ap.add_argument("--check", action="store_true", help="after packing, verify the bundle on the CPU")
    ap.add_argument("--check-only", action="store_true", help="only verify the existing <out>/fi.tgz")
    ap.add_argument("--list", action="store_true", help="print the specialisations and who needs each, then exit")
    ap.add_argument("--stage", choices=("write", "check"), help=argparse.SUPPRESS)
    ap.add_argument("--stage-out", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.stage == "write":
        return stage_write(args.stage_out)
    if args.stage == "check":
        return stage_check()

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    fi_whl, tvm_whl = fetch_wheels(args.wheels)
    tvm_version = tvm_whl.name.split("-")[1]
    fiw = unpack(fi_whl, work / "fiw", "flashinfer/__init__.py")
    tvm = unpack(tvm_whl, work / "tvm312", "tvm_ffi/__init__.py")
    py, host = build_python(args, work, tvm_version)
    home = cuda_home(args)
    workspace = (work / "ws").resolve() if (work / "ws").exists() else work / "ws"
    if args.check_only:
        sys.exit(check(py, tvm_overlay(py, host, work), args.out, home, work, host))

    env = stage_env([str(fiw), str(host), str(REPO)], home, workspace)
    info_path = work / "specs.json"
    subprocess.run([py, __file__, "--stage", "write", "--stage-out", str(info_path)], env=env, check=True)
    info = json.loads(info_path.read_text())
    if args.list:
        for n in info["names"]:
            print(f"{n}\n    {'; '.join(info['why'][n])}")
        return
    all_ninja = work / "all.ninja"
    all_ninja.write_text("ninja_required_version = 1.3\n" + "".join(
        f"subninja {info['jit_dir']}/{n}/build.ninja\n" for n in info["names"]))
    if not args.no_build:
        targets = [f"{info['jit_dir']}/{n}/{n}.so" for n in info["names"] if not args.only
                   or any(s in n for s in args.only)]
        env["LIBRARY_PATH"] = os.pathsep.join(filter(None, [libcuda_stub(work, home), env.get("LIBRARY_PATH")]))
        if any("trtllm_utils" in t for t in targets):  # its sources include cublasLt.h, which a toolkit may lack
            inc = cublas_headers(work, args.wheels, home)
            env["NVCC_APPEND_FLAGS"] = f"{env.get('NVCC_APPEND_FLAGS', '')} -isystem {inc}".strip()
            env["CPLUS_INCLUDE_PATH"] = os.pathsep.join(filter(None, [inc, env.get("CPLUS_INCLUDE_PATH")]))
        run(["ninja", "-j", str(args.jobs), "-C", info["jit_dir"], "-f", str(all_ninja), *targets], env=env)
    missing = [n for n in info["names"] if not (Path(info["jit_dir"]) / n / f"{n}.so").exists()]
    if missing:
        sys.exit(f"fi_aot: not built: {missing}")
    bundle(info, fiw, tvm, all_ninja, args.out, not args.no_src)
    if args.check:
        sys.exit(check(py, tvm_overlay(py, host, work), args.out, home, work, host))


if __name__ == "__main__":
    main()
