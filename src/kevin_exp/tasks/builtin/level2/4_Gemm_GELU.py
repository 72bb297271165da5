import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Simple model that performs a matrix multiplication (Linear with bias) followed by GELU.
    """

    def __init__(self, in_features: int, out_features: int):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.linear(x)
        x = F.gelu(x)
        return x


batch_size = 1024
in_features = 2048
out_features = 4096

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 128, "in_features": 512, "out_features": 512}}


def get_inputs():
    # inputs scaled up so that the pre-activations are O(1) and GELU's curved region is exercised
    return [torch.randn(batch_size, in_features) * 2.0]


def get_init_inputs():
    return [in_features, out_features]
