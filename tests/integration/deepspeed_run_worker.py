"""One rank of a training run under trainer=deepspeed (tests/integration/test_deepspeed_*.py start N of them).

usage: python deepspeed_run_worker.py RUN_DIR OVERRIDE...   (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the env)
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from kevin_exp.run.training import TrainingRun
from tests.helpers import compose_train


def main() -> None:
    logging.basicConfig(level=logging.INFO)  # what the run says as it goes (python -m kevin_exp.train logs the same)
    run_dir, overrides = Path(sys.argv[1]), sys.argv[2:]
    run = TrainingRun(compose_train(overrides, run_dir))
    run.setup()
    run.fit()


if __name__ == "__main__":
    main()
