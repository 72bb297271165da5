"""From a composed DictConfig to the typed schema, every setting checked (``to_typed``); the typed config of a
command line's overrides, outside a Hydra job (``compose_overrides``); and a schema object back from a recorded
config (``config_from_dict``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from kevin_exp.bench.config import Tolerance
from kevin_exp.config.schema import TrainConfig
from kevin_exp.errors import UserError
from kevin_exp.settings_checks import check_settings


class ConfigError(UserError):
    """A composed config with a value the code cannot run: names the key, the value and what is allowed."""


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """A schema object from a recorded config (a run's config.json): keys the schema no longer has are
    ignored, keys it gained keep their defaults."""
    import typing

    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kind, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = config_from_dict(kind, value)
        elif kind == dict[str, Tolerance] and isinstance(value, dict):
            value = {k: Tolerance(**v) for k, v in value.items()}
        values[f.name] = value
    return cls(**values)


def hydra_overrides() -> list[str]:
    """The running Hydra job's task overrides ([] outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def compose_overrides(overrides: list[str], run_dir: str = "unused") -> TrainConfig:
    """The typed config `python -m kevin_exp.train <overrides>` would run with (for scripts, benchmarks, tests)."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from kevin_exp.config.resolvers import register_resolvers
    from kevin_exp.config.store import register_configs

    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    conf = Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="train"):
        return to_typed(compose(config_name="train", overrides=[*overrides, f"run_dir={run_dir}"]))


def to_typed(cfg: Any) -> TrainConfig:
    """The composed DictConfig as dataclasses (interpolations resolved, every setting checked): raises
    ConfigError naming each bad setting."""
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):
        raise TypeError("the composed config is not a TrainConfig: does conf/train.yaml list train_schema first?")
    problems = check_settings(obj)
    if problems:
        raise ConfigError("; ".join(problems))
    return obj
