import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs 2D max pooling.
    """

    def __init__(self, kernel_size: int, stride: int, padding: int):
        """
        Args:
            kernel_size (int): Size of the pooling window.
            stride (int): Stride of the pooling window.
            padding (int): Implicit padding (with -inf) on both sides of the input.
        """
        super(Model, self).__init__()
        self.maxpool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Applies 2D max pooling to the input tensor.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, channels, height, width).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, channels, pooled_height, pooled_width).
        """
        return self.maxpool(x)


batch_size = 32
channels = 64
height = 256
width = 256
kernel_size = 3
stride = 2
padding = 1

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 4, "channels": 16, "height": 64, "width": 64}}


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [kernel_size, stride, padding]
