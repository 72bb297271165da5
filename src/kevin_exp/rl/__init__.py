"""Multi-turn GRPO math: per-turn scores, discounted returns, advantage estimators, policy losses.

Pure functions over lists and tensors; no model, evaluator or config objects.
"""
