"""What the runner requires of a finished call before it copies the output into the region (inside the parent's
clock), and how the reference process reads a call back from the region (no processes)."""
from __future__ import annotations

import mmap

import pytest
import torch

from kevin_exp.bench.exchange import describe, write_values
from kevin_exp.bench.sampling import input_seed, positions, sampled, sampled_in_region
from kevin_exp.bench.worker.comparison import same_bits
from kevin_exp.bench.worker.final_output import final_output, held_inputs, inputs_kept, not_aliased
from kevin_exp.bench.worker.outcomes import Rejected
from kevin_exp.bench.worker.runner import _dense

CPU = torch.device("cpu")


def test_an_output_of_the_expected_kind_passes_and_anything_else_ends_the_run():
    want = describe([torch.zeros(4, 8), torch.zeros(3, dtype=torch.int64)])
    final_output([torch.ones(4, 8), torch.ones(3, dtype=torch.int64)], want, CPU)
    for bad, words in [
        ([torch.ones(8, 4).t(), torch.ones(3, dtype=torch.int64)], "contiguous"),
        ([torch.ones(4, 8).as_subclass(type("Lazy", (torch.Tensor,), {})), torch.ones(3, dtype=torch.int64)],
         "plain torch.Tensor"),
        ([torch.ones(4, 8, dtype=torch.float64), torch.ones(3, dtype=torch.int64)], "dtype"),
        ([torch.ones(4, 9), torch.ones(3, dtype=torch.int64)], "shape"),
        ([torch.ones(4, 8).to_sparse(), torch.ones(3, dtype=torch.int64)], "dense"),
        ([torch.ones(4, 8)], "sequence of 2"),
        (torch.ones(4, 8), "sequence of 2"),
    ]:
        with pytest.raises(Rejected, match=words) as caught:
            final_output(bad, want, CPU)
        assert caught.value.status == "incorrect"


def test_a_strided_output_is_made_dense_by_the_call_itself():
    x = torch.randn(8, 4)
    out = _dense([x.t(), (x.expand(2, 8, 4),), 3])
    assert out[0].is_contiguous() and torch.equal(out[0], x.t())
    assert out[1][0].is_contiguous() and torch.equal(out[1][0], x.expand(2, 8, 4)) and out[2] == 3
    assert _dense(x) is x  # already dense: no copy


@pytest.mark.parametrize("alias", ["itself", "a_view", "a_slice", "from_memory"])
def test_an_output_over_an_inputs_memory_is_refused(alias):
    x = torch.randn(16, 16)
    held = held_inputs([x, 2])
    out = {"itself": lambda: x, "a_view": lambda: x.view(16, 16), "a_slice": lambda: x[8:].contiguous(),
           "from_memory": lambda: torch.frombuffer(x.numpy(), dtype=torch.float32).view(16, 16)}[alias]()
    with pytest.raises(Rejected, match="shares memory with input 0"):
        not_aliased([torch.zeros(1), out], held)
    not_aliased([torch.zeros(1), out.clone()], held)


def test_inputs_whose_storage_or_shape_changed_are_refused():
    for change in (lambda x: x.set_(torch.empty_like(x)), lambda x: x.resize_(300), lambda x: x.as_strided_((16,), (1,))):
        x = torch.randn(16, 16)
        held = held_inputs([x])
        inputs_kept([x], held)
        change(x)
        with pytest.raises(Rejected, match="storage or shape"):
            inputs_kept([x], held)


def test_bits_compare_nan_inputs_as_unchanged_and_see_a_sign_flip():
    x = torch.tensor([1.0, float("nan"), 0.0])
    assert same_bits([x, 3], [x.clone(), 3])
    assert not same_bits([x], [torch.tensor([1.0, float("nan"), -0.0])])
    assert not same_bits([x], [x.double()]) and not same_bits([x], [x[:2]])


def test_the_reference_reads_the_sampled_positions_in_place_from_a_whole_copy():
    mm = mmap.mmap(-1, 1 << 22)
    values = [torch.randn(300, 100), (torch.randn(5000).half(), 7), torch.randint(0, 9, (6000,))]
    header, _ = write_values(values, mm, 64)
    for seed in (3, input_seed(3)):
        got, want = sampled_in_region(header, mm, seed), sampled(values, seed)
        assert len(got) == len(want) == 4 and got[2] == 7
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert g.dtype == w.dtype and torch.equal(g, w)
    assert not torch.equal(positions(30000, 3, 0), positions(30000, input_seed(3), 0))


@pytest.mark.parametrize(("shape", "fill", "dtype"), [([3, 1000], float("nan"), torch.float32), ([5], -1234567, torch.int64),
                                                      ([7, 333], 1, torch.bool), ([4097], float("nan"), torch.float16),
                                                      ([0], 1, torch.uint8)])
def test_the_poison_is_filled_by_one_thread_as_torch_full_fills_it(shape, fill, dtype):
    from kevin_exp.bench.worker.memory_fill import filled

    got, want = filled(shape, fill, dtype, CPU), torch.full(shape, fill, dtype=dtype)
    assert got.shape == want.shape and same_bits(got, want)
