"""The reference process keeps the problems a slot's batch interleaves: a step's problems (8 in the paper's recipe)
are each built once, not once per run, and what they hold stays bounded."""
from __future__ import annotations

import pytest

from kevin_exp.bench import reference_server
from kevin_exp.bench.reference_server import Server

SOURCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return self.proj(x)

def get_inputs():
    return [torch.randn(4, {width})]

def get_init_inputs():
    return [{width}]
"""


def prepare(server: Server, width: int) -> reference_server.Problem:
    server.op_prepare({"source": SOURCE.replace("{width}", str(width)), "init_seed": 42})
    assert server.problem is not None
    return server.problem


def test_a_batch_of_eight_interleaved_problems_builds_each_once():
    server = Server(None, "cpu")
    first = {w: prepare(server, w) for w in range(8, 16)}
    for _ in range(2):  # the runs of a step come back to each problem
        for w, problem in first.items():
            assert prepare(server, w) is problem
    assert first[8].held_bytes == (8 * 8 + 8) * 4  # the Linear's weight and bias


def test_problems_beyond_the_byte_budget_are_dropped_oldest_first(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reference_server, "KEEP_PROBLEM_BYTES", 3 * (64 * 64 + 64) * 4)
    server = Server(None, "cpu")
    kept = [prepare(server, 64), prepare(server, 65), prepare(server, 66)]
    assert len(server.problems) == 2  # three 64-wide models are over the budget: the oldest went
    assert prepare(server, 66) is kept[2] and prepare(server, 65) is kept[1]
    assert prepare(server, 64) is not kept[0]


def test_one_problem_larger_than_the_budget_is_still_kept_while_it_runs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reference_server, "KEEP_PROBLEM_BYTES", 1)
    server = Server(None, "cpu")
    problem = prepare(server, 32)
    assert list(server.problems.values()) == [problem]
