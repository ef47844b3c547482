"""The Inception-v3 network that FID is defined with, for `train --fid_weights`.

FID (Heusel et al. 2017) compares the 2048 pooled features of TensorFlow's Inception-v3
graph of 2015-12-05. Its PyTorch port is one weights file, published by torch-fidelity
(`weights-inception-2015-12-05-6726825d.pth`) and pytorch-fid (`pt_inception-2015-12-05-
6726825d.pth`, the same bytes): torchmetrics' FID loads it. Both packages build the
network on torchvision, which this toolkit does not depend on, so the network is written
here; its attribute names are the file's keys. What makes it the FID network and not
torchvision's classifier: TensorFlow 1's bilinear resize to 299 (no half-pixel offset),
inputs scaled as (x - 128) / 128, average pools that do not count padding, and a max
pool in the last block. tests/train/test_quality.py checks it against torch-fidelity's
own network, feature for feature, on random weights of the file's layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the side the network sees; every image is resized to it
INPUT_SIZE = 299
FEATURES = 2048


class ConvBN(nn.Module):
    """Convolution without bias, batch norm (TensorFlow's epsilon), ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int],
                 stride: int = 1, padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def _avg3(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's 3x3 average pool: padding is not counted in the mean."""
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class MixedA(nn.Module):
    """35x35: 1x1, 5x5, double 3x3 and pooled branches (Mixed_5b-d)."""

    def __init__(self, cin: int, pool: int) -> None:
        super().__init__()
        self.branch1x1 = ConvBN(cin, 64, 1)
        self.branch5x5_1, self.branch5x5_2 = ConvBN(cin, 48, 1), ConvBN(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = ConvBN(cin, 64, 1)
        self.branch3x3dbl_2 = ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = ConvBN(96, 96, 3, padding=1)
        self.branch_pool = ConvBN(cin, pool, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        double = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)), double,
                          self.branch_pool(_avg3(x))], 1)


class ReduceB(nn.Module):
    """35x35 -> 17x17 (Mixed_6a)."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = ConvBN(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = ConvBN(cin, 64, 1)
        self.branch3x3dbl_2 = ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = ConvBN(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        double = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch3x3(x), double, F.max_pool2d(x, 3, stride=2)], 1)


class MixedC(nn.Module):
    """17x17 with factorised 7x7 convolutions (Mixed_6b-e)."""

    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
        self.branch1x1 = ConvBN(cin, 192, 1)
        self.branch7x7_1 = ConvBN(cin, c7, 1)
        self.branch7x7_2 = ConvBN(c7, c7, row[0], padding=row[1])
        self.branch7x7_3 = ConvBN(c7, 192, col[0], padding=col[1])
        self.branch7x7dbl_1 = ConvBN(cin, c7, 1)
        self.branch7x7dbl_2 = ConvBN(c7, c7, col[0], padding=col[1])
        self.branch7x7dbl_3 = ConvBN(c7, c7, row[0], padding=row[1])
        self.branch7x7dbl_4 = ConvBN(c7, c7, col[0], padding=col[1])
        self.branch7x7dbl_5 = ConvBN(c7, 192, row[0], padding=row[1])
        self.branch_pool = ConvBN(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        single = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        double = x
        for i in range(1, 6):
            double = getattr(self, f"branch7x7dbl_{i}")(double)
        return torch.cat([self.branch1x1(x), single, double, self.branch_pool(_avg3(x))], 1)


class ReduceD(nn.Module):
    """17x17 -> 8x8 (Mixed_7a)."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1, self.branch3x3_2 = ConvBN(cin, 192, 1), ConvBN(192, 320, 3, stride=2)
        self.branch7x7x3_1 = ConvBN(cin, 192, 1)
        self.branch7x7x3_2 = ConvBN(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = ConvBN(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = ConvBN(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seven = x
        for i in range(1, 5):
            seven = getattr(self, f"branch7x7x3_{i}")(seven)
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), seven,
                          F.max_pool2d(x, 3, stride=2)], 1)


class MixedE(nn.Module):
    """8x8 with split 1x3/3x1 outputs (Mixed_7b, and Mixed_7c with a max pool)."""

    def __init__(self, cin: int, max_pool: bool) -> None:
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = ConvBN(cin, 320, 1)
        self.branch3x3_1 = ConvBN(cin, 384, 1)
        self.branch3x3_2a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = ConvBN(cin, 448, 1)
        self.branch3x3dbl_2 = ConvBN(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = ConvBN(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        single = self.branch3x3_1(x)
        double = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg3(x)
        return torch.cat([self.branch1x1(x),
                          self.branch3x3_2a(single), self.branch3x3_2b(single),
                          self.branch3x3dbl_3a(double), self.branch3x3dbl_3b(double),
                          self.branch_pool(pooled)], 1)


def resize_like_tf1(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of [N, C, H, W] to size x size as TensorFlow 1's resize_bilinear
    (align_corners=False): output pixel i samples input coordinate i * in / out, with no
    half-pixel offset, which torch's F.interpolate has no mode for."""

    def axis(n_in: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        src = torch.arange(size, device=x.device, dtype=torch.float32) * (n_in / size)
        lo = src.floor().long()
        return lo, (lo + 1).clamp_max(n_in - 1), (src - lo).to(x.dtype)

    y0, y1, dy = axis(x.shape[2])
    x0, x1, dx = axis(x.shape[3])
    top, bottom = x[:, :, y0], x[:, :, y1]
    top = top[..., x0] + (top[..., x1] - top[..., x0]) * dx
    bottom = bottom[..., x0] + (bottom[..., x1] - bottom[..., x0]) * dx
    return top + (bottom - top) * dy[:, None]


class FIDInception(nn.Module):
    """uint8 images [N, 3, H, W] -> their 2048 pooled Inception features [N, 2048], fp32.

    The `fc` classifier is held only because the weights file carries it."""

    num_features = FEATURES  # what torchmetrics' FID reads off a custom extractor

    def __init__(self) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = ConvBN(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = ConvBN(32, 32, 3)
        self.Conv2d_2b_3x3 = ConvBN(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = ConvBN(64, 80, 1)
        self.Conv2d_4a_3x3 = ConvBN(80, 192, 3)
        self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = (MixedA(192, 32), MixedA(256, 64),
                                                       MixedA(288, 64))
        self.Mixed_6a = ReduceB(288)
        self.Mixed_6b, self.Mixed_6c = MixedC(768, 128), MixedC(768, 160)
        self.Mixed_6d, self.Mixed_6e = MixedC(768, 160), MixedC(768, 192)
        self.Mixed_7a = ReduceD(768)
        self.Mixed_7b, self.Mixed_7c = MixedE(1280, max_pool=False), MixedE(2048, max_pool=True)
        self.fc = nn.Linear(FEATURES, 1008)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = resize_like_tf1(images.float(), INPUT_SIZE)
        x = (x - 128) / 128
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, stride=2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
        return x.mean(dim=(2, 3))


__all__ = ["FEATURES", "INPUT_SIZE", "FIDInception", "resize_like_tf1"]
