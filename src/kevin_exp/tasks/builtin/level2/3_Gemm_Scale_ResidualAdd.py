import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A model that performs a matrix multiplication (Linear with bias), scales the result,
    and adds a residual input.
    """

    def __init__(self, in_features: int, out_features: int, scaling_factor: float):
        """
        Args:
            in_features (int): Number of input features.
            out_features (int): Number of output features.
            scaling_factor (float): Scaling factor applied after the matrix multiplication.
        """
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).
            residual (torch.Tensor): Residual tensor of shape (batch_size, out_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.matmul(x)
        x = x * self.scaling_factor
        x = x + residual
        return x


batch_size = 2048
in_features = 2048
out_features = 2048
scaling_factor = 2.0

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 128, "in_features": 512, "out_features": 512}}


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randn(batch_size, out_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
