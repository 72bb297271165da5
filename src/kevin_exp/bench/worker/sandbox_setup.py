"""The worker's sandbox, set up from inside before anything else runs: in fresh namespaces (entered through
``unshare``) the worker pivots into a minimal read-only root (``kevin_exp.bench.jail``): the Python installation,
the ``kevin_exp`` package, the build cache (read-only, at ``SANDBOX_CACHE``), system libraries, a minimal
``/dev`` (plus the GPU's nodes on cuda), a fresh ``/proc``, private ``/tmp`` and ``/dev/shm`` (``noexec``: what the
worker writes cannot be mapped executable); nothing else of the host. Then it drops to its leased uid and takes its resource limits.

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
                  "tmp_size": "2g", "shm_size": "1g", "noexec_writable": True}
    if cache_dir and os.path.isdir(cache_dir):
        spec["binds"].append([cache_dir, SANDBOX_CACHE])
    if backend == "cuda":
        # the driver's device nodes; CUDA reads PCI topology and NUMA data from /sys (its own mount only,
        # not the cgroup, debug or security file systems mounted below it)
        spec["devices"] = jail.cuda_devices()
        spec["sys"] = ["/sys"]
    return spec


def _blocking_ancestor(path: Path) -> Path | None:
    """The highest ancestor of ``path`` that others may not traverse (e.g. /root, mode 700)."""
    for parent in reversed(path.parents):
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except OSError:
            return None
    return None


def _bind_ro(source: str, target: str) -> None:
    jail.mount(source, target, None, jail.MS_BIND)
    jail.mount(None, target, None, jail.MS_REMOUNT | jail.MS_BIND | jail.MS_RDONLY | jail.MS_NOSUID)


def _expose_readonly(paths: list[Path]) -> None:
    """Make ``paths`` readable by an unprivileged uid, read-only: a directory like /root (mode 700) that holds
    the interpreter is covered by an empty tmpfs, and only the needed children are bound back."""
    stage = Path("/tmp/.kx-stage")
    covered: dict[Path, Path] = {}
    for path in paths:
        blocker = _blocking_ancestor(path)
        if blocker is None or blocker in covered:
            continue
        staged = stage / str(len(covered))
        staged.mkdir(parents=True)
        jail.mount(str(blocker), str(staged), None, jail.MS_BIND)
        jail.mount("kx-cover", str(blocker), "tmpfs", jail.MS_NOSUID, "mode=755,size=1m")
        covered[blocker] = staged
    for path in paths:
        for b, staged in covered.items():
            if path == b or b not in path.parents:
                continue
            child = b / path.relative_to(b).parts[0]
            if not child.exists():
                child.mkdir()
                _bind_ro(str(staged / child.name), str(child))


def _host_root(cache_dir: str | None, expose: bool) -> None:
    """The weaker level: the host's file system stays (read-only to the uid), /tmp and /dev/shm are private;
    a checkout or venv under /tmp is bound back read-only, and with ``expose`` the Python installation is made
    traversable for the uid."""
    jail.mount(None, "/", None, jail.MS_REC | jail.MS_PRIVATE)
    cache_fd = os.open(cache_dir, os.O_PATH | os.O_DIRECTORY) if cache_dir and os.path.isdir(cache_dir) else None
    needed = {Path(p) for p in jail.python_roots()} | {PACKAGE_DIR.parent}
    tops = {Path(root) / p.relative_to(root).parts[0] for p in needed for root in ("/tmp", "/dev/shm")
            if Path(root) in p.parents}
    held = {d: os.open(d, os.O_PATH | os.O_DIRECTORY) for d in tops}
    for target, size in (("/tmp", "2g"), ("/dev/shm", "1g")):
        if os.path.isdir(target):
            jail.mount("kx-tmp", target, "tmpfs", jail.MS_NOSUID | jail.MS_NODEV | jail.MS_NOEXEC, f"size={size},mode=1777")
    for d, fd in held.items():
        d.mkdir(parents=True, exist_ok=True)
        _bind_ro(f"/proc/self/fd/{fd}", str(d))
        os.close(fd)
    if cache_fd is not None:
        Path(SANDBOX_CACHE).mkdir(parents=True)
        _bind_ro(f"/proc/self/fd/{cache_fd}", SANDBOX_CACHE)
        os.close(cache_fd)
    if expose:
        _expose_readonly(sorted(needed))


def prepare_sandbox(args: argparse.Namespace) -> None:
    """Inside fresh namespaces as root: the minimal root (or the host's with private /tmp), then drop to the
    slot's uid; the environment is the allow-listed one the parent passed, plus HOME, TMPDIR and caches here."""
    if args.private_tmp:
        if os.environ.pop(ROOT_ENV, "minimal") == "host":
            _host_root(args.cache_dir, expose=args.uid is not None)
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
