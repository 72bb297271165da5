import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A simple model that performs a cumulative sum (prefix sum) operation along a specified dimension.
    """

    def __init__(self, dim: int):
        """
        Args:
            dim (int): The dimension along which to perform the scan operation.
        """
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Forward pass for the Scan model, computing the cumulative sum along the specified dimension.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, length).

        Returns:
            torch.Tensor: Tensor of the same shape as `x` after applying cumulative sum along `dim`.
        """
        return torch.cumsum(x, dim=self.dim)


batch_size = 16384
length = 4096
dim = 1

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 512, "length": 2048}}


def get_inputs():
    x = torch.randn(batch_size, length)
    return [x]


def get_init_inputs():
    return [dim]
