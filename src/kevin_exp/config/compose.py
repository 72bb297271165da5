"""From a composed DictConfig to the typed schema: aliases reconciled, every setting checked (``to_typed``);
and a schema object back from a recorded config (``config_from_dict``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from kevin_exp.bench.config import Tolerance
from kevin_exp.config.schema import TrainConfig
from kevin_exp.errors import UserError
from kevin_exp.settings_checks import check_settings


class ConfigError(UserError):
    """A composed config with a value the code cannot run: names the key, the value and what is allowed."""


# group settings that are the same value as a headline knob (conf/algorithm reads them as ${gamma}, ...)
ALIASES = {"algorithm.gamma": "gamma", "algorithm.normalization": "normalization"}


def _override_keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def reconcile_aliases(cfg: Any, overrides: list[str]) -> set[str]:
    """A group alias set to a value of its own (on the command line, or by an experiment or sweep file) is
    the value of its headline knob too, so every record carries what the run used; setting both to
    different values is an error."""
    from omegaconf import OmegaConf, open_dict

    given = _override_keys(overrides)
    set_by_alias = set()
    for group_key, knob in ALIASES.items():
        group, name = group_key.split(".")
        node = cfg.get(group)
        if node is None or OmegaConf.is_interpolation(node, name):
            continue
        value = node[name]
        if knob in given and cfg[knob] != value:
            raise ConfigError(f"{knob}={cfg[knob]} and {group_key}={value} are the same setting with two values: "
                              f"set only one of them")
        with open_dict(cfg):
            cfg[knob] = value
        set_by_alias.add(group_key)
    return set_by_alias


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


def to_typed(cfg: Any, overrides: list[str] | None = None) -> TrainConfig:
    """The composed DictConfig as dataclasses (interpolations resolved, aliases reconciled, every setting
    checked): raises ConfigError naming each bad setting."""
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    by_alias = reconcile_aliases(cfg, hydra_overrides() if overrides is None else overrides)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):
        raise TypeError("the composed config is not a TrainConfig: does conf/train.yaml list train_schema first?")
    problems = check_settings(obj)
    # an alias and its headline knob hold one value: name the problem once, under the name the user set
    hidden = {ALIASES[a] for a in by_alias} | {a for a, knob in ALIASES.items() if a not in by_alias}
    problems = [p for p in problems if p.split("=", 1)[0] not in hidden]
    if problems:
        raise ConfigError("; ".join(problems))
    return obj
