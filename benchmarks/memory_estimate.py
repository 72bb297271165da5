"""The resource check's predictions against a finished run's measured peaks (docs/scaling.md).

    python benchmarks/memory_estimate.py outputs/runs/<run> [outputs/runs/<other run> ...]

For each run folder: the estimate of its recorded config (``config.json``: the settings and the world the run
used) beside the peaks its steps measured (``metrics.jsonl``: ``gpu_mem_peak_gb``, the training phase's peak
allocated GPU memory, and ``host_rss_peak_gb``, one rank's peak resident memory, each the max over ranks and
steps). The measured GPU peak excludes the CUDA context and NCCL (they are not allocations) and the rollout's KV
cache (it is freed before training), so it is set against states + buffers + the training phase. GiB are
converted to GB. Run it on GPU runs of the paper's configs to correct the constants in kevin_exp/launch/resources.py.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kevin_exp.config import TrainConfig, config_from_dict
from kevin_exp.launch.resources import RANK_PROCESS_GB, estimate, layout_of
from kevin_exp.records.run_records import read_jsonl

GIB = 2**30 / 1e9


def compare(run_dir: Path) -> dict:
    cfg = config_from_dict(TrainConfig, json.loads((run_dir / "config.json").read_text()))
    x = layout_of(cfg)
    est = estimate(x)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    gpu = max((m.get("gpu_mem_peak_gb") or 0.0 for m in metrics), default=0.0) * GIB
    rss = max((m.get("host_rss_peak_gb") or 0.0 for m in metrics), default=0.0) * GIB
    predicted_train = est.states_gb + est.buffers_gb + est.train_phase_gb
    ranks = max(1, x.ranks_per_node)
    predicted_rank_host = RANK_PROCESS_GB + max(est.host_offload_gb, est.host_load_gb) / ranks
    return {"run": run_dir.name, "model": x.model, "backend": x.backend, "world": x.world_size,
            "gpu_predicted_gb": predicted_train, "gpu_measured_gb": gpu,
            "host_rank_predicted_gb": predicted_rank_host, "host_rank_measured_gb": rss,
            "per_gpu_peak_predicted_gb": est.per_gpu_gb, "steps": len(metrics)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = parser.parse_args()
    rows = [compare(r) for r in args.runs]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"{'run':<40} {'model':>6} {'world':>5} {'GPU pred':>9} {'GPU meas':>9} {'ratio':>6} "
          f"{'host/rank pred':>15} {'host/rank meas':>15}")
    for r in rows:
        ratio = r["gpu_measured_gb"] / r["gpu_predicted_gb"] if r["gpu_predicted_gb"] else float("nan")
        print(f"{r['run'][:40]:<40} {r['model']:>6} {r['world']:>5} {r['gpu_predicted_gb']:9.1f} "
              f"{r['gpu_measured_gb']:9.1f} {ratio:6.2f} {r['host_rank_predicted_gb']:15.1f} "
              f"{r['host_rank_measured_gb']:15.1f}")


if __name__ == "__main__":
    main()
