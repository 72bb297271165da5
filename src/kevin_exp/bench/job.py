"""The job a worker is sent (as JSON, after its key): both programs' sources, the evaluator's config and
where the extensions built for it are. The parent encodes it; the worker decodes the config."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance


def make_job(reference: str, candidate: str, config: BenchConfig, prebuilt: dict[str, list[str]]) -> dict[str, Any]:
    """``prebuilt``: spec digest -> [path of the built module as the worker sees it, module name]."""
    cfg = asdict(config)
    cfg["cache_dir"] = None
    return {
        "reference": reference,
        "candidate": candidate,
        "config": _jsonable(cfg),
        "prebuilt": prebuilt,
    }


def config_from_job(job: dict[str, Any]) -> BenchConfig:
    cfg_dict = dict(job["config"])
    cfg_dict["rules"] = CheckRules(**cfg_dict["rules"])
    cfg_dict["tolerances"] = {k: Tolerance(**v) for k, v in cfg_dict["tolerances"].items()}
    cfg_dict.pop("cache_dir", None)
    return BenchConfig(**cfg_dict)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
