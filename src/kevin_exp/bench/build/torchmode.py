"""The reference path: torch's own ``load_inline`` in a subprocess, so its cost can be measured."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kevin_exp.bench.spec import ExtensionSpec

from . import compiler_input, glue, proc

_RUNNER = r"""
import json, sys
spec = json.load(open(sys.argv[1]))
from torch.utils.cpp_extension import load_inline
load_inline(name=spec["module"], cpp_sources=list(spec["cpp"]), cuda_sources=list(spec["cuda"]) or None,
            functions=spec["functions"], extra_cflags=spec["cflags"], extra_cuda_cflags=spec["cuda_cflags"],
            extra_ldflags=spec["ldflags"], extra_include_paths=spec["include_paths"],
            build_directory=sys.argv[2], verbose=True, with_cuda=spec["with_cuda"])
print("kx: load_inline ok")
"""


def build_torch(spec: ExtensionSpec, module: str, tmp: Path, deadline: float, memory_limit_gb: float, jobs: int,
                arch: str | None) -> proc.ProcResult:
    if spec.functions is not None:  # load_inline pastes them into the C++ it generates
        compiler_input.check_names(spec.functions, module)
    payload = {
        "module": module,
        "cpp": [glue.rename_literal_module(s, spec.name) for s in spec.cpp_sources],
        "cuda": [glue.rename_literal_module(s, spec.name) for s in spec.cuda_sources],
        "functions": list(spec.functions) if spec.functions is not None else None,
        "cflags": list(spec.extra_cflags),
        "cuda_cflags": list(spec.extra_cuda_cflags),
        "ldflags": list(spec.extra_ldflags),
        "include_paths": [os.path.abspath(p) for p in spec.extra_include_paths],
        "with_cuda": spec.with_cuda,
    }
    (tmp / "kx_spec.json").write_text(json.dumps(payload))
    env = dict(os.environ, MAX_JOBS=str(max(1, jobs)))
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    argv = [interpreter(), "-c", _RUNNER, str(tmp / "kx_spec.json"), str(tmp)]
    return proc.run(argv, tmp, deadline, memory_limit_gb, env=env)


def interpreter() -> str:
    """This interpreter under its installation's real folder: the sandbox shows the Python installation by its
    real path, so a venv reached through a symbolic link (or a folder name with a space that links to it) is run
    from where it really is, still as the venv (its ``bin/python``, beside its ``pyvenv.cfg``)."""
    exe = Path(sys.executable)
    try:
        inside = exe.relative_to(sys.prefix)
    except ValueError:
        return str(exe)
    return str(Path(os.path.realpath(sys.prefix)) / inside)
