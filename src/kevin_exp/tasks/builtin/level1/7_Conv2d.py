import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Performs a standard 2D convolution (square kernel, stride 1, no padding, with bias).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        """
        Args:
            in_channels (int): Number of channels in the input tensor.
            out_channels (int): Number of channels produced by the convolution.
            kernel_size (int): Size of the square convolution kernel.
        """
        super(Model, self).__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Performs the 2D convolution.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_channels, height, width).

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_channels, height_out, width_out).
        """
        return self.conv2d(x)


batch_size = 16
in_channels = 8
out_channels = 32
kernel_size = 3
height = 256
width = 512

# Sizes for the cpu backend (the module-level constants above are the cuda sizes).
BACKEND_SIZES = {"cpu": {"batch_size": 2, "height": 128, "width": 128}}


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
