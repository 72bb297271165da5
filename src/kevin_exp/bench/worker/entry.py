"""The worker process: one process evaluates exactly one candidate, then exits.

Started by ``kevin_exp.bench.worker_process`` ahead of time (a warm standby: sandbox set up, torch imported,
CUDA context up), it reads one job from stdin (a random key, then JSON), writes one result as JSON, signed
with that key, to the file descriptor given by ``--result-fd`` and exits. Whatever the candidate does to
this process (segfault, exit, hang, corrupting the CUDA context), the parent sees it from outside and turns
it into a verdict.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys

from kevin_exp.bench.result_channel import read_key, sign_result
from kevin_exp.bench.worker.sandbox_setup import prepare_sandbox


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kevin_exp.bench.worker")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--address-space-gb", type=float, default=0.0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--probe", action="store_true", help="set up the sandbox, import torch (and start CUDA on that backend), exit")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a fatal signal leaves a Python traceback in the output the model sees

    result_pipe = os.fdopen(args.result_fd, "w")
    try:
        prepare_sandbox(args)
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        result_pipe.write(json.dumps({"worker_error": f"sandbox setup failed: {exc}"}))
        result_pipe.close()
        raise SystemExit(3)

    # Warm up before the job arrives: this is what the standby pays for ahead of time.
    import torch
    import torch.utils.cpp_extension  # noqa: F401  (the candidate's load_inline call imports it: ~0.2-0.3 s)

    # everything the job needs, imported before it arrives, as the uid
    from kevin_exp.bench.worker.evaluation import run_job

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    # The guard's first entry, and an op under it, happen here rather than in the candidate's first forward.
    from kevin_exp.bench.runtime_guard import block_torch_compute

    with block_torch_compute():
        torch.empty(1, device="cuda" if args.backend == "cuda" else "cpu")
    if args.probe:
        import getpass

        result_pipe.write(json.dumps({"probe": "ok", "uid": os.getuid(), "user": getpass.getuser()}))
        result_pipe.close()
        os._exit(0)

    key = read_key(sys.stdin.fileno())
    job = json.loads(sys.stdin.buffer.read())
    result = run_job(job)
    signed = sign_result(key, json.dumps(result).encode())
    key[:] = bytes(len(key))
    # Output first: the parent may end this process as soon as the result pipe closes.
    sys.stdout.flush()
    sys.stderr.flush()
    result_pipe.write(signed.decode())
    result_pipe.flush()
    result_pipe.close()
    # Skip interpreter teardown: a candidate's extension may crash in its destructors.
    os._exit(0)
