"""The candidate's runner process: one process runs exactly one candidate, then is discarded.

Started by ``kevin_exp.bench.worker_process`` ahead of time (a warm standby: sandbox set up, torch imported,
thread pools started, CUDA context up, then the no-new-tasks filter installed), it reads requests as JSON
lines on stdin and writes replies as JSON lines to ``--reply-fd``; tensors travel through the shared region
``--exchange-fd`` (``kevin_exp.bench.exchange``). It never sees the reference program, the inputs' seed or
the expected outputs, and it judges nothing: whatever it reports is checked by trusted processes.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys

from kevin_exp.bench.worker.sandbox_setup import prepare_sandbox


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kevin_exp.bench.worker")
    parser.add_argument("--reply-fd", "--result-fd", dest="reply_fd", type=int, required=True)
    parser.add_argument("--exchange-fd", type=int, default=-1)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--address-space-gb", type=float, default=0.0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--forbid-new-tasks", action="store_true")
    parser.add_argument("--fd-socket", type=int, default=-1, help="a Unix socket the device region's descriptor comes on (cuda)")
    parser.add_argument("--device-gate-fd", type=int, default=-1, help="held shared while CUDA starts (bench/device_gate.py)")
    parser.add_argument("--probe", action="store_true", help="set up the sandbox, import torch (and start CUDA on that backend), exit")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a fatal signal leaves a Python traceback in the output the model sees

    replies = os.fdopen(args.reply_fd, "w")
    try:
        prepare_sandbox(args)
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        replies.write(json.dumps({"op": "worker_error", "reason": f"sandbox setup failed: {exc}"}) + "\n")
        replies.close()
        raise SystemExit(3)

    # Warm up before the candidate arrives: this is what the standby pays for ahead of time.
    import torch
    import torch.utils.cpp_extension  # noqa: F401  (the candidate's load_inline call imports it: ~0.2-0.3 s)

    from kevin_exp.bench.device_gate import starting_on_the_device
    from kevin_exp.bench.runtime_guard import block_torch_compute
    from kevin_exp.bench.worker.runner import serve, warm_harness

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.ones(1 << 16).sum()  # a parallel op starts the intra-op thread pool before new threads are forbidden
    # Everything this start-up does on the device (CUDA's start, warm-up kernels, the guard's first op, the harness's
    # buffers and page-locked exchange) happens under the device gate: never while a candidate is timed there.
    with starting_on_the_device(args.device_gate_fd):
        if args.backend == "cuda":
            _start_cuda()
        # The guard's first entry, and an op under it, happen here rather than in the candidate's first forward.
        with block_torch_compute():
            torch.empty(1, device="cuda" if args.backend == "cuda" else "cpu")
        harness = None if args.probe else warm_harness(args.exchange_fd, args.backend, args.fd_socket)
    if args.probe:
        import getpass

        replies.write(json.dumps({"probe": "ok", "uid": os.getuid(), "user": getpass.getuser()}))
        replies.close()
        os._exit(0)
    if args.forbid_new_tasks:
        from kevin_exp.bench.seccomp import forbid_new_tasks

        forbid_new_tasks()
    replies.write(json.dumps({"op": "ready"}) + "\n")
    replies.flush()
    try:
        serve(sys.stdin.buffer, replies, harness)
    except BaseException:  # noqa: BLE001 - shown as the output; no interpreter teardown, which restores signal
        import traceback  # handlers: the filter refuses that (a misleading SIGSYS)

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a candidate's extension may crash in its destructors.
    os._exit(0)


def _start_cuda() -> None:
    """CUDA up, and what a run does on the GPU done once, so that whatever the driver starts lazily starts before
    new tasks are forbidden: a kernel, copies both ways, events and a device-wide sync. Also the harness's own
    kernels (drawing inputs, their fingerprint, sampled outputs): CUDA loads each kernel on its first use, which
    would otherwise fall on the run's first calls. Called under the device gate."""
    import torch

    from kevin_exp.bench.device_exchange import driver
    from kevin_exp.bench.sampling import fingerprint, sampled
    from kevin_exp.bench.worker.timing import CacheFlusher, Timer

    torch.cuda.init()
    driver()
    x = torch.ones(1 << 16).to("cuda")
    CacheFlusher(torch.device("cuda")).flush()
    Timer(torch.device("cuda"))(lambda: x.add(1))
    x.cpu()
    drawn = [torch.randn(1 << 16, device="cuda"), torch.rand(1 << 16, device="cuda"),
             torch.randint(0, 1 << 10, (1 << 16,), device="cuda"), torch.zeros(1 << 16, device="cuda")]
    fingerprint(drawn)
    [v.cpu() for v in sampled(drawn, 1)]
