"""acrb.storage.load_rgb, the one way images are read: every mode to 8-bit RGB, scaled (not
clipped) from 16 bits, alpha on white, oversized and broken files refused naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from acrb import storage
from acrb.errors import InputDataError
from acrb.storage import MAX_IMAGE_PIXELS, load_rgb
from tests.image_files import png_bytes, zeros_png

#: Every 16-bit level that is an exact multiple of 257 maps to one 8-bit level (65535 = 255 x 257)
LEVELS8 = np.arange(256, dtype=np.uint8)
LEVELS16 = LEVELS8.astype(np.uint16) * 257


def grey8(rgb: np.ndarray) -> np.ndarray:
    assert rgb.dtype == np.uint8 and rgb.shape[-1] == 3
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()
    return rgb[..., 0]


def test_sixteen_bit_grey_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "g16.png"
    path.write_bytes(png_bytes(LEVELS16[None, :], 0))
    assert Image.open(path).mode == "I;16"
    np.testing.assert_array_equal(grey8(load_rgb(path))[0], LEVELS8)


def test_sixteen_bit_values_between_levels_round_to_nearest(tmp_path: Path) -> None:
    values = np.array([[0, 128, 129, 257 + 128, 65535 - 129, 65535]], dtype=np.uint16)
    path = tmp_path / "g16.png"
    path.write_bytes(png_bytes(values, 0))
    expected = np.round(values.astype(float) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(grey8(load_rgb(path)), expected)


@pytest.mark.parametrize("byte_order", [">u2", "<u2"])
def test_sixteen_bit_tiff_either_byte_order(tmp_path: Path, byte_order: str) -> None:
    path = tmp_path / "g16.tif"
    Image.fromarray(LEVELS16[None, :].astype(byte_order)).save(path)
    assert Image.open(path).mode in ("I;16B", "I;16")
    np.testing.assert_array_equal(grey8(load_rgb(path))[0], LEVELS8)


@pytest.mark.parametrize(("color_type", "channels"), [(2, 3), (6, 4), (4, 2)])
def test_sixteen_bit_colour_and_alpha_pngs(tmp_path: Path, color_type: int,
                                           channels: int) -> None:
    grey = LEVELS16[None, :]
    planes = [grey] * (channels - 1 if channels in (2, 4) else channels)
    if channels in (2, 4):
        planes.append(np.full_like(grey, 65535))  # opaque
    path = tmp_path / "c16.png"
    path.write_bytes(png_bytes(np.stack(planes, -1), color_type))
    np.testing.assert_array_equal(grey8(load_rgb(path))[0], LEVELS8)


def test_half_transparent_pixel_is_composited_on_white(tmp_path: Path) -> None:
    path = tmp_path / "rgba.png"
    Image.new("RGBA", (2, 2), (0, 0, 0, 128)).save(path)
    assert np.abs(load_rgb(path).astype(int) - 127).max() <= 1


def test_cmyk_is_converted(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.tif"
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(path)
    np.testing.assert_array_equal(load_rgb(path)[0, 0], [255, 0, 0])


def test_bomb_is_refused_naming_file_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(zeros_png(20000, 20000))
    with pytest.raises(InputDataError) as err:
        load_rgb(path)
    assert str(path) in err.value.problem and f"{MAX_IMAGE_PIXELS:,}" in err.value.problem


def test_own_limit_applies_even_if_pillows_is_raised(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "small.png"
    Image.new("RGB", (20, 20)).save(path)
    monkeypatch.setattr(storage, "MAX_IMAGE_PIXELS", 100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(InputDataError, match=r"is 20 x 20 = 400 pixels, more than the limit"):
        load_rgb(path)


def test_mode_i_outside_sixteen_bits_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "i32.tif"
    Image.fromarray(np.array([[0, 70000]], dtype=np.int32)).save(path)
    with pytest.raises(InputDataError, match="32-bit integer samples"):
        load_rgb(path)
