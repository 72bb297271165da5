"""Cores of their own for the run stage (``evaluator.run_cores``).

A run is a lockstep conversation between the slot's thread in the evaluator, the reference process and the
runner: some 130 calls, each several messages from one process to the next. With compilers on every core, a
run took about half as long again as on a quiet machine (H100 box: a median 0.98 s in a 128-candidate batch,
0.67-0.76 s alone), most likely because each hand-over waits for a core. So each run slot gets ``run_cores``
cores (whole physical cores where the machine shows its hyperthread siblings, taken from the highest-numbered)
on which the slot's thread and the runner run during a run, and the compilers run on the others. A timed call
ends on the host (after a device-wide synchronise), so nothing else runs on those cores during one: on cuda the
reference process, which checks a timed call while the runner makes the next, runs on the compile cores (on cpu
it stays on the slot's cores, where it is timed as the candidate is). Standby runners start on the compile
cores and join the slot's cores only when taken for a run, so their start-ups never take a run's cores.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

AUTO = -1
AUTO_CORES_PER_SLOT = 2
# auto reserves only where at least this many cores stay for compiles
AUTO_MIN_COMPILE_CORES = 6


@dataclass(frozen=True)
class CpuSplit:
    """Each run slot's cores and the compilers' (empty everywhere: no split)."""

    slots: tuple[frozenset[int], ...]
    compiles: frozenset[int]

    @property
    def active(self) -> bool:
        return bool(self.compiles)

    def slot(self, index: int) -> frozenset[int]:
        return self.slots[index] if self.active else frozenset()

    def describe(self) -> str:
        if not self.active:
            return "no cores reserved for the run stage"
        slots = "; ".join(f"slot {i}: {_ranges(c)}" for i, c in enumerate(self.slots))
        return f"run stage on cores of its own ({slots}); compiles on {_ranges(self.compiles)}"


NO_SPLIT = CpuSplit((), frozenset())


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def sibling_groups(cpus: list[int], sys_cpu: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cpus`` grouped by physical core (hyperthread siblings together), highest-numbered first; one group per
    CPU where the machine does not say."""
    groups: dict[tuple[int, ...], list[int]] = {}
    wanted = set(cpus)
    for cpu in cpus:
        try:
            text = (sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip()
            siblings = tuple(sorted(c for c in _parse_ranges(text) if c in wanted)) or (cpu,)
        except (OSError, ValueError):
            siblings = (cpu,)
        groups.setdefault(siblings, list(siblings))
    return sorted(groups.values(), key=lambda g: -max(g))


def plan(run_cores: int, n_slots: int, backend: str, evaluator_cpus: int = 0,
         cpus: list[int] | None = None, groups: list[list[int]] | None = None) -> CpuSplit:
    """The split for ``n_slots`` run slots. ``run_cores``: cores per slot, 0 for none, ``AUTO`` for
    ``AUTO_CORES_PER_SLOT`` on cuda where the evaluator has the process's cores to itself (``evaluator_cpus``
    0 or all of them) and at least ``AUTO_MIN_COMPILE_CORES`` stay for compiles, else none (on cpu the run
    slots' threads already take their share of the cores)."""
    cpus = allowed_cpus() if cpus is None else sorted(cpus)
    if run_cores == AUTO:
        own_machine = evaluator_cpus == 0 or evaluator_cpus >= len(cpus)
        want = AUTO_CORES_PER_SLOT if backend == "cuda" and own_machine else 0
        if len(cpus) - want * n_slots < AUTO_MIN_COMPILE_CORES:
            want = 0
    elif run_cores >= 0:
        want = run_cores
    else:
        raise ValueError(f"evaluator.run_cores={run_cores}: expected -1 (auto), 0 (none) or a number of cores")
    if want == 0 or not cpus:
        return NO_SPLIT
    if len(cpus) - want * n_slots < 1:
        raise ValueError(f"evaluator.run_cores={run_cores}: {n_slots} run slot(s) x {want} cores leave none of this "
                         f"process's {len(cpus)} cores for compiles; lower run_cores (0: none reserved)")
    pool = [list(g) for g in (groups if groups is not None else sibling_groups(cpus))]
    slots: list[frozenset[int]] = []
    for _ in range(n_slots):
        mine: list[int] = []
        while len(mine) < want:
            group = pool[0]
            take = group[: want - len(mine)]
            mine += take
            del group[: len(take)]
            if not group:
                pool.pop(0)
        slots.append(frozenset(mine))
    taken = frozenset().union(*slots)
    return CpuSplit(tuple(slots), frozenset(c for c in cpus if c not in taken))


def pin_thread(cpus: frozenset[int]) -> None:
    """The calling thread (and what it starts from now on: threads and processes inherit it) onto ``cpus``."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def pin_process_tree(pid: int, cpus: frozenset[int]) -> int:
    """Every thread of ``pid`` and of its descendants onto ``cpus``; how many threads were moved. A process or
    thread that has ended meanwhile is skipped."""
    if not cpus:
        return 0
    moved = 0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                moved += 1
            except (ProcessLookupError, PermissionError, OSError):
                pass
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except OSError:
                pass
    return moved


def _parse_ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    return out


def _ranges(cpus: frozenset[int]) -> str:
    ordered, spans = sorted(cpus), []
    for c in ordered:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
