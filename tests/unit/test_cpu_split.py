"""Which cores the run stage gets to itself (``evaluator.run_cores``) and which stay for compiles."""
from __future__ import annotations

import os

import pytest

from kevin_exp.bench import BenchConfig
from kevin_exp.bench.cpu_split import AUTO, pin_process_tree, plan, sibling_groups

SIXTEEN = list(range(16))
HYPERTHREADED = [[c, c + 8] for c in range(7, -1, -1)]  # cpu c and c + 8 share a core


def test_auto_on_cuda_reserves_one_whole_core_per_slot_from_the_top():
    split = plan(AUTO, 1, "cuda", cpus=SIXTEEN, groups=[list(g) for g in HYPERTHREADED])
    assert split.slots == (frozenset({7, 15}),)
    assert split.compiles == frozenset(SIXTEEN) - {7, 15}
    two = plan(AUTO, 2, "cuda", cpus=SIXTEEN, groups=[list(g) for g in HYPERTHREADED])
    assert two.slots == (frozenset({7, 15}), frozenset({6, 14})) and len(two.compiles) == 12


def test_auto_without_siblings_takes_the_highest_cores():
    split = plan(AUTO, 1, "cuda", cpus=SIXTEEN, groups=[[c] for c in reversed(SIXTEEN)])
    assert split.slots == (frozenset({14, 15}),) and split.compiles == frozenset(range(14))


@pytest.mark.parametrize("backend, cpus, evaluator_cpus, n_slots", [
    ("cpu", SIXTEEN, 0, 1),  # cpu slots take their share through their threads
    ("cuda", list(range(7)), 0, 1),  # fewer than 6 cores would stay for compiles
    ("cuda", SIXTEEN, 8, 1),  # the evaluator has a share of the process's cores, not all of them
])
def test_auto_reserves_nothing_where_it_cannot_own_the_cores(backend, cpus, evaluator_cpus, n_slots):
    split = plan(AUTO, n_slots, backend, evaluator_cpus, cpus=cpus)
    assert not split.active and split.slot(0) == frozenset()
    assert split.describe() == "no cores reserved for the run stage"


def test_explicit_cores_and_zero():
    assert plan(3, 1, "cpu", cpus=SIXTEEN, groups=[[c] for c in reversed(SIXTEEN)]).slots == (frozenset({13, 14, 15}),)
    assert not plan(0, 1, "cuda", cpus=SIXTEEN).active


def test_a_split_that_leaves_no_core_for_compiles_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"evaluator.run_cores=2: 2 run slot\(s\) x 2 cores leave none"):
        plan(2, 2, "cuda", cpus=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="run_cores=-3"):
        BenchConfig(run_cores=-3)


def test_sibling_groups_read_the_topology(tmp_path):
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    assert sibling_groups([0, 1, 2, 3], tmp_path) == [[1, 3], [0, 2]]
    assert sibling_groups([0, 1], tmp_path / "missing") == [[1], [0]]


def test_pin_process_tree_moves_every_thread_of_a_child_and_its_child():
    import subprocess
    import sys

    one = {min(os.sched_getaffinity(0))}
    code = ("import subprocess, sys, threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print('up', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        moved = pin_process_tree(child.pid, frozenset(one))
        assert moved >= 3  # the child's two threads and its own child's
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert all(os.sched_getaffinity(int(t)) == one for t in tids)
        grandchildren = open(f"/proc/{child.pid}/task/{child.pid}/children").read().split()
        assert grandchildren and all(os.sched_getaffinity(int(g)) == one for g in grandchildren)
    finally:
        subprocess.run(["pkill", "-P", str(child.pid)])
        child.kill()
        child.wait()


def test_builds_at_a_time_half_the_cores_on_cuda_one_per_core_on_cpu_within_memory():
    from kevin_exp.bench.evaluator import default_compile_workers

    assert default_compile_workers("cuda", 16, 128.0) == 8  # nvcc's two front ends run side by side
    assert default_compile_workers("cuda", 14, 128.0) == 7
    assert default_compile_workers("cpu", 2, 24.0) == 2
    assert default_compile_workers("cuda", 16, 7.0) == 2  # 3 GB a cuda build
    assert default_compile_workers("cpu", 16, 4.0) == 2  # 1.5 GB a cpu build
    assert default_compile_workers("cuda", 1, 0.5) == 1  # never none
