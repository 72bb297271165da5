"""Typed schemas of the runner's configuration, registered in Hydra's ConfigStore, and the resolvers the
YAML uses.

Values live in YAML under ``conf/`` (one group per component); these dataclasses are the schemas, so a
typo or a wrong type fails when the config is composed, and each field declares what it accepts
(``choice``/``number`` from ``kevin_exp.settings_checks``), so a bad value fails there too. Entry points turn
the composed DictConfig into these objects once (``to_typed``); library code only ever sees the dataclasses.

- ``model``, ``rollout``, ``algorithm``, ``evaluator``, ``tasks``, ``trainer``, ``launch_settings``
  (``logger`` and ``resources``): one module per group's schema;
- ``schema``: ``TrainConfig``, the whole run (groups, headline knobs, checks across groups);
- ``store``: the registration in Hydra's ConfigStore (schemas, sweeps, cluster profiles);
- ``compose``: composed DictConfig -> ``TrainConfig`` with every setting checked, and back from a record;
- ``resolvers``: the ``kx.*`` OmegaConf resolvers.
"""
from __future__ import annotations

from kevin_exp.config.algorithm import AlgorithmConfig
from kevin_exp.config.compose import ConfigError, config_from_dict, hydra_overrides, to_typed
from kevin_exp.config.evaluator import EvaluatorConfig, RemoteEvaluatorConfig
from kevin_exp.config.launch_settings import LoggerConfig, ResourcesConfig
from kevin_exp.config.model import MODEL_ARCHS, MODEL_DTYPES, MODEL_SOURCES, ModelConfig
from kevin_exp.config.rollout import VLLM_VERSION, RolloutConfig, VLLMConfig
from kevin_exp.config.schema import EvalConfig, TrainConfig, kernel_menu_problems, world_size_problems
from kevin_exp.config.store import register_configs
from kevin_exp.config.tasks import TasksConfig
from kevin_exp.config.trainer import DEEPSPEED_ONLY, TrainerConfig

__all__ = [
    "AlgorithmConfig", "ConfigError", "DEEPSPEED_ONLY", "EvalConfig", "EvaluatorConfig", "LoggerConfig",
    "MODEL_ARCHS", "MODEL_DTYPES", "MODEL_SOURCES", "ModelConfig", "RemoteEvaluatorConfig", "ResourcesConfig",
    "RolloutConfig", "TasksConfig", "TrainConfig", "TrainerConfig", "VLLMConfig", "VLLM_VERSION",
    "config_from_dict", "hydra_overrides", "kernel_menu_problems", "register_configs",
    "to_typed", "world_size_problems",
]
