"""Prompts, response parsing and the multi-turn refinement loop."""
