"""The worker's sandbox, set up from inside before anything else runs: in fresh namespaces (entered through
``unshare``) the worker pivots into a minimal read-only root (``kevin_exp.bench.jail``): the Python installation,
the ``kevin_exp`` package, the build cache (read-only, at ``SANDBOX_CACHE``), system libraries, a minimal
``/dev`` (plus the GPU's nodes on cuda), a fresh ``/proc``, private ``/tmp`` and ``/dev/shm``; nothing else of
the host. Then it drops to its leased uid and takes its resource limits.

``KX_SANDBOX_ROOT=host`` (set by the parent when the probe found that the minimal root breaks this machine's
worker, e.g. its CUDA initialisation) keeps the host's file system, read-only to the uid, with private /tmp
and /dev/shm: the weaker level ``SandboxPolicy.describe()`` reports.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

from kevin_exp.bench import jail

SANDBOX_CACHE = "/tmp/.kx-cache"
"""Where the build cache appears, read-only, inside a namespace sandbox."""
ROOT_ENV = "KX_SANDBOX_ROOT"
PACKAGE_DIR = Path(__file__).resolve().parents[2]
"""``src/kevin_exp``: the only part of the checkout a worker sees."""


def worker_root_spec(backend: str, cache_dir: str | None) -> dict:
    """What a worker's minimal root shows: see the module docstring."""
    spec: dict = {"readonly": [*jail.python_roots(), str(PACKAGE_DIR), *jail.library_path_roots()],
                  "binds": [], "devices": [], "sys": ["/sys/devices/system/cpu", "/sys/devices/system/node"],
                  "tmp_size": "2g", "shm_size": "1g"}
    if cache_dir and os.path.isdir(cache_dir):
        spec["binds"].append([cache_dir, SANDBOX_CACHE])
    if backend == "cuda":
        # the driver's device nodes; CUDA reads PCI topology and NUMA data from /sys (its own mount only,
        # not the cgroup, debug or security file systems mounted below it)
        spec["devices"] = jail.cuda_devices()
        spec["sys"] = ["/sys"]
    return spec


def _host_root(cache_dir: str | None) -> None:
    """The weaker level: the host's file system stays (read-only to the uid), /tmp and /dev/shm are private."""
    jail.mount(None, "/", None, jail.MS_REC | jail.MS_PRIVATE)
    cache_fd = os.open(cache_dir, os.O_PATH | os.O_DIRECTORY) if cache_dir and os.path.isdir(cache_dir) else None
    for target, size in (("/tmp", "2g"), ("/dev/shm", "1g")):
        if os.path.isdir(target):
            jail.mount("kx-tmp", target, "tmpfs", jail.MS_NOSUID | jail.MS_NODEV, f"size={size},mode=1777")
    if cache_fd is not None:
        Path(SANDBOX_CACHE).mkdir(parents=True)
        jail.mount(f"/proc/self/fd/{cache_fd}", SANDBOX_CACHE, None, jail.MS_BIND)
        jail.mount(None, SANDBOX_CACHE, None, jail.MS_REMOUNT | jail.MS_BIND | jail.MS_RDONLY | jail.MS_NOSUID)
        os.close(cache_fd)


def prepare_sandbox(args: argparse.Namespace) -> None:
    """Inside fresh namespaces as root: the minimal root (or the host's with private /tmp), then drop to the
    slot's uid; the environment is the allow-listed one the parent passed, plus HOME, TMPDIR and caches here."""
    if args.private_tmp:
        if os.environ.pop(ROOT_ENV, "minimal") == "host":
            _host_root(args.cache_dir)
        else:
            jail.enter_root(worker_root_spec(args.backend, args.cache_dir))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.uid is not None:
        os.chown(workdir, args.uid, args.uid)
        jail.drop_to(args.uid, 0)
    os.chdir(workdir)
    os.environ["HOME"] = str(workdir)
    os.environ["TMPDIR"] = str(workdir)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    # The sandbox uid has no passwd entry: getpass.getuser() (torch's inductor/dynamo cache paths
    # call it on first use) reads these before falling back to a lookup that would raise.
    user = f"kx-sandbox-{os.getuid()}"
    os.environ.update(USER=user, LOGNAME=user, TORCHINDUCTOR_CACHE_DIR=str(workdir / "inductor"),
                      TRITON_CACHE_DIR=str(workdir / "triton"), XDG_CACHE_HOME=str(workdir / ".cache"))
    if args.address_space_gb:
        limit = int(args.address_space_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_limit = 1 << 30
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    sys.stdout.flush()
