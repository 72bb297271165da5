"""Runtime defences: the ATen op block (Python side) and the timing-function identity check."""
from __future__ import annotations

import time

import pytest
import torch

from kevin_exp.bench.runtime_guard import (
    ALLOWED_ATEN_OPS,
    ForbiddenOpError,
    block_torch_compute,
    snapshot_timing_functions,
    verify_timing_functions,
)


@pytest.fixture()
def xw() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8, 3)


@pytest.mark.parametrize(
    ("name", "fn", "op"),
    [
        ("matmul operator", lambda x, w: x @ w, "mm"),
        ("torch.relu", lambda x, w: torch.relu(x), "relu"),
        ("tensor method sum", lambda x, w: x.sum(), "sum"),
        ("functional relu", lambda x, w: torch.nn.functional.relu(x), "relu"),
        ("nn.Linear module", lambda x, w: torch.nn.functional.linear(x, w.t()), None),
        ("python add", lambda x, w: x + 1, "add"),
        ("advanced indexing", lambda x, w: x[x > 0], None),
        ("torch.cat", lambda x, w: torch.cat([x, x]), "cat"),
    ],
)
def test_compute_ops_are_blocked(xw, name: str, fn, op: str | None) -> None:
    x, w = xw
    with pytest.raises(ForbiddenOpError) as info:
        with block_torch_compute() as guard:
            fn(x, w)
    assert guard.violations == [info.value.op]
    if op is not None:
        assert info.value.op == op
    assert isinstance(info.value, RuntimeError) and "kernel" in str(info.value)


def test_swallowed_exception_is_still_recorded(xw) -> None:
    x, w = xw
    with block_torch_compute() as guard:
        try:  # what a candidate's C++ try/catch would do
            x @ w
        except ForbiddenOpError:
            pass
        out = torch.empty(4, 3)
    assert guard.first_violation == "mm" and out.shape == (4, 3)


def test_allocation_copies_and_views_pass(xw) -> None:
    x, w = xw
    with block_torch_compute() as guard:
        out = torch.empty_like(x)
        out.fill_(1.5)
        out.copy_(x)
        z = torch.zeros(3, 4, dtype=torch.float64)
        z.zero_()
        v = x.view(32).contiguous().reshape(8, 4)
        t = x.t().contiguous()
        rows = x[1:3, ::2]
        first = x[0]
        scalar = x[0, 0].item()
        y = x.unsqueeze(0).squeeze(0).permute(1, 0).transpose(0, 1).flatten()
        e = x[:, :1].expand(4, 8)
        n = x.new_zeros(5)
        h = x.to(torch.float64).float()
        c = x.clone().detach()
        parts = x.split(2)
        a = torch.arange(4)
        full = torch.full((2, 2), 3.0)
        lit = torch.tensor([1.0, 2.0])
        assert x.size(0) == 4 and x.dim() == 2 and x.numel() == 32 and x.is_contiguous()
    assert guard.violations == []
    assert isinstance(scalar, float) and torch.equal(out, x) and v.shape == (8, 4) and t.shape == (8, 4)
    assert rows.shape == (2, 4) and first.shape == (8,) and y.numel() == 32 and e.shape == (4, 8)
    assert n.shape == (5,) and h.dtype == torch.float32 and c.shape == x.shape and len(parts) == 2
    assert a.tolist() == [0, 1, 2, 3] and full.sum().item() == 12.0 and lit.numel() == 2 and z.dtype == torch.float64


def test_guard_is_scoped(xw) -> None:
    x, w = xw
    with block_torch_compute() as guard:
        assert guard.intact()
    assert (x @ w).shape == (4, 3)  # no longer active
    assert "mm" not in ALLOWED_ATEN_OPS and "empty" in ALLOWED_ATEN_OPS


def test_removing_the_guard_is_recorded(xw) -> None:
    import torch.utils._python_dispatch as dispatch

    x, w = xw
    with block_torch_compute() as guard:
        dispatch._pop_mode()  # what a candidate with access to private torch APIs could do
        x @ w
    assert guard.violations == ["<dispatch guard removed or replaced>"]
    assert dispatch._get_current_dispatch_mode_stack() == []


def test_custom_allow_list(xw) -> None:
    x, w = xw
    with block_torch_compute(ALLOWED_ATEN_OPS | {"mm"}) as guard:
        out = x @ w
    assert guard.violations == [] and out.shape == (4, 3)


def test_snapshot_is_stable() -> None:
    snap = snapshot_timing_functions()
    assert verify_timing_functions(snap) == []
    assert verify_timing_functions(snapshot_timing_functions(extra=["math.sqrt"])) == []


def test_patched_perf_counter_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot_timing_functions()
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert verify_timing_functions(snap) == ["time.perf_counter"]
    monkeypatch.undo()
    assert verify_timing_functions(snap) == []


def test_patched_guard_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_exp.bench.runtime_guard import TorchComputeGuard

    snap = snapshot_timing_functions()
    monkeypatch.setattr(TorchComputeGuard, "__torch_dispatch__", lambda self, func, types, args=(), kwargs=None: None)
    assert verify_timing_functions(snap) == ["kevin_exp.bench.runtime_guard.TorchComputeGuard.__torch_dispatch__"]


def test_patched_cuda_sync_and_event_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot_timing_functions()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, other: 1e-3)
    monkeypatch.setattr(torch.Tensor, "__eq__", lambda self, other: True)
    changed = verify_timing_functions(snap)
    assert set(changed) == {"torch.cuda.synchronize", "torch.cuda.Event.elapsed_time", "torch.Tensor.__eq__"}
    monkeypatch.undo()
    assert verify_timing_functions(snap) == []


def test_the_guard_does_not_import_dynamo() -> None:
    """Every candidate runs in a fresh worker: importing torch._dynamo there (torch's default for a dispatch
    mode) would cost each evaluation 1-2 CPU-seconds that compete with the compiles."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from kevin_exp.bench.runtime_guard import ForbiddenOpError, block_torch_compute\n"
        "with block_torch_compute() as guard:\n"
        "    torch.empty(2)\n"
        "    try:\n"
        "        torch.ones(2) + 1\n"
        "    except ForbiddenOpError:\n"
        "        pass\n"
        "print(guard.violations, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['add']", "False"]
