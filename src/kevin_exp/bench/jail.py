"""A minimal read-only root for untrusted code (candidate workers and their compilers), and the
environment allow-list they get.

Inside fresh mount and PID namespaces, as root, ``enter_root(spec)`` builds a new root on a small tmpfs:
the host paths the spec names are bound read-only at their own paths (symlinks along them recreated, so
``/lib -> usr/lib`` or a venv's ``bin/python -> /root/.pyenv/...`` still resolve), the writable ones
read-write, a minimal ``/dev`` (null, zero, full, random, urandom and the spec's extra nodes, e.g.
``/dev/nvidia*``), a fresh ``/proc``, private tmpfs ``/tmp`` and ``/dev/shm`` (``noexec`` for workers); then ``pivot_root`` into it and
the old root is detached. Nothing else of the host is reachable: no ``/home``, ``/root``, ``/work``,
``/var``, ``/run``, no ``/etc`` beyond what the loader needs. The new root's own tmpfs is remounted read-only.

Run as a script (``python -I -S jail.py SPEC_JSON -- ARGV...``) it is the compiler's launcher: new mount,
PID, network, IPC and UTS namespaces, the root above, an unprivileged uid, resource limits and a lower CPU
priority, then ``exec`` of ARGV with the launcher's environment. Only the standard library is used here, so
the launcher starts in a few tens of milliseconds without importing the package.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import stat
import sys
import warnings  # noqa: F401 - os.execvpe imports it, and after the pivot the standard library may be out of sight

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41}

BASE_DEVICES = ("null", "zero", "full", "random", "urandom")
# The loader's cache (libraries in multiarch dirs are found through it), Debian's alternatives (c++, cc, ld ...)
BASE_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
BASE_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Variables passed from the evaluator to sandboxed processes; everything else (tokens, keys, the trainer's
# settings) stays outside.
ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CC", "CXX", "CUDAHOSTCXX", "KEVIN_EXP_CACHE"})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NVCC_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_")


def allowed_env(source: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of ``source`` (default ``os.environ``)."""
    source = dict(os.environ) if source is None else source
    return {k: v for k, v in source.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


class JailError(OSError):
    """A mount or namespace step of the sandbox failed."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]


def _fail(what: str) -> JailError:
    err = ctypes.get_errno()
    return JailError(err, f"sandbox: {what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        raise _fail(f"mount {source} on {target} ({fstype or 'bind'})")


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise _fail("unshare")


def _locked_flags(path: str) -> int:
    """nosuid/nodev/noexec of the mount holding ``path``: a read-only remount must keep them."""
    f = os.statvfs(path).f_flag
    return (MS_NOSUID if f & os.ST_NOSUID else 0) | (MS_NODEV if f & os.ST_NODEV else 0) | \
        (MS_NOEXEC if f & os.ST_NOEXEC else 0)


def _resolve(path: str, links: dict[str, str], limit: int = 40) -> str | None:
    """The real path of ``path`` on the host, recording each symlink met on the way (link -> target)."""
    parts = [p for p in path.split("/") if p]
    cur = "/"
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        try:
            st = os.lstat(nxt)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            limit -= 1
            if limit < 0:
                return None
            target = os.readlink(nxt)
            links[nxt] = target
            parts = [p for p in target.split("/") if p] + parts
            cur = "/" if target.startswith("/") else cur
            continue
        cur = nxt
    return cur


class _Bind:
    def __init__(self, source: str, target: str, writable: bool) -> None:
        self.source, self.target, self.writable = source, target, writable
        self.is_dir = os.path.isdir(source)
        # held open: a mount made below (the new root's tmpfs) may cover the source's path
        self.fd = os.open(source, os.O_PATH | os.O_CLOEXEC)


def _plan(spec: dict) -> tuple[list[_Bind], dict[str, str]]:
    links: dict[str, str] = {}
    binds: dict[str, _Bind] = {}
    for key, writable in (("readonly", False), ("writable", True)):
        for path in spec.get(key, ()):
            real = _resolve(os.path.abspath(path), links)
            if real is None or real == "/":
                continue
            if real in binds:
                binds[real].writable |= writable
                continue
            binds[real] = _Bind(real, real, writable)
    for source, target in spec.get("binds", ()):
        real = _resolve(os.path.abspath(source), links)
        if real is not None:
            binds[target] = _Bind(real, target, False)
    ordered = sorted(binds.values(), key=lambda b: (b.target.count("/"), b.target))
    kept: list[_Bind] = []
    for b in ordered:
        # a read-only path inside another read-only path is there already
        if not b.writable and b.source == b.target and any(
                not k.writable and k.source == k.target and b.target.startswith(k.target + "/") for k in kept):
            os.close(b.fd)
            continue
        kept.append(b)
    return kept, links


def _make_target(path: str, is_dir: bool) -> None:
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if is_dir:
        os.mkdir(path, 0o755)
    else:
        with open(path, "w"):
            pass


def _bind(b: _Bind, root: str) -> None:
    target = root + b.target
    _make_target(target, b.is_dir)
    # Recursive: a GPU container's driver libraries (libcuda.so.1 ...) are mounts of their own inside /usr/lib.
    mount(f"/proc/self/fd/{b.fd}", target, None, MS_BIND | MS_REC)
    os.close(b.fd)
    if not b.writable:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | _locked_flags(target))
        _readonly_below(target)


_MOUNT_SETATTR_NR = {"x86_64": 442, "aarch64": 442}
_AT_RECURSIVE, _MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 0x8000, 0x1, 0x2


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _readonly_below(target: str) -> None:
    """Mounts under a read-only bind (the remount above covers only its top) become read-only too; on a kernel
    without mount_setattr (before 5.12) they keep the flags the host gave them."""
    nr = _MOUNT_SETATTR_NR.get(platform.machine())
    if nr is None:
        return
    attr = _MountAttr(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, 0, 0)
    _libc.syscall.restype = ctypes.c_long
    _libc.syscall(ctypes.c_long(nr), ctypes.c_int(-100), _b(target), ctypes.c_uint(_AT_RECURSIVE),
                  ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))


def _link(root: str, link: str, target: str) -> None:
    path = root + link
    if os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.symlink(target, path)


def enter_root(spec: dict) -> None:
    """Build the minimal root described by ``spec`` and pivot into it (in fresh mount and PID namespaces, as root).

    ``spec``: ``readonly`` / ``writable`` (host paths, shown at the same path), ``binds`` ([host path, path
    inside], read-only), ``devices`` (extra /dev entries, e.g. ``nvidia0``), ``sys`` (/sys paths, read-only),
    ``tmp_size`` / ``shm_size`` (tmpfs sizes), ``noexec_writable`` (``/tmp`` and ``/dev/shm`` mounted noexec).
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    readonly = list(spec.get("readonly", ())) + [p for p in (*BASE_SYSTEM, *BASE_ETC) if os.path.lexists(p)]
    readonly += [p for p in spec.get("sys", ()) if os.path.exists(p)]
    binds, links = _plan({**spec, "readonly": readonly})
    devices = [d for d in (*BASE_DEVICES, *spec.get("devices", ())) if os.path.exists(f"/dev/{d}")]
    dev_fds = {d: os.open(f"/dev/{d}", os.O_PATH | os.O_CLOEXEC) for d in devices}
    root = "/tmp"  # any directory: every source is held open above, so what the tmpfs covers does not matter
    mount("kx-root", root, "tmpfs", MS_NOSUID, "mode=755,size=16m")
    for name in ("proc", "dev", "tmp", "sys"):
        os.mkdir(f"{root}/{name}", 0o755)
    # ``noexec_writable`` (workers): nothing the sandboxed process writes can be mapped executable (the seccomp
    # filter allows executable mappings of files only, for dlopen)
    scratch = MS_NOSUID | MS_NODEV | (MS_NOEXEC if spec.get("noexec_writable") else 0)
    mount("kx-tmp", f"{root}/tmp", "tmpfs", scratch, f"mode=1777,size={spec.get('tmp_size', '2g')}")
    for link, target in links.items():
        _link(root, link, target)
    # /dev before the binds: a bind target below /tmp (the build cache) needs the private /tmp mounted first
    mount("kx-dev", f"{root}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name, fd in dev_fds.items():
        target = f"{root}/dev/{name}"
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target, 0o755)
        else:
            open(target, "w").close()
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)
    os.mkdir(f"{root}/dev/shm", 0o1777)
    mount("kx-shm", f"{root}/dev/shm", "tmpfs", scratch, f"mode=1777,size={spec.get('shm_size', '1g')}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    for b in binds:
        _bind(b, root)
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    old = f"{root}/.old-root"
    os.mkdir(old, 0o700)
    nr = _PIVOT_ROOT_NR.get(platform.machine())
    if nr is None:
        raise JailError(0, f"sandbox: pivot_root is not known on {platform.machine()}")
    _libc.syscall.restype = ctypes.c_long
    if _libc.syscall(ctypes.c_long(nr), _b(root), _b(old)) != 0:
        raise _fail("pivot_root")
    os.chdir("/")
    if _libc.umount2(b"/.old-root", MNT_DETACH) != 0:
        raise _fail("umount the old root")
    os.rmdir("/.old-root")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def python_roots() -> list[str]:
    """The Python installation: the interpreter's prefixes (a venv and its base) and site-packages folders
    outside them (a system Python's dist-packages). Not the project's own source folders on ``sys.path``."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots = set(prefixes)
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and os.path.isdir(real) and ("site-packages" in real or "dist-packages" in real):
            roots.add(real)
    return sorted(roots)


def library_path_roots() -> list[str]:
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and os.path.isdir(d)]


def cuda_devices() -> list[str]:
    """The GPU device nodes of the host (``nvidia0``, ``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps`` ...)."""
    try:
        return sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError:
        return []


def drop_to(uid: int, nproc: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


# --------------------------------------------------------------------------- the compiler's launcher

def _launch(spec: dict, argv: list[str]) -> int:
    limit = int(spec["address_space_gb"] * (1 << 30)) if spec.get("address_space_gb") else resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.get("nice"):
        os.nice(spec["nice"])
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
    pid = os.fork()
    if pid == 0:  # PID 1 of the new namespace: when it exits, everything it started is killed
        try:
            enter_root(spec)
            if spec.get("uid") is not None:
                drop_to(spec["uid"], spec.get("nproc", 0))
            os.chdir(spec["cwd"])
            os.execvpe(argv[0], argv, os.environ)
        except BaseException as exc:  # noqa: BLE001 - the caller reads the message from the output
            os.write(2, f"sandbox: cannot run {argv[0]}: {exc}\n".encode())
            os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: jail.py SPEC_JSON -- ARGV...\n")
        return 2
    return _launch(json.loads(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
