"""The worker's sandbox, set up from inside before anything else runs: fresh namespaces (entered through
``unshare``) get a private /tmp and /dev/shm, the build cache read-only, the interpreter visible; then the
process drops to its leased uid and takes its resource limits."""
from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

SANDBOX_CACHE = "/tmp/.kx-cache"
"""Where the build cache appears, read-only, inside a namespace sandbox."""


def _mount(*args: str) -> None:
    rc = os.spawnvp(os.P_WAIT, "mount", ["mount", *args])
    if rc != 0:
        raise SystemExit(f"sandbox: mount {' '.join(args)} failed")


def _blocking_ancestor(path: Path) -> Path | None:
    """The highest ancestor of ``path`` that others may not traverse (e.g. /root, mode 700)."""
    for parent in reversed(path.parents):
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except OSError:
            return None
    return None


def _expose_readonly(paths: list[Path]) -> None:
    """Make ``paths`` readable by an unprivileged uid inside this mount namespace, read-only.

    A directory like /root (mode 700) that holds the interpreter is covered by an empty tmpfs, and
    only the needed children are bound back, read-only; everything else under it stays hidden.
    """
    stage = Path("/tmp/.kx-stage")
    covered: dict[Path, Path] = {}
    for path in paths:
        blocker = _blocking_ancestor(path)
        if blocker is None or blocker in covered:
            continue
        staged = stage / str(len(covered))
        staged.mkdir(parents=True)
        _mount("--bind", str(blocker), str(staged))
        _mount("-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", str(blocker))
        covered[blocker] = staged
    for path in paths:
        blocker = _blocking_ancestor(path)
        for b, staged in covered.items():
            if path == b or b not in path.parents:
                continue
            child = b / path.relative_to(b).parts[0]
            if child.exists():
                continue
            child.mkdir()
            _mount("--bind", str(staged / child.name), str(child))
            _mount("-o", "remount,bind,ro", str(child))


def _covered_by_private_tmp(paths: set[Path]) -> list[Path]:
    """The top-level folders under /tmp or /dev/shm that hold any of ``paths`` (e.g. /tmp/ci-clone)."""
    tops = set()
    for path in paths:
        for root in (Path("/tmp"), Path("/dev/shm")):
            if root in path.parents:
                tops.add(root / path.relative_to(root).parts[0])
    return sorted(tops)


def prepare_sandbox(args: argparse.Namespace) -> None:
    """Inside fresh namespaces as root: private /tmp and /dev/shm, the build cache read-only, the
    interpreter visible, then drop to the slot's uid."""
    if args.private_tmp:
        # Never let a mount made here propagate to the host (older unshare builds or a shared root
        # would otherwise cover the host's /tmp with this worker's empty tmpfs).
        _mount("--make-rprivate", "/")
        cache = Path(args.cache_dir) if args.cache_dir else None
        # Hold the cache open first: it may itself live under /tmp, which the private tmpfs covers.
        cache_fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY) if cache is not None and cache.is_dir() else None
        needed = {Path(sys.base_prefix), Path(sys.prefix), Path(__file__).resolve().parents[3]}
        needed |= {Path(p).resolve() for p in sys.path if p and os.path.isdir(p)}
        # A checkout or venv under /tmp (a CI clone, say) would vanish under the private tmpfs: hold it open
        # too and bind it back, read-only, at the same path.
        held = {d: os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in _covered_by_private_tmp(needed)}
        for target, size in (("/tmp", "2g"), ("/dev/shm", "1g")):
            if os.path.isdir(target):
                _mount("-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", target)
        for d, fd in held.items():
            os.set_inheritable(fd, True)  # mount(8) opens it through its own /proc/self/fd
            d.mkdir(parents=True, exist_ok=True)
            # --no-canonicalize: resolved to a path, /proc/self/fd/N would name the new, empty folder
            _mount("--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(d))
            _mount("-o", "remount,bind,ro", str(d))
            os.close(fd)
        if cache_fd is not None:
            os.set_inheritable(cache_fd, True)
            Path(SANDBOX_CACHE).mkdir(parents=True)
            rc = os.spawnvp(os.P_WAIT, "mount", ["mount", "--no-canonicalize", "--bind", f"/proc/self/fd/{cache_fd}",
                                                  SANDBOX_CACHE])
            if rc != 0:
                raise SystemExit("sandbox: binding the build cache failed")
            os.close(cache_fd)
            _mount("-o", "remount,bind,ro", SANDBOX_CACHE)
        if args.uid is not None:
            _expose_readonly(sorted(needed))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.uid is not None:
        os.chown(workdir, args.uid, args.uid)
        os.setgroups([])
        os.setgid(args.uid)
        os.setuid(args.uid)
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
