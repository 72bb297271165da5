"""The policy update: log-probs, the learner, checkpoints, and the training loop."""
