"""Launching a run: the job's checked settings, its ranks and their world, the checks made before anything runs
(settings, inputs, memory, the SLURM cluster), and the thread budget."""
