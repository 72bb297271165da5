"""Tensors between the trusted reference process and the candidate's runner: headers are validated before a
byte is read, and values round-trip through a real memfd."""
from __future__ import annotations

import mmap
import os

import pytest
import torch

from kevin_exp.bench.exchange import (
    HeaderError,
    Layout,
    Region,
    describe,
    ensure_size,
    mismatch,
    new_exchange_fd,
    read_values,
    validate,
    write_values,
)


def tensor_header(dtype="float32", shape=(2, 3), offset=0, nbytes=None):
    nbytes = 24 if nbytes is None else nbytes
    return {"t": "tensor", "dtype": dtype, "shape": list(shape), "offset": offset, "nbytes": nbytes}


def test_values_round_trip_through_a_memfd_seen_by_a_second_mapping():
    fd = new_exchange_fd(64)
    try:
        values = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64), 4, torch.ones(2, dtype=torch.bfloat16)]
        layout = Layout.for_sizes(4096, 4096)
        ensure_size(fd, layout.size)
        header, end = write_values(values, Region(fd).mapped(layout.size), layout.inputs_at, layout.outputs_at)
        validate(header, layout.inputs_at, layout.outputs_at)
        other = mmap.mmap(fd, layout.size)  # as another process maps the same file
        back = read_values(header, other, torch.device("cpu"))
        assert isinstance(back, list) and back[2] == 4
        for a, b in zip(back, values):
            if isinstance(b, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b)
        assert end <= layout.outputs_at and header["items"][1]["offset"] % 64 == 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("header, words", [
    (tensor_header(dtype="object"), "not allowed"),
    (tensor_header(nbytes=25), "do not match"),
    (tensor_header(offset=4096 - 64, nbytes=24, shape=(2, 3)) | {"offset": 4096}, "outside"),
    (tensor_header(offset=3), "bad offset"),
    (tensor_header(shape=(-1, 3)), "bad shape"),
    (tensor_header() | {"extra": 1}, "malformed"),
    ({"t": "value", "value": "x" * 1001}, "number"),
    ({"t": "value", "value": {"a": 1}}, "number"),
    ({"t": "list", "items": [{"t": "list", "items": [{"t": "list", "items": [{"t": "list", "items": [
        {"t": "list", "items": [{"t": "list", "items": []}]}]}]}]}]}, "malformed"),
    ("not a dict", "malformed"),
])
def test_bad_headers_are_refused_before_reading(header, words):
    with pytest.raises(HeaderError, match=words):
        validate(header, 0, 4096)


def test_a_header_that_fits_but_describes_the_wrong_answer_says_how():
    expected = describe(torch.zeros(4, 4))
    assert mismatch(describe(torch.zeros(4, 4)), expected) is None
    assert "shape (4, 5) != expected (4, 4)" in mismatch(describe(torch.zeros(4, 5)), expected)
    assert "dtype torch.float64" in mismatch(describe(torch.zeros(4, 4, dtype=torch.float64)), expected)
    assert "plain torch.Tensor" in mismatch({"t": "value", "value": 1}, expected)
    assert "sequence of 2" in mismatch(describe(torch.zeros(1)), describe((torch.zeros(1), torch.zeros(1))))


def test_a_writer_cannot_spill_past_its_part_or_pass_a_tensor_subclass():
    fd = new_exchange_fd(4096)
    try:
        mm = Region(fd).mapped(4096)
        with pytest.raises(HeaderError, match="more than"):
            write_values(torch.zeros(100), mm, 0, 128)

        class Lazy(torch.Tensor):
            pass

        with pytest.raises(HeaderError, match="plain torch.Tensor"):
            write_values(torch.zeros(2).as_subclass(Lazy), mm, 0)
    finally:
        os.close(fd)


def test_the_shared_file_can_grow_but_not_shrink():
    fd = new_exchange_fd(4096)
    try:
        ensure_size(fd, 8192)
        assert os.fstat(fd).st_size == 8192
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)  # what a hostile runner holding the descriptor would try
    finally:
        os.close(fd)


def test_a_sealed_exchange_keeps_its_size_and_its_seals_whoever_asks():
    import fcntl

    from kevin_exp.bench.exchange import seal_size, sealed_size

    fd = new_exchange_fd(64)
    try:
        assert not sealed_size(fd)
        seal_size(fd, 4096)
        assert os.fstat(fd).st_size == 4096 and sealed_size(fd)
        for size in (1 << 30, 64):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        with pytest.raises(PermissionError):  # past its end: a write that would grow it
            os.pwrite(fd, b"marker", 4096)
        with pytest.raises(PermissionError):  # no seal can be added (or a write seal set on the reference)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        assert os.pwrite(fd, b"inside", 4090) == 6
    finally:
        os.close(fd)


def test_values_written_to_device_bytes_keep_the_regions_offsets_and_stay_inside_it():
    """``DeviceBytes`` (the outputs part of a run's region in device memory) read and written through the same
    headers as the host region; here its tensor is on the CPU, which takes the same code."""
    from kevin_exp.bench.exchange import DeviceBytes
    from kevin_exp.bench.sampling import positions, sampled_in_region

    layout = Layout.for_sizes(1000, 4096 * 8 + 64)
    part = DeviceBytes(torch.zeros(layout.size - layout.outputs_at, dtype=torch.uint8), layout.outputs_at)
    out = [torch.arange(4096 * 2, dtype=torch.float32), torch.tensor([7], dtype=torch.int64)]
    header, _ = write_values(out, part, layout.outputs_at, layout.after_at)
    assert header["items"][0]["offset"] == layout.outputs_at  # the region's offset, not the allocation's
    validate(header, layout.outputs_at, layout.after_at)
    back = read_values(header, part, "cpu")
    assert torch.equal(back[0], out[0]) and torch.equal(back[1], out[1])
    picked = sampled_in_region(header, part, seed=3)
    assert torch.equal(picked[0], out[0][positions(out[0].numel(), 3, 0)])
    assert torch.equal(part.tensor[: 4 * 4096 * 2].view(torch.float32), out[0])  # where the bytes went
    with pytest.raises(HeaderError, match="outside the device region"):
        read_values(tensor_header(offset=0), part, "cpu")  # the inputs part is not in device memory
    with pytest.raises(HeaderError):
        write_values(torch.zeros(layout.size), part, layout.outputs_at)
