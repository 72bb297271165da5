import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that applies Layer Normalization over the last dimension followed by ReLU.
    """

    def __init__(self, normalized_shape: int):
        super(Model, self).__init__()
        self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, dim).
        """
        x = self.norm(x)
        x = torch.relu(x)
        return x


batch_size = 16384
dim = 4096

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 1024, "dim": 2048}}


def get_inputs():
    # rows with a non-zero mean and a scale other than 1 so the normalization is not a no-op
    return [torch.randn(batch_size, dim) * 3.0 + 1.0]


def get_init_inputs():
    return [dim]
