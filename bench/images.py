"""Images for the multimodal loader benchmark (``bench/gpu.py``): synthetic pictures whose
JPEGs are the size of real ones, and the batched decode every loader shares.

The pictures are smooth (a coarse and a finer layer of noise, upsampled, plus a little pixel
noise), so that JPEG quality 90 makes 20-40 KB of each, as photographs at 224x224 do; pure
noise would make 100 KB JPEGs and flat colour 5 KB ones.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

SHAPE = (224, 224, 3)
QUALITY = 90

try:  # torchvision cannot load beside every torch build (.venv-bench uninstalls it)
    from torchvision.io import decode_jpeg as _tv_decode
except Exception:  # noqa: BLE001 - any failure to load means: decode with PIL
    _tv_decode = None

try:  # OpenCV's decoder (libjpeg-turbo) releases the GIL for the whole decode
    import cv2 as _cv2
except ImportError:
    _cv2 = None

DECODERS = ("torchvision", "cv2", "pil")
DECODER = ("torchvision" if _tv_decode is not None else "cv2" if _cv2 is not None
           else "pil")
"""What ``decode_batch`` decodes with by default: torchvision's batched decode where it
imports, else OpenCV's where it imports, else PIL."""


def _layer(rng: np.random.Generator, side: int) -> np.ndarray:
    small = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    big = Image.fromarray(small).resize(SHAPE[:2], Image.Resampling.BICUBIC)
    return np.asarray(big, dtype=np.float32)


def smooth_images(n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct ``[224, 224, 3]`` uint8 pictures, as one ``[n, 224, 224, 3]`` array."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, *SHAPE), np.uint8)
    for i in range(n):
        noise = rng.standard_normal(SHAPE, dtype=np.float32) * 12
        picture: np.ndarray = 0.5 * _layer(rng, 8) + 0.5 * _layer(rng, 56) + noise
        picture[picture < 0] = 0
        picture[picture > 255] = 255
        out[i] = picture
    return out


def encode_jpeg(images: np.ndarray, quality: int = QUALITY) -> list[bytes]:
    """Each picture as JPEG bytes."""
    out = []
    for image in images:
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def decode_one(data: Any) -> np.ndarray:
    """One JPEG (bytes or a uint8 array of them) as a ``[224, 224, 3]`` uint8 array (PIL)."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def decode_batch(values: torch.Tensor, offsets: Sequence[int],
                 decoder: str | None = None) -> torch.Tensor:
    """The JPEGs ``values[offsets[i]:offsets[i+1]]`` as one ``[n, 224, 224, 3]`` uint8
    tensor, decoded by ``decoder`` (``DECODER`` when None): torchvision in one batched call;
    OpenCV or PIL image by image into the tensor."""
    decoder = decoder or DECODER
    n = len(offsets) - 1
    pieces = [values[offsets[i]:offsets[i + 1]] for i in range(n)]
    if decoder == "torchvision":
        if _tv_decode is None:
            raise RuntimeError("torchvision's decode_jpeg does not import here")
        return torch.stack([image.permute(1, 2, 0) for image in _tv_decode(pieces)])
    if decoder == "cv2" and _cv2 is None:
        raise RuntimeError("OpenCV does not import here: pip install opencv-python-headless")
    out = torch.empty((n, *SHAPE), dtype=torch.uint8)
    view = out.numpy()
    for i, piece in enumerate(pieces):
        if decoder == "cv2":
            view[i] = _cv2.imdecode(piece.numpy(), _cv2.IMREAD_COLOR_RGB)
        else:
            view[i] = decode_one(piece.numpy())
    return out


def _flat(encoded: Sequence[bytes]) -> tuple[torch.Tensor, list[int]]:
    """A list of byte strings as one flat uint8 tensor and its offsets."""
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in encoded])]).tolist()
    values = np.frombuffer(b"".join(encoded), np.uint8).copy()
    return torch.from_numpy(values), offsets


class DecodeJpeg:
    """The per-batch function a Lakestream loader is given (``transform=``): the JPEGs of
    ``column`` decoded into a ``[n, 224, 224, 3]`` uint8 tensor. Takes the collated batch as
    a binary column without tensor metadata comes: its flat bytes and ``column_offsets``."""

    def __init__(self, column: str = "image", decoder: str | None = None) -> None:
        self.column = column
        self.decoder = decoder

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        offsets = batch.pop(f"{self.column}_offsets")
        batch[self.column] = decode_batch(batch[self.column], offsets.tolist(), self.decoder)
        return batch


def collate_jpeg(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """MosaicML Streaming's samples (``image`` as JPEG bytes, ``label``) as one batch."""
    values, offsets = _flat([s["image"] for s in samples])
    return {"image": decode_batch(values, offsets),
            "label": torch.tensor([int(s["label"]) for s in samples])}
