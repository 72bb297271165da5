"""The exact compiler and linker flags torch's ``load_inline`` uses, and the toolchain identity.

Flags are read from torch's own ninja-file writer (so they follow the installed torch version:
``-std=c++17`` before 2.13, ``-std=c++20`` after, the ABI defines of older releases, ...), then the
CUDA parts are added the way ``torch.utils.cpp_extension`` adds them.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

LEAN_HEADERS_DIR = Path(__file__).parent / "lean_headers"  # the lean headers' static part (lean.py), an include dir


@dataclass(frozen=True)
class TorchFlags:
    cxx: str  # host compiler torch would use ($CXX or c++)
    common: tuple[str, ...]  # defines and include dirs (without -DTORCH_EXTENSION_NAME)
    cxx_only: tuple[str, ...]  # -fPIC, -std=...
    std: str  # the -std=c++NN flag
    ldflags: tuple[str, ...]  # -shared -L<torch>/lib -lc10 ... (cpu)
    torch_lib: str


@functools.lru_cache(maxsize=None)
def torch_flags() -> TorchFlags:
    import torch.utils.cpp_extension as ce

    cxx = ce.get_cxx_compiler()
    try:
        cflags, ldflags = _probe_ninja(ce)
    except Exception:  # noqa: BLE001 - private API drift: fall back to the documented shape
        cflags, ldflags = _fallback(ce)
    std = next((f for f in cflags if f.startswith("-std=")), "-std=c++17")
    common = tuple(f for f in cflags if f not in ("-fPIC", std) and not f.startswith("-DTORCH_EXTENSION_NAME="))
    return TorchFlags(cxx, common, ("-fPIC", std), std, tuple(ldflags), ce.TORCH_LIB_PATH)


def _call_with_known_kwargs(fn, **kwargs):
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _probe_ninja(ce) -> tuple[list[str], list[str]]:
    ldflags = _call_with_known_kwargs(
        ce._prepare_ldflags, extra_ldflags=[], with_cuda=False, with_sycl=False, verbose=False, is_standalone=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "build.ninja")
        _call_with_known_kwargs(
            ce._write_ninja_file_to_build_library, path=path, name="kx_probe", sources=[os.path.join(tmp, "main.cpp")],
            extra_cflags=[], extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=list(ldflags),
            extra_include_paths=[], with_cuda=False, with_sycl=False, is_standalone=False,
        )
        text = Path(path).read_text()
    # torch quotes the include dirs of cflags but joins ldflags unquoted (-L<torch>/lib), so only cflags are
    # read back from the text; the link flags are the list itself, as torch's ninja writer prefixes them
    cflags = re.search(r"^cflags = (.*)$", text, flags=re.M)
    if cflags is None:
        raise ValueError("no cflags line in torch's ninja file")
    return shlex.split(cflags.group(1)), _link_flags(ce, list(ldflags))


def _link_flags(ce, ldflags: list[str]) -> list[str]:
    """``-shared`` and ``ldflags``, as ``_write_ninja_file_to_build_library`` puts them (not standalone)."""
    out = [getattr(ce, "SHARED_FLAG", "-shared"), *ldflags]
    if sys.platform == "darwin":
        out += ["-undefined", "dynamic_lookup"]
    return out


def _fallback(ce) -> tuple[list[str], list[str]]:
    import torch

    major_minor = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    std = "-std=c++20" if major_minor >= (2, 13) else "-std=c++17"
    cflags = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for inc in [*ce.include_paths("cpu"), sysconfig.get_path("include", scheme="posix_prefix")]:
        cflags += ["-isystem", inc]
    cflags += ["-fPIC", std]
    libs = ["-shared", f"-L{ce.TORCH_LIB_PATH}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return cflags, libs


@functools.lru_cache(maxsize=None)
def cuda_home() -> str | None:
    import torch.utils.cpp_extension as ce

    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), ce.CUDA_HOME):
        if cand and os.path.isdir(cand):
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc:
        # /usr/local/bin/nvcc may be a wrapper script: prefer a home that has the CUDA headers
        for home in (os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), os.path.dirname(os.path.dirname(nvcc))):
            if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
                return home
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


def nvcc_path() -> str:
    home = cuda_home()
    if os.environ.get("PYTORCH_NVCC"):
        return os.environ["PYTORCH_NVCC"]
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc") or "nvcc"


def arch_gencode(arch: str) -> list[str]:
    """'9.0a' -> ['-gencode=arch=compute_90a,code=sm_90a'] ('+PTX' adds the PTX target, as torch does)."""
    version = arch.split("+")[0].strip()
    if not re.fullmatch(r"\d+\.\d+[af]?", version):
        raise ValueError(f"bad CUDA arch {arch!r}")
    num = version.replace(".", "")
    flags = [f"-gencode=arch=compute_{num},code=sm_{num}"]
    if arch.endswith("+PTX"):
        flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def _visible_gpu_capability() -> tuple[int, int] | None:
    """Compute capability of the first visible GPU, without creating a CUDA context in this
    process when torch has not (nvidia-smi reads it through NVML)."""
    import torch

    if torch.cuda.is_initialized():
        return torch.cuda.get_device_capability()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        index = (visible or "0").split(",")[0].strip()
        select = ["-i", index] if index.isdigit() else []
        try:
            out = subprocess.run([smi, *select, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
            m = re.match(r"\s*(\d+)\.(\d+)", out.stdout)
            if out.returncode == 0 and m:
                return int(m.group(1)), int(m.group(2))
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_capability()
    except Exception:  # noqa: BLE001 - a broken driver: fall through to the environment
        pass
    return None


def resolve_cuda_arch(explicit: str | None) -> str:
    """The arch to build for: explicit, else the visible GPU's ('9.0a' from 9.0: arch-specific
    features such as wgmma need it, and the build only has to run on this machine), else the first
    entry of TORCH_CUDA_ARCH_LIST."""
    if explicit:
        return explicit
    cap = _visible_gpu_capability()
    if cap is not None:
        return f"{cap[0]}.{cap[1]}{'a' if cap >= (9, 0) else ''}"
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";").split(";")[0].strip()
    if env:
        return env
    raise ValueError("cuda_arch not given, no GPU visible and TORCH_CUDA_ARCH_LIST unset")


def cuda_compile_flags(user_cuda_cflags: tuple[str, ...], arch: str) -> list[str]:
    """nvcc flags as torch builds them: common + NVCC defaults + arch + -fPIC + user flags + -std."""
    import torch.utils.cpp_extension as ce

    tf = torch_flags()
    home = cuda_home()
    flags = list(tf.common)
    if home and os.path.join(home, "include") != "/usr/include":
        flags += ["-isystem", os.path.join(home, "include")]
    flags += list(ce.COMMON_NVCC_FLAGS)
    if not any("arch" in f for f in user_cuda_cflags if "TORCH_EXTENSION_NAME" not in f):
        flags += arch_gencode(arch)
    flags += ["--compiler-options", "-fPIC", *user_cuda_cflags]
    if not any(f.startswith("-std=") for f in flags):
        flags.append(tf.std)
    if os.environ.get("CC"):
        flags = ["-ccbin", os.environ["CC"], *flags]
    return flags


def cuda_ldflags() -> list[str]:
    tf = torch_flags()
    home = cuda_home() or "/usr/local/cuda"
    libdir = os.path.join(home, "lib64")
    if not os.path.exists(libdir) and os.path.exists(os.path.join(home, "lib")):
        libdir = os.path.join(home, "lib")
    out: list[str] = []
    for f in tf.ldflags:  # torch's order: -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch -ltorch_python
        out.append(f)
        if f == "-lc10":
            out.append("-lc10_cuda")
        elif f == "-ltorch_cpu":
            out.append("-ltorch_cuda")
    return [*out, f"-L{libdir}", "-lcudart"]


def _version_text(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        return (out.stdout + out.stderr).strip() or "unavailable"
    except (OSError, subprocess.SubprocessError):
        return "unavailable"


@functools.lru_cache(maxsize=None)
def cxx_version() -> str:
    return _version_text([torch_flags().cxx, "--version"])


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    return _version_text([nvcc_path(), "--version"])


def _toolchain_id(with_nvcc: bool) -> dict[str, str]:
    import torch

    ident = {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "torch_include": os.path.dirname(torch.__file__),
        "ext_suffix": str(sysconfig.get_config_var("EXT_SUFFIX")),
        "cxx": cxx_version(),
        "flags": " ".join(torch_flags().common + torch_flags().cxx_only),
    }
    if with_nvcc:
        ident["nvcc"] = nvcc_version()
    return ident


def _stat(path: str | None) -> list:
    try:
        st = os.stat(path) if path else None
        return [path, st.st_mtime_ns, st.st_size] if st else [path]
    except OSError:
        return [path]


def _fingerprint(with_nvcc: bool) -> str:
    """What the toolchain identity depends on, read without importing torch.utils.cpp_extension
    (it imports setuptools: 0.15 s, most of a cache hit) and without running compilers."""
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    env = {k: os.environ.get(k) for k in ("CXX", "CC", "CUDA_HOME", "CUDA_PATH", "PYTORCH_NVCC", "PATH")}
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    payload = [torch.__version__, _stat(os.path.join(torch_dir, "utils", "cpp_extension.py")), env,
               _stat(cxx), _stat(os.path.realpath(cxx) if cxx else None), sys.executable, with_nvcc,
               _stat(shutil.which("nvcc")) if with_nvcc else None]
    return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()


_memo: dict[tuple[str, bool], dict[str, str]] = {}


def toolchain_id(with_nvcc: bool, cache_root: Path | None = None) -> dict[str, str]:
    """Torch version, flags and compiler versions (part of every cache key), memoised on disk."""
    fp = _fingerprint(with_nvcc)
    path = cache_root / "toolchain" / f"{fp}.json" if cache_root is not None else None
    ident = _memo.get((fp, with_nvcc))
    if ident is None and path is not None and path.exists():
        try:
            ident = json.loads(path.read_text())
        except (OSError, ValueError):
            ident = None
    if ident is None:
        ident = _toolchain_id(with_nvcc)
    _memo[(fp, with_nvcc)] = ident
    if path is not None and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")  # builds run in threads
        tmp.write_text(json.dumps(ident))
        os.replace(tmp, path)
    return ident
