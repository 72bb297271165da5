"""Activation checkpointing on a share of the decoder layers (``trainer.checkpoint_layers``).

Full checkpointing recomputes every layer's forward in the backward pass (8N FLOPs per token instead of 6N);
checkpointing only some layers keeps the others' activations instead, trading memory for that recompute.
transformers' decoder layers are ``GradientCheckpointingLayer`` modules, each with its own
``gradient_checkpointing`` flag (set on all of them by ``gradient_checkpointing_enable``): the layers left out
get it turned off again.
"""
from __future__ import annotations

import torch
from transformers.modeling_layers import GradientCheckpointingLayer


def checkpointed_layer_indices(n_layers: int, fraction: float) -> list[int]:
    """The ``round(fraction * n_layers)`` layers to checkpoint, spread evenly over the depth
    (e.g. 0.5 of 8: 1, 3, 5, 7)."""
    k = round(fraction * n_layers)
    return sorted({min(n_layers - 1, int((i + 0.5) * n_layers / k)) for i in range(k)}) if k else []


def checkpointing_layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    """The model's decoder layers that can be checkpointed, in order of depth."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def limit_checkpointing(model: torch.nn.Module, fraction: float) -> list[int]:
    """Keep activation checkpointing on ``fraction`` of the decoder layers (spread over the depth) and turn it
    off on the rest; call after checkpointing was enabled on the whole model. Returns the checkpointed layers'
    indices."""
    layers = checkpointing_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer modules: trainer.checkpoint_layers "
                         "needs a transformers decoder model")
    chosen = checkpointed_layer_indices(len(layers), fraction)
    keep = set(chosen)
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = layer.gradient_checkpointing and i in keep
    return [i for i, layer in enumerate(layers) if layer.gradient_checkpointing]
