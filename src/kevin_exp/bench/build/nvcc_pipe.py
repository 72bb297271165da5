"""nvcc with its host front end and its device chain running side by side.

nvcc runs its steps one after the other: preprocess + cudafe++ (host side), preprocess + cicc +
ptxas + fatbinary (device side), then the host compile. The two sides only share the module id,
which cudafe++ writes and cicc reads; we write it ourselves (a unique string) so both sides start
at once. The steps and their exact arguments come from ``nvcc --dryrun``; anything that does not
have the single-architecture shape seen with nvcc 12/13 returns None and the caller runs plain nvcc.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import threading
import time
from pathlib import Path

from . import proc

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def _tool(argv: list[str]) -> str:
    return os.path.basename(argv[0])


def _env_value(text: str) -> str:
    """nvcc quotes flag lists (``INCLUDES="-I<dir>"``) but prints paths as they are (``PATH=/my cuda/bin:...``):
    a value without quotes is taken literally, so the spaces of a path stay as they are."""
    value = text.strip()
    if not any(c in value for c in "\"'\\"):
        return value
    return " ".join(shlex.split(value))


def parse_dryrun(text: str, base_env: dict[str, str]) -> tuple[dict[str, str], list[list[str]]] | None:
    env = dict(base_env)
    cmds: list[list[str]] = []
    for raw in text.splitlines():
        if not raw.startswith("#$ "):
            continue
        line = raw[3:].strip()
        m = _ASSIGN.match(line)
        if m and not cmds:  # the environment block precedes the commands
            try:
                env[m.group(1)] = _env_value(m.group(2))
            except ValueError:
                return None
            continue
        try:
            cmds.append(shlex.split(_VAR.sub(lambda v: env.get(v.group(1), v.group(0)), line)))
        except ValueError:
            return None
    return env, cmds


def plan(cmds: list[list[str]]) -> tuple[list[list[str]], list[list[str]], list[str], str] | None:
    """(host front, device chain, final host compile, module-id file) or None for other shapes."""
    cmds = [c for c in cmds if _tool(c) != "rm"]
    tools = [_tool(c) for c in cmds]
    if len(cmds) != 7 or tools[1] != "cudafe++" or tools[3] != "cicc" or tools[4:6] != ["ptxas", "fatbinary"]:
        return None
    pp_host, cudafe, pp_dev, cicc, ptxas, fatbin, final = cmds
    if "-E" not in pp_host or "-E" not in pp_dev or "-c" not in final or "--gen_module_id_file" not in cudafe:
        return None
    if any(a.startswith("-D__CUDA_ARCH__=") for a in pp_host):
        return None
    try:
        id_file = cudafe[cudafe.index("--module_id_file_name") + 1]
        if cicc[cicc.index("--module_id_file_name") + 1] != id_file:
            return None
    except (ValueError, IndexError):
        return None
    cudafe = [a for a in cudafe if a != "--gen_module_id_file"]
    return [pp_host, cudafe], [pp_dev, cicc, ptxas, fatbin], final, id_file


def run(argv: list[str], cwd: Path, deadline: float, memory_limit_gb: float,
        group: proc.Group | None = None) -> proc.ProcResult | None:
    tmp = cwd / ".nvcc-tmp"
    tmp.mkdir(exist_ok=True)
    os.chmod(tmp, 0o777)  # sandboxed steps run under leased uids (bench/build/proc.py) and write their files here
    base_env = dict(os.environ, TMPDIR=str(tmp))
    dry = proc.run([*argv, "--dryrun"], cwd, deadline, memory_limit_gb, env=base_env, group=group)
    parsed = parse_dryrun(dry.output, base_env) if dry.ok else None
    steps = plan(parsed[1]) if parsed else None
    if parsed is None or steps is None:
        return None
    env, (host, device, final, id_file) = parsed[0], steps
    Path(id_file if os.path.isabs(id_file) else cwd / id_file).write_text(f"_kx{secrets.token_hex(8)}_cuda_cu_")
    t0 = time.monotonic()
    results: dict[str, proc.ProcResult] = {}
    first_failure: list[str] = []
    lock = threading.Lock()
    current: dict[str, proc.Job] = {}
    parts: dict[str, float] = {}

    def chain(name: str, commands: list[list[str]]) -> None:
        for c in commands:
            with lock:
                if first_failure:
                    return
                job = current[name] = proc.Job(c, cwd, deadline, memory_limit_gb, env=env, group=group)
            res = results[name] = job.wait()
            parts[f"{name} {'preprocess' if '-E' in c else _tool(c)}"] = round(res.seconds, 3)
            if not res.ok:
                with lock:
                    if not first_failure:
                        first_failure.append(name)
                        for other, j in current.items():
                            if other != name:
                                j.kill()
                return

    side = threading.Thread(target=chain, args=("device", device))
    side.start()
    chain("host", host)
    side.join()
    if first_failure:  # the first side to fail speaks; the other was stopped
        res = results[first_failure[0]]
    else:
        res = proc.run(final, cwd, deadline, memory_limit_gb, env=env, group=group)
        parts["host compile"] = round(res.seconds, 3)
    return proc.ProcResult(argv, res.returncode, res.output, time.monotonic() - t0, res.timed_out, parts)
