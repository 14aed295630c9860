"""Image files Pillow cannot write, made byte by byte for the image-input tests: 16-bit colour
PNGs and huge but tiny-on-disk PNGs (decompression bombs)."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def png_bytes(samples: np.ndarray, color_type: int, bit_depth: int = 16) -> bytes:
    """A PNG written by hand (Pillow cannot save 16-bit colour): ``samples`` is (h, w) or
    (h, w, channels); colour type 0 grey, 2 RGB, 4 grey+alpha, 6 RGBA."""
    height, width = samples.shape[:2]
    if bit_depth == 1:
        raw = np.packbits(samples.astype(bool), axis=1)
    else:
        raw = samples.astype(">u2" if bit_depth == 16 else "u1").reshape(height, -1)
    rows = np.concatenate([np.zeros((height, 1), np.uint8),
                           raw.view(np.uint8).reshape(height, -1)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + _chunk(b"IEND", b""))


def zeros_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of ``width`` x ``height`` black pixels, compressed in a stream."""
    row = b"\x00" * (1 + (width + 7) // 8)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return (b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + _chunk(b"IDAT", body) + _chunk(b"IEND", b""))
