"""The device region (``bench/device_exchange.py``) between two real processes: what one writes through its mapping
the other reads in place, a fresh one is all zeros, and one closed by its maker stays readable to the other."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from kevin_exp.bench.device_exchange import DeviceRegion

pytestmark = pytest.mark.gpu

CHILD = """
import socket, sys, torch
from kevin_exp.bench.device_exchange import DeviceRegion
sock = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(sock, 16, 1)
region = DeviceRegion.import_fd(fds[0], int(sys.argv[2]), torch.device("cuda"))
seen = int(region.bytes.sum())
region.bytes[: 1 << 20].copy_(torch.arange(1 << 18, dtype=torch.float32, device="cuda").view(torch.uint8))
torch.cuda.synchronize()
print(seen, flush=True)
"""


def test_a_region_written_by_another_process_is_read_in_place_and_starts_zeroed():
    device = torch.device("cuda")
    region = DeviceRegion.create(3 << 20, device)
    assert region.nbytes >= 3 << 20 and int(region.bytes.sum()) == 0
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = region.export_fd()
    socket.send_fds(ours, [b"d"], [fd])
    child = subprocess.run([sys.executable, "-c", CHILD, str(theirs.fileno()), str(region.nbytes)],
                           pass_fds=(theirs.fileno(),), capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["0"]  # the child saw the zeroed allocation
    got = region.bytes[: 1 << 20].view(torch.float32)
    assert torch.equal(got, torch.arange(1 << 18, dtype=torch.float32, device=device))
    region.close()


def test_regions_made_one_after_another_never_show_an_earlier_ones_bytes():
    device = torch.device("cuda")
    first = DeviceRegion.create(8 << 20, device)
    first.bytes.fill_(0xAB)
    torch.cuda.synchronize()
    first.close()
    second = DeviceRegion.create(8 << 20, device)
    assert int(second.bytes.count_nonzero()) == 0
    second.close()
