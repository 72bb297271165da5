"""What the runner requires of a finished call before it copies the output to the region (inside the parent's
clock): the output of exactly the expected kind, dense and contiguous, in memory of its own; the inputs still the
tensors that were staged. Each failure ends the run with a reason for the model."""
from __future__ import annotations

from typing import Any

import torch

from kevin_exp.bench.worker.outcomes import Rejected

Held = tuple[int, int, int, int, tuple[int, ...], tuple[int, ...], int, torch.dtype, str]


def tensor_leaves(values: Any) -> list[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        return [values]
    if type(values) in (list, tuple):
        return [t for v in values for t in tensor_leaves(v)]
    return []


def held_inputs(inputs: list[Any]) -> list[Held]:
    """Each input tensor as staged: where its data and its storage are, and its layout."""
    out = []
    for k, t in enumerate(tensor_leaves(inputs)):
        storage = t.untyped_storage()
        out.append((k, t.data_ptr(), storage.data_ptr(), storage.nbytes(), tuple(t.shape), tuple(t.stride()),
                    t.storage_offset(), t.dtype, t.device.type))
    return out


def inputs_kept(inputs: list[Any], held: list[Held]) -> None:
    """The call's inputs are still the tensors staged, over the same memory (``set_``, ``resize_`` or a swapped
    storage would let the check read other memory than the call wrote)."""
    if held_inputs(inputs) != held:
        raise Rejected("incorrect", "forward changed its input tensors' storage or shape (set_, resize_, as_strided_, "
                       "...); leave the inputs as they were given")


def not_aliased(out: Any, held: list[Held]) -> None:
    """No output tensor's bytes overlap an input's storage: a result written into an input and returned saves
    the output's allocation and makes the input check read the output."""
    for j, t in enumerate(tensor_leaves(out)):
        if not t.numel():
            continue
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        for k, _, storage, nbytes, *_, device in held:
            if nbytes and device == t.device.type and start < storage + nbytes and storage < end:
                raise Rejected("incorrect", f"output {j} shares memory with input {k}: write the result to a tensor "
                               "of its own (every call's inputs are checked unchanged after it)")


def final_output(out: Any, expected: dict[str, Any], device: torch.device, where: str = "output") -> None:
    """``out`` has the structure, types, shapes and dtypes of the expected output's header, every tensor plain,
    dense, contiguous (as made by the call: the runner copies bytes, it makes nothing dense) and on ``device``."""
    kind = expected.get("t")
    if kind in ("list", "tuple"):
        items = expected["items"]
        if type(out) not in (list, tuple) or len(out) != len(items):
            got = "one tensor" if isinstance(out, torch.Tensor) else type(out).__name__
            raise Rejected("incorrect", f"expected a sequence of {len(items)} outputs, got {got}")
        for k, (o, h) in enumerate(zip(out, items)):
            final_output(o, h, device, f"{where} {k}")
        return
    if kind != "tensor":
        return  # a plain value: compared by the reference process
    if type(out) is not torch.Tensor:
        raise Rejected("incorrect", f"{where} must be a plain torch.Tensor, got {type(out).__module__}.{type(out).__name__}")
    if out.layout != torch.strided or out.is_meta:
        raise Rejected("incorrect", f"{where} must be a dense tensor, got layout {out.layout}")
    if out.device.type != device.type:
        raise Rejected("incorrect", f"{where} must be on {device.type}, got a tensor on {out.device}")
    if out.is_neg() or out.is_conj():
        raise Rejected("incorrect", f"{where} is a lazy negated or conjugated view; return its values")
    if not out.is_contiguous():
        raise Rejected("incorrect", f"{where} must be contiguous")
    if list(out.shape) != list(expected["shape"]):
        raise Rejected("incorrect", f"{where} shape {tuple(out.shape)} != expected {tuple(expected['shape'])}")
    dtype = str(out.dtype).removeprefix("torch.")
    if dtype != expected["dtype"]:
        raise Rejected("incorrect", f"{where} dtype torch.{dtype} != expected torch.{expected['dtype']}")
