"""Seeded inputs' fingerprints and the sampled positions of timed calls' outputs (no processes)."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.bench.exchange import HeaderError
from kevin_exp.bench.sampling import SAMPLE_POSITIONS, fingerprint, positions, sampled


def test_a_fingerprint_is_exact_for_equal_inputs_and_sees_a_changed_element():
    x = torch.randn(300, 1000)
    same = x.clone()
    assert fingerprint([x, 3, 0.5]) == fingerprint([same, 3, 0.5])
    same.view(-1)[0] += 1e-6  # element 0 is always among the sampled ones
    assert fingerprint([x]) != fingerprint([same])
    assert fingerprint([x]) != fingerprint([x.reshape(1000, 300)])  # the shape is part of it
    assert fingerprint([x.to(torch.float16)])[0][:2] == ["float16", [300, 1000]]
    assert fingerprint([torch.empty(0), None]) == [["float32", [0], 0], None]


def test_a_fingerprint_does_not_depend_on_the_thread_count():
    x = torch.randn(1 << 22)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fingerprint([x])
        torch.set_num_threads(max(2, threads))
        assert fingerprint([x]) == one
    finally:
        torch.set_num_threads(threads)


def test_positions_cover_a_small_tensor_and_sample_a_large_one_the_same_way_everywhere():
    assert torch.equal(positions(100, seed=7, leaf=0), torch.arange(100))
    p = positions(10_000_000, seed=7, leaf=0)
    assert p.shape == (SAMPLE_POSITIONS,) and int(p.min()) >= 0 and int(p.max()) < 10_000_000
    assert torch.equal(p, positions(10_000_000, seed=7, leaf=0))
    assert not torch.equal(p, positions(10_000_000, seed=8, leaf=0))
    assert not torch.equal(p, positions(10_000_000, seed=7, leaf=1))


def test_sampled_values_are_the_outputs_at_those_positions():
    a, b = torch.randn(64, 1000), torch.randn(10)
    got = sampled((a, b, 2.0), seed=3)
    assert torch.equal(got[0], a.reshape(-1)[positions(a.numel(), 3, 0)])
    assert torch.equal(got[1], b) and got[2] == 2.0
    assert torch.equal(sampled(a.t(), 3)[0], a.t().reshape(-1)[positions(a.numel(), 3, 0)])  # any strides


def test_sampling_refuses_what_the_full_output_path_refuses():
    class Lazy(torch.Tensor):
        pass

    with pytest.raises(HeaderError, match="plain torch.Tensor"):
        sampled(torch.randn(4).as_subclass(Lazy), seed=1)
    with pytest.raises(HeaderError, match="dense"):
        sampled(torch.randn(4, 4).to_sparse(), seed=1)


def test_sampling_many_outputs_at_once_gives_what_sampling_each_gives_in_host_memory():
    from kevin_exp.bench.sampling import to_host

    # mixed dtypes and sizes, so one output's bytes end where the next one's dtype is not aligned
    outputs = [torch.randn(100, 100), (torch.randn(3).half(), torch.arange(10, dtype=torch.float64), 5),
               torch.randint(0, 9, (5000,)), [torch.ones(2, dtype=torch.bool)]]
    seeds = [1, 2, 3, 4]
    for output, seed, got in zip(outputs, seeds, to_host([sampled(o, s) for o, s in zip(outputs, seeds)])):
        want = sampled(output, seed)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert g.device.type == "cpu" and g.dtype == w.dtype and torch.equal(g, w.cpu())
            else:
                assert g == w


def test_many_fingerprints_resolved_together_equal_each_resolved_alone():
    from kevin_exp.bench.sampling import fingerprint_lazy, resolve_fingerprints

    calls = [[torch.randn(50, 7), 3], [torch.arange(10), torch.ones(3, dtype=torch.float16), None], [2.5]]
    assert resolve_fingerprints([fingerprint_lazy(c) for c in calls]) == [fingerprint(c) for c in calls]
    assert resolve_fingerprints([]) == []
