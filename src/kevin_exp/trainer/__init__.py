"""The policy update: the learners, log-probs, checkpoints and the collectives of a step over ranks."""
