"""CIFAR10 augmentation for a whole batch of uint8 images at once, on whatever device the batch is on.

The per-sample pipeline (``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``, ``ToTensor()``,
``Normalize(mean, std)``, one PIL image at a time in the DataLoader) becomes a handful of tensor operations
on the batch: the random crop and the flip are one gather from the zero-padded batch. This is what the
fastest CIFAR10 training codes do (airbench augments on the GPU), and what the ``batched_transforms``
finding of lightning-perf recommends; the example runs it in ``LightningModule.on_after_batch_transfer``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PIXEL_MAX = 255.0


def normalize_batch(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 in [0, 1] (``ToTensor``), then ``(x - mean) / std`` per channel."""
    x = images.float().div_(PIXEL_MAX)
    return x.sub_(mean.view(1, -1, 1, 1)).div_(std.view(1, -1, 1, 1))


def augment_batch(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    padding: int = 4,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random crop of the zero-padded image and random horizontal flip per image, then normalize.

    Draws the same distribution as torchvision's per-sample ``RandomCrop(size, padding)`` (fill 0) and
    ``RandomHorizontalFlip(0.5)``: an offset in ``[0, 2 * padding]`` per axis, a flip with probability 1/2.
    """
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(
            f"images: expected a uint8 batch (N, C, H, W), got {images.dtype} {tuple(images.shape)}"
        )
    n, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))  # zeros: black, as RandomCrop's fill=0
    dy = torch.randint(0, 2 * padding + 1, (n, 1), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n, 1), device=device, generator=generator)
    flip = torch.rand((n, 1), device=device, generator=generator) < 0.5
    rows = dy + torch.arange(h, device=device)
    cols = dx + torch.arange(w, device=device)
    cols = torch.where(flip, cols.flip(1), cols)  # a flipped crop reads its columns right to left
    batch_index = torch.arange(n, device=device).view(n, 1, 1, 1)
    channel_index = torch.arange(c, device=device).view(1, c, 1, 1)
    cropped = padded[batch_index, channel_index, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]
    return normalize_batch(cropped, mean, std)
