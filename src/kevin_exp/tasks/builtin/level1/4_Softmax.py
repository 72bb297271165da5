import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs a Softmax activation over the last dimension
    (e.g. attention scores of shape (batch, queries, keys)).
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Applies Softmax activation to the input tensor.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, dim).

        Returns:
            torch.Tensor: Output tensor with Softmax applied over the last dimension, same shape as input.
        """
        return torch.softmax(x, dim=-1)


batch_size = 256
seq_len = 1024
dim = 256

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 32, "seq_len": 256, "dim": 256}}


def get_inputs():
    x = torch.randn(batch_size, seq_len, dim)
    return [x]


def get_init_inputs():
    return []  # No special initialization inputs needed
