"""kevin-exp's Hydra plugins: the SLURM launcher with pre-submission checks."""
