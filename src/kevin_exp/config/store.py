"""The schemas, sweeps and cluster profiles registered in Hydra's ConfigStore."""
from __future__ import annotations

from pathlib import Path

from kevin_exp.config.schema import TrainConfig

SWEEPS_DIR = Path(__file__).resolve().parents[3] / "sweeps"
CLUSTER_DIR = Path(__file__).resolve().parents[3] / "slurm"


def register_configs() -> None:
    """Schemas for every group; the files of ``sweeps/`` as the ``sweep`` group and the SLURM profiles of
    ``slurm/`` as the ``cluster`` group (they live beside ``conf/`` so the paper's ablations and the cluster
    settings are easy to find, and are registered here so they work from any directory). ``cluster=local``
    (the default) keeps Hydra's own launcher: the sweep runs on this machine."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")
    cs.store(group="cluster", name="local", node={}, package="_global_")
    for path in sorted(CLUSTER_DIR.glob("*.yaml")):
        cs.store(group="cluster", name=path.stem, node=OmegaConf.load(path), package="_global_")
    cs.store(name="train_schema", node=TrainConfig)
