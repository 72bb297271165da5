"""The run: the training loop, the evaluation loop, the step they share, and the run folder."""
