"""The trusted reference process (``python -m kevin_exp.bench.reference_server``): one per run slot, warm,
and it only ever runs reference programs. It never loads candidate code and never unpickles or imports
anything a candidate's process wrote: the runner's outputs arrive as raw bytes in the shared region, behind
headers checked here before a byte is read.

It loads a problem, builds ``Model`` with the construction seed, times the reference (the parent caches that
on disk), draws each trial's inputs from the evaluation's secret seed, computes the expected outputs in
chunks while the runner is idle, hands each trial's inputs to the runner through the region (each run's runner
has its own, handed over on ``--exchange-socket``), and checks the
runner's outputs and post-call inputs against its own. Requests are JSON lines on stdin, replies JSON lines
on ``--reply-fd``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
from collections import OrderedDict
from typing import Any

import torch

from kevin_exp.bench.config import Tolerance
from kevin_exp.bench.exchange import DeviceBytes, HeaderError, Layout, Region, describe, mismatch, read_values, validate, write_values
from kevin_exp.bench.physical_floor import count_flops, machine_figures
from kevin_exp.bench.sampling import fingerprint_lazy, input_seed, leaves, resolve_fingerprints, sampled, sampled_in_region, to_host
from kevin_exp.bench.worker.comparison import compare_outputs, same_bits, same_values
from kevin_exp.bench.worker.input_variants import Skipped, Variants
from kevin_exp.bench.worker.reference import load_reference, make_inputs
from kevin_exp.bench.worker.tensors import clone_values, device_name, synchronize
from kevin_exp.bench.worker.timing import CacheFlusher, Timer

# A slot's batch interleaves the problems of a step (8 in the paper's recipe): a problem rebuilt on every run costs
# its model, its hidden probes and its FLOP count each time. Kept by count, and by the bytes their models and
# construction inputs hold (on a GPU shared with the runs being timed).
KEEP_PROBLEMS = 32
KEEP_PROBLEM_BYTES = 4 << 30


def trial_seed(secret: int, index: int) -> int:
    """Trial ``index``'s input seed, derived from the evaluation's secret seed."""
    digest = hashlib.sha256(f"{secret}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class _Tolerances:
    """``compare_outputs`` reads ``config.tolerance_for``; the request carries the table."""

    def __init__(self, table: dict[str, dict[str, float]], atol_scale: float = 1.0) -> None:
        self.table = {k: Tolerance(v["atol"] * atol_scale, v["rtol"]) for k, v in table.items()}

    def tolerance_for(self, dtype_name: str) -> Tolerance:
        return self.table.get(dtype_name, self.table["float32"])


class Problem:
    def __init__(self, source: str, backend: str, init_seed: int, device: torch.device) -> None:
        self.ns = load_reference(source, backend)
        self.device = device
        torch.manual_seed(init_seed)
        self.init_inputs = self.ns["get_init_inputs"]()
        torch.manual_seed(init_seed)
        self.model = self.ns["Model"](*self.init_inputs).to(device).eval()
        sample = make_inputs(self.ns, 0, device)
        with torch.no_grad():
            out = self.model(*clone_values(sample))
        synchronize(device)
        self.input_header, self.output_header = describe(list(sample)), describe(out)
        self.variants = Variants(self.ns, self.model, device, sample, out)
        self.flops: float | None | bool = False  # counted when first asked (False: not yet)
        # the runner may draw the inputs itself from each call's seed only if the same seed gives the same inputs
        self.seeded = same_values(list(self.inputs(init_seed + 1)), list(self.inputs(init_seed + 1)))
        self.held_bytes = _tensor_bytes([*self.model.parameters(), *self.model.buffers(), *leaves(self.init_inputs)])

    def inputs(self, seed: int) -> list[Any]:
        return make_inputs(self.ns, seed, self.device)


def _tensor_bytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class _Sampled:
    """What a sampled call is checked against: the expected output's header and its values at the call's
    sampled positions, and the inputs' header and their values at the inputs' own sampled positions (host
    memory): the runner's whole output and post-call inputs are read there in the region."""

    def __init__(self, header: dict[str, Any], seed: int, inputs_header: dict[str, Any]) -> None:
        self.header, self.seed, self.inputs_header = header, seed, inputs_header
        self.want: list[Any] = []
        self.inputs_want: list[Any] = []


