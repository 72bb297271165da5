"""The run: the training loop, the evaluation loop, the step they share, and the run folder.

Before a run, in order: ``launch.preflight`` composes and checks every point of the launch; inside the Hydra
job, ``launch.job`` gives the typed settings (run folder, thread budget) and ``launch.ranks`` starts or joins
the run's ranks.

A training run (``training.TrainingRun``): ``folder`` opens the run folder and takes its writer's lock;
``parts`` builds the task pool and the environment (``setup``), the policy (``models``) and the generator
(``rollout.generators``); ``trainer.learners`` builds the learner, and ``trainer.checkpoint`` resumes from the
last checkpoint. Then each step, in order:

1. tasks: a seeded sample of the pool, this rank's share of it (``step``);
2. rollout: trajectories x refinement turns (``rollout.loop``): the prompt (``rollout.prompts``), the
   responses (``rollout.generation``, ``rollout.scripted`` or ``rollout.vllm_engine``), the kernel out of each
   (``rollout.parsing``), its verdict and score (``rollout.env``: ``bench`` and ``rl.reward``); with
   ``rollout.async_steps=1`` the next step's rollout runs while this one trains (``training.AheadRollout``);
3. credit: each turn's discounted return and advantage (``step.assign_credit``: ``rl.credit``);
4. records: rank 0 gathers the samples (``trainer.collectives``) and appends their rows (``records.rows``,
   ``records.run_records``) and transcripts (``records.transcripts``);
5. update: old log-probs, then clipped gradient steps (``trainer.learner`` or ``trainer.deepspeed_learner``:
   ``trainer.logprobs``, ``trainer.batching``, ``rl.loss``);
6. metrics: the step's row (``records.rows``, ``throughput``), the progress line (``records.progress``) and
   the metric logger (``records.metric_logger``);
7. checkpoint: every ``trainer.checkpoint_every`` steps and at the last (``trainer.checkpoint``), with SLURM's
   time-limit signal held until it is written (``signals``).

The run ends with its summary (``records.summary``).

An evaluation run (``evaluation.EvaluationRun``) builds the same parts (``parts``, ``folder``), loads a
checkpoint's weights (``trainer.checkpoint``) and runs steps 2-4, in one process, on fixed batches of held-out
tasks (``step`` gives their seeds and credit), with no update and no checkpoint; its summary reads the rows with
``analysis``.
"""