class Server:
    def __init__(self, exchange_socket: socket.socket | None, backend: str) -> None:
        self.exchange_socket = exchange_socket
        self.region = Region(-1, pin=backend == "cuda")  # the current run's runner's, once attached
        self.backend = backend
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.problems: OrderedDict[str, Problem] = OrderedDict()
        self.problem: Problem | None = None
        self.trials: dict[int, tuple[list[Any], Any]] = {}
        self.atol_scale: dict[int, float] = {}  # hidden calls on redrawn values: their absolute tolerance's factor
        self.secret: int | None = None
        self.machine: dict[str, Any] | None = None  # memory bandwidth and cache, measured once (physical_floor)
        self.device_region: Any = None  # the current run's outputs part in device memory (cuda), when it has one
        self.device_bytes: DeviceBytes | None = None
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        return getattr(self, f"op_{op}")(request)

    def op_prepare(self, r: dict[str, Any]) -> dict[str, Any]:
        key = hashlib.sha256(f"{r['init_seed']}\0{r['source']}".encode()).hexdigest()
        problem = self.problems.pop(key, None)
        if problem is None:
            problem = Problem(r["source"], self.backend, int(r["init_seed"]), self.device)
        self.problems[key] = problem
        while len(self.problems) > 1 and (len(self.problems) > KEEP_PROBLEMS
                                          or sum(p.held_bytes for p in self.problems.values()) > KEEP_PROBLEM_BYTES):
            self.problems.popitem(last=False)
        self.problem, self.trials, self.secret = problem, {}, None
        reply = {"op": "prepared", "input": problem.input_header, "output": problem.output_header,
                 "init": describe(list(problem.init_inputs)), "device": device_name(self.device),
                 "torch": torch.__version__, "seeded": problem.seeded}
        if r.get("hidden"):
            reply["hidden"] = self._hidden_offer(problem, [str(x) for x in r["hidden"]], int(r["init_seed"]))
        if r.get("floor"):
            reply["floor"] = self._floor_figures(problem)
        return reply

    def _hidden_offer(self, problem: Problem, names: list[str], seed: int) -> dict[str, Any]:
        """Which hidden checks apply to the problem (probed once on the reference), why the others are skipped, and
        the largest inputs and output a hidden size takes (the region is sized for them)."""
        skipped = {n: why for n in names if (why := problem.variants.probe(n, seed + 2)) is not None}
        largest = problem.variants.largest_bytes if "hidden_shape" in names and "hidden_shape" not in skipped else {}
        return {"checks": [n for n in names if n not in skipped], "skipped": skipped,
                "input_bytes": largest.get("input", 0), "output_bytes": largest.get("output", 0)}

    def _floor_figures(self, problem: Problem) -> dict[str, Any]:
        """What the physical floor needs from this process (``physical_floor``): the machine's memory bandwidth and
        cache, and the problem's FLOPs where the reference's ops are counted."""
        if self.machine is None:
            self.machine = machine_figures(self.device)
        if problem.flops is False:
            problem.flops = count_flops(problem.model, problem.inputs(0))
        return {**self.machine, "flops": problem.flops}

    def op_exchange(self, r: dict[str, Any]) -> dict[str, Any]:
        """The shared region of the runner the next run is with, its descriptor sent on the exchange socket; the
        region before it is unmapped and closed (it belonged to a runner that is gone)."""
        assert self.exchange_socket is not None
        _, fds, _, _ = socket.recv_fds(self.exchange_socket, 16, 1)
        if len(fds) != 1:
            raise RuntimeError("no shared region came with the request")
        self.region.close()
        self._drop_device_region()
        self.region = Region(fds[0], pin=self.backend == "cuda")
        return {"op": "attached"}

    def op_device_region(self, r: dict[str, Any]) -> dict[str, Any]:
        """The run's outputs part in device memory (``device_exchange``): a fresh, zeroed allocation of at least
        ``bytes``, standing for the region from ``base`` on; its descriptor is sent on the exchange socket for the
        runner. Where the driver refuses, the reply says why and the run keeps the host region."""
        from kevin_exp.bench.device_exchange import DeviceExchangeError, DeviceRegion

        assert self.exchange_socket is not None
        self._drop_device_region()
        try:
            region = DeviceRegion.create(int(r["bytes"]), self.device)
            fd = region.export_fd()
        except DeviceExchangeError as exc:
            return {"op": "device_region", "error": str(exc)}
        try:
            socket.send_fds(self.exchange_socket, [b"d"], [fd])
        finally:
            os.close(fd)
        self.device_region, self.device_bytes = region, DeviceBytes(region.bytes, int(r["base"]))
        # the host region then carries only inputs: staged for every call where the runner cannot draw them from a
        # seed (page-locked then), else only the few hidden checks' (page-locking a 1 GiB mapping costs ~0.5 s a run)
        if self.problem is not None and self.problem.seeded and self.region.mm is None:
            self.region.pin = False
        return {"op": "device_region", "bytes": region.nbytes}

    def _drop_device_region(self) -> None:
        if self.device_region is not None:
            self.device_bytes = None
            synchronize(self.device)
            self.device_region.close()
            self.device_region = None

    def op_stage_init(self, r: dict[str, Any]) -> dict[str, Any]:
        layout = Layout.from_json(r["layout"])
        header, _ = write_values(list(self.problem.init_inputs), self.region.mapped(layout.size), layout.inputs_at,
                                 layout.outputs_at)
        return {"op": "staged", "inputs": header}

    def op_time(self, r: dict[str, Any]) -> dict[str, Any]:
        """The reference timed like the candidate: fresh inputs each call, a cache flush, events, device sync."""
        problem = self.problem
        flusher, timer = CacheFlusher(self.device), Timer(self.device)
        samples = []
        with torch.no_grad():
            for k in range(int(r["warmup"]) + int(r["trials"])):
                inputs = problem.inputs(trial_seed(int(r["seed"]), k))
                synchronize(self.device)
                flusher.flush()
                ms, _ = timer(lambda x=inputs: problem.model(*x))
                if k >= int(r["warmup"]):
                    samples.append(ms)
        return {"op": "timed", "ms": samples}

    def op_chunk(self, r: dict[str, Any]) -> dict[str, Any]:
        """Inputs and expected outputs of trials [start, start + count), drawn from the secret seed. With
        ``seeded``, also each trial's seed and input fingerprint for the runner, so no call needs its own request.
        Trials in ``samples`` (trial -> sample seed) are checked only at sampled positions: for them only the
        expected values there, and the inputs' values at positions of their own, are kept (taken as each output is
        made, then brought to host memory together), so their check needs no device work and a chunk of them
        holds no whole outputs. With ``same_inputs`` (the calibration's calls, made before any candidate code) every
        call takes the first call's inputs: drawn and computed once, checked at positions of each call's own."""
        self.secret = int(r["secret"])
        self.trials, self.atol_scale = {}, {}
        samples = {int(k): int(v) for k, v in (r.get("samples") or {}).items()}
        variants = {int(k): str(v) for k, v in (r.get("variants") or {}).items()}
        staged: dict[str, Any] = {}
        to_sample: dict[int, Any] = {}
        inputs_to_sample: dict[int, Any] = {}
        hidden: dict[str, Any] = {}
        start, same = int(r["start"]), bool(r.get("same_inputs"))
        first: tuple[list[Any], Any, list[Any] | None] | None = None
        with torch.no_grad():
            for i in range(start, start + int(r["count"])):
                if i in variants:  # a hidden check: staged through the region, never from a seed
                    inputs, expected, hidden[str(i)] = self._hidden_call(variants[i], trial_seed(self.secret, i))
                    self.atol_scale[i] = float(hidden[str(i)].get("atol_scale", 1.0))
                    self.trials[i] = (inputs, expected)
                    del inputs, expected
                    continue
                seed = trial_seed(self.secret, start if same else i)
                if first is None or not same:
                    inputs = self.problem.inputs(seed)
                    expected = self.problem.model(*clone_values(inputs))
                    first = (inputs, expected, fingerprint_lazy(list(inputs)) if r.get("seeded") else None)
                inputs, expected, drawn = first
                if r.get("seeded"):  # the runner draws each call's inputs from its seed; the fingerprint must match
                    staged[str(i)] = {"seed": seed, "fingerprint": drawn}
                if i in samples:  # (its inputs are kept only to be written to the region)
                    self.trials[i] = (None if r.get("seeded") else inputs,
                                      _Sampled(describe(expected), samples[i], describe(list(inputs))))
                    to_sample[i] = sampled(expected, samples[i])
                    inputs_to_sample[i] = sampled(list(inputs), input_seed(samples[i]))
                else:
                    self.trials[i] = (inputs, expected)
                del inputs, expected
            del first
            order = list(to_sample)
            rows = to_host([to_sample[i] for i in order] + [inputs_to_sample[i] for i in order])
            for k, i in enumerate(order):
                self.trials[i][1].want, self.trials[i][1].inputs_want = rows[k], rows[len(order) + k]
        synchronize(self.device)
        reply: dict[str, Any] = {"op": "chunked"}
        if hidden:
            reply["hidden"] = hidden
        if r.get("seeded"):
            prints = resolve_fingerprints([v["fingerprint"] for v in staged.values()])
            reply["staged"] = {k: {**v, "fingerprint": fp} for (k, v), fp in zip(staged.items(), prints)}
        return reply

    def _hidden_call(self, name: str, seed: int) -> tuple[list[Any], Any, dict[str, Any]]:
        """A hidden check's inputs and expected output; where the reference is undefined on this draw, the call
        falls back to the problem's own inputs and the record says it was skipped."""
        try:
            inputs, expected, drawn = self.problem.variants.draw(name, seed)
            return inputs, expected, {"check": name, **drawn}
        except Skipped as why:
            inputs = self.problem.inputs(seed)
            return inputs, self.problem.model(*clone_values(inputs)), {"check": name, "skipped": str(why)}

    def op_stage(self, r: dict[str, Any]) -> dict[str, Any]:
        """One call's inputs for the runner, written to the region (inputs a seed does not determine; seeded ones
        are staged by ``op_chunk``)."""
        inputs, expected = self.trials[int(r["i"])]
        layout = Layout.from_json(r["layout"])
        header, _ = write_values(list(inputs), self.region.mapped(layout.size), layout.inputs_at, layout.outputs_at)
        synchronize(self.device)
        staged: dict[str, Any] = {"op": "staged", "inputs": header}
        if not isinstance(expected, _Sampled):  # the output a checked call must match (a hidden size has its own)
            staged["output"] = describe(expected)
        return staged

    def op_check(self, r: dict[str, Any]) -> dict[str, Any]:
        """A call's check, answered before the runner does anything more (the parent sends nothing else to the
        runner meanwhile: what the check reads of the region is then what the call left there). A sampled check
        runs on the host alone; any other check synchronizes before it replies."""
        sampled_check = isinstance(self.trials.get(int(r["i"]), (None, None))[1], _Sampled)
        try:
            return self._check(r)
        finally:
            if not sampled_check:
                synchronize(self.device)

    def _check(self, r: dict[str, Any]) -> dict[str, Any]:
        """The runner's whole output and its inputs as the call left them, both in the region: every element of
        a checked call's, a sampled call's at positions drawn from a seed the runner never learns."""
        layout = Layout.from_json(r["layout"])
        inputs, expected = self.trials.pop(int(r["i"]))
        try:
            validate(r["outputs"], layout.outputs_at, layout.after_at)
            validate(r["after"], layout.after_at, layout.size)
        except HeaderError as exc:
            return {"op": "checked", "ok": False, "reason": f"the runner's report is malformed ({exc})", "malformed": True}
        if r.get("device") and self.device_bytes is None:
            raise RuntimeError("a check of the device region, but none is attached")
        mm = self.device_bytes if r.get("device") else self.region.mapped(layout.size)
        tolerances = _Tolerances(r["tolerances"], self.atol_scale.pop(int(r["i"]), 1.0))
        sampled_call = isinstance(expected, _Sampled)
        why = mismatch(r["outputs"], expected.header if sampled_call else describe(expected))
        if why:
            return {"op": "checked", "ok": False, "reason": why}
        if sampled_call:
            cmp = compare_outputs(expected.want, sampled_in_region(r["outputs"], mm, expected.seed), tolerances)
            if not cmp.ok:
                cmp.reason = f"at sampled positions of the call's output: {cmp.reason}"
        else:
            cmp = compare_outputs(expected, read_values(r["outputs"], mm, self.device), tolerances)
        if not cmp.ok:
            return {"op": "checked", "ok": False, "reason": cmp.reason, "max_abs_diff": cmp.max_abs_diff}
        after = r["after"]
        if sampled_call:
            unchanged = not mismatch(after, expected.inputs_header, "input") and same_bits(
                expected.inputs_want, sampled_in_region(after, mm, input_seed(expected.seed)))
        else:
            unchanged = not mismatch(after, describe(list(inputs)), "input") and same_bits(
                list(inputs), read_values(after, mm, self.device))
        if not unchanged:
            return {"op": "checked", "ok": False, "reason": "forward modified its input tensors in place (every call's "
                    "inputs are compared with what was drawn after the call; write the result to a tensor of its own)"}
        return {"op": "checked", "ok": True, "max_abs_diff": cmp.max_abs_diff}

    def op_release(self, r: dict[str, Any]) -> dict[str, Any]:
        self.trials, self.secret, self.atol_scale = {}, None, {}
        return {"op": "released"}

    def op_report(self, r: dict[str, Any]) -> dict[str, Any]:
        """What this process has loaded: its modules and the shared objects mapped into it."""
        maps = set()
        try:
            for line in open("/proc/self/maps"):
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and ".so" in parts[5]:
                    maps.add(parts[5].strip())
        except OSError:
            pass
        return {"op": "report", "modules": sorted(sys.modules), "shared_objects": sorted(maps), "cwd": os.getcwd()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kevin_exp.bench.reference_server")
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--exchange-socket", type=int, default=-1, help="each run's shared region comes on it")
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    replies = os.fdopen(args.reply_fd, "w")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    sock = socket.socket(fileno=args.exchange_socket) if args.exchange_socket >= 0 else None
    server = Server(sock, args.backend)
    replies.write(json.dumps({"op": "ready", "pid": os.getpid()}) + "\n")
    replies.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        t0 = time.perf_counter()
        try:
            reply = server.handle(request)
        except Exception as exc:  # noqa: BLE001 - a broken reference program is reported, the process goes on
            import traceback

            reply = {"op": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000],
                     "detail": "".join(traceback.format_exc().splitlines(True)[-8:])}
        reply["s"] = round(time.perf_counter() - t0, 5)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
