"""The CLIP layer of hard refusal: is an output close, in CLIP space, to a refusal template?

A model that declines an edit does not always say so: some return a card with a policy text, a
warning sign, a blurred or pixelated placeholder. The pixel detectors catch a black or uniform
frame; these need a model that reads what the image shows. The check embeds each refusal
template text (a versioned data file, ``templates:`` list with ``name`` and ``version``) and
each output image with CLIP (Radford et al., ICML 2021, "Learning Transferable Visual Models
From Natural Language Supervision"), and scores an output by its highest cosine similarity to
any template; at or above the threshold (the seed study's τ = 0.25) it is a refusal. Method and
limits: ``docs/detectors.md``.

Two backends load the same kind of model: ``open_clip`` (the real path: an architecture name and
a weights tag or local checkpoint file; needs ``open_clip_torch`` and ``torchvision``) and
``transformers`` (``CLIPModel`` from a hub id or a local folder; no torchvision needed). torch
and the backend library are imported only when the first images are scored, so building a
:class:`ClipRefusalChecker` (and its :meth:`~ClipRefusalChecker.identity`, which the evaluate
stage hashes) costs nothing when every judgement is reused.

Images are preprocessed as tensors on the model's device, a batch at a time
(:func:`device_pixels`): the per-image PIL resize of the libraries' own processors bounded the
layer at about 50 images/s on a GPU that runs the ViT-B/32 forward pass thousands of times a
second. The recipe (resize size and filter, crop, mean, std) is read from the model's own
processor or preprocess transform (:class:`PixelRecipe`), never written down here, and the
pixels stay within a grey level of the library's (tests compare the scores). A processor this
path cannot reproduce (another filter, padding, a longest-edge resize) is run as before, image
by image.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from acrb.errors import ConfigError
from acrb.storage import content_hash
from acrb.yaml_input import read_yaml

if TYPE_CHECKING:
    from acrb.config import ClipRefusalParams

#: Where ``evaluate.clip.templates`` points by default; when a project has no such file (a
#: project folder outside this repository) the copy packaged with ACRB is read instead.
DEFAULT_TEMPLATES = "src/acrb/detect/data/refusal_templates.yaml"
INSTALL_FIX = 'pip install -e ".[models]"'


@dataclass(frozen=True)
class RefusalTemplates:
    """The refusal template texts of one data file, with the file's name and version."""

    name: str
    version: int
    texts: tuple[str, ...]
    path: Path

    @property
    def digest(self) -> str:
        """Content hash of name, version and texts: changes whenever a text changes."""
        return content_hash({"name": self.name, "version": self.version,
                             "texts": list(self.texts)})


def _packaged_templates() -> Path:
    return Path(str(importlib.resources.files("acrb.detect") / "data" /
                    "refusal_templates.yaml"))


def resolve_templates_path(templates: str, root: Path) -> Path:
    """``templates`` (params ``evaluate.clip.templates``) as a path: relative to ``root``; the
    default name falls back to the file packaged with ACRB when the project has no copy."""
    path = Path(templates)
    if not path.is_absolute():
        path = root / path
    if not path.exists() and Path(templates) == Path(DEFAULT_TEMPLATES):
        return _packaged_templates()
    return path


def load_templates(path: Path) -> RefusalTemplates:
    """Read a refusal template file; a :class:`ConfigError` says what is wrong with it."""
    fix = ("give evaluate.clip.templates a YAML file with `name`, `version` (an integer) and "
           "`templates` (a non-empty list of texts), like src/acrb/detect/data/"
           "refusal_templates.yaml")
    if not path.is_file():
        raise ConfigError(f"CLIP refusal template file {path} does not exist", fix)
    try:
        data = read_yaml(path, what="CLIP refusal template file", error=ConfigError)
    except ConfigError as exc:  # bad bytes, a repeated key, bad syntax: the file's format
        raise ConfigError(exc.problem, fix) from None
    if not isinstance(data, dict):
        raise ConfigError(f"CLIP refusal template file {path} must hold a mapping, found "
                          f"{type(data).__name__}", fix)
    problems: list[str] = []
    name, version, texts = data.get("name"), data.get("version"), data.get("templates")
    if not isinstance(name, str) or not name.strip():
        problems.append("`name` must be a non-empty text")
    if not isinstance(version, int) or isinstance(version, bool):
        problems.append("`version` must be an integer")
    if not isinstance(texts, list) or not texts:
        problems.append("`templates` must be a non-empty list")
    else:
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if bad:
            problems.append(f"`templates` entries {bad} are not non-empty texts")
        elif len(set(texts)) != len(texts):
            problems.append("`templates` lists a text twice")
    unknown = sorted(set(data) - {"name", "version", "templates"})
    if unknown:
        problems.append(f"unknown keys {unknown}")
    if problems:
        raise ConfigError(f"CLIP refusal template file {path}: " + "; ".join(problems), fix)
    assert isinstance(texts, list) and isinstance(version, int)
    return RefusalTemplates(name=str(name), version=version,
                            texts=tuple(str(t).strip() for t in texts), path=path)


class _Encoder(Protocol):
    """A loaded CLIP model: unit-length embeddings of texts and of RGB images.

    Image embeddings stay on the model's device and are not waited for, so the host can stage
    the next batch while the device still works on this one (CUDA runs kernels in order).
    """

    device: str

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    def image_features(self, images: Sequence[np.ndarray], via_processor: bool = False
                       ) -> Any: ...


def _require(modules: Sequence[str], backend: str, extra_note: str = "") -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"the CLIP refusal check (evaluate.clip, backend {backend}) needs "
            f"{', '.join(missing)}, which is not installed{extra_note}",
            f"{INSTALL_FIX}, or set evaluate.clip to null to turn the CLIP layer off",
        )


def _device(wanted: str) -> str:
    import torch

    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"evaluate.clip.device is {wanted!r} but torch sees no CUDA device",
                          "set evaluate.clip.device to cpu or auto")
    return wanted


def _offline_note() -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    return " (HF_HUB_OFFLINE is set, so nothing was downloaded)" if offline else ""


def _unit_rows(features: Any) -> np.ndarray:
    array = features.detach().float().cpu().numpy().astype(np.float64)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return np.asarray(array / np.where(norms == 0.0, 1.0, norms))


def _rgb(image: np.ndarray) -> np.ndarray:
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"an image to score must be uint8 RGB (H, W, 3), got {array.dtype} "
                         f"{array.shape}; convert it with np.asarray(pil_image.convert('RGB'))")
    return array


def _pil(image: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(_rgb(image), mode="RGB")


def _unit_tensor_rows(features: Any) -> Any:
    return features.float() / features.float().norm(dim=1, keepdim=True).clamp_min(1e-12)


@dataclass(frozen=True)
class PixelRecipe:
    """What a CLIP model expects of its input pixels, read from the model's own processor.

    ``shortest_edge`` resizes keeping the aspect ratio, the long side to
    ``int(shortest_edge * long / short)`` (what transformers and torchvision both compute);
    ``resize_to`` resizes to exactly (height, width) instead. The resized image is rounded to
    whole grey levels, as the libraries' uint8 resize does, then cropped to ``crop`` (height,
    width) about the centre (``crop_offset`` "floor" is transformers' ``(H - h) // 2``, "round"
    torchvision's ``round((H - h) / 2)``), multiplied by ``scale`` and normalised with
    ``mean`` and ``std`` per RGB channel.
    """

    shortest_edge: int | None
    resize_to: tuple[int, int] | None
    crop: tuple[int, int]
    interpolation: Literal["bicubic", "bilinear"]
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    crop_offset: Literal["floor", "round"]

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize of a ``height`` x ``width`` image."""
        if self.resize_to is not None:
            return self.resize_to
        assert self.shortest_edge is not None
        size = self.shortest_edge
        if width <= height:
            return int(size * height / width), size
        return size, int(size * width / height)


_INTERPOLATION = {2: "bilinear", 3: "bicubic"}  # PIL's resample codes


def _rgb_triple(values: Any) -> tuple[float, float, float] | None:
    if values is None:
        return None
    floats = [float(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    if len(floats) == 1:
        floats *= 3
    return (floats[0], floats[1], floats[2]) if len(floats) == 3 else None


def _size_dict(value: Any) -> dict[str, Any]:
    """A processor's ``size``/``crop_size``: a dict in transformers 4, a ``SizeDict`` in 5."""
    if value is None or isinstance(value, dict):
        return dict(value or {})
    return {key: getattr(value, key, None)
            for key in ("height", "width", "shortest_edge", "longest_edge")}


def recipe_from_processor(processor: Any) -> PixelRecipe | None:
    """The :class:`PixelRecipe` of a transformers image processor (its ``size``,
    ``crop_size``, ``resample``, ``rescale_factor``, ``image_mean``, ``image_std``), or None
    when it asks for something :func:`device_pixels` does not reproduce (no resize or no crop,
    padding, a longest-edge resize, a filter other than bicubic or bilinear)."""
    size = _size_dict(getattr(processor, "size", None))
    crop = _size_dict(getattr(processor, "crop_size", None))
    resample = getattr(processor, "resample", None)
    interpolation = _INTERPOLATION.get(int(resample)) if resample is not None else None
    normalize = bool(getattr(processor, "do_normalize", True))
    mean = _rgb_triple(getattr(processor, "image_mean", None))
    std = _rgb_triple(getattr(processor, "image_std", None))
    shortest = size.get("shortest_edge")
    exact = (size.get("height"), size.get("width"))
    if (not getattr(processor, "do_resize", True) or not getattr(processor, "do_center_crop", True)
            or getattr(processor, "do_pad", None) or interpolation is None
            or size.get("longest_edge") or not (shortest or all(exact))
            or not (crop.get("height") and crop.get("width"))
            or (normalize and (mean is None or std is None))):
        return None
    rescale = bool(getattr(processor, "do_rescale", True))
    return PixelRecipe(
        shortest_edge=int(shortest) if shortest else None,
        resize_to=None if shortest else (int(exact[0] or 0), int(exact[1] or 0)),
        crop=(int(crop["height"]), int(crop["width"])),
        interpolation=interpolation,  # type: ignore[arg-type]
        scale=float(getattr(processor, "rescale_factor", 1 / 255)) if rescale else 1.0,
        mean=mean if normalize and mean else (0.0, 0.0, 0.0),
        std=std if normalize and std else (1.0, 1.0, 1.0), crop_offset="floor")


def recipe_from_transform(transform: Any) -> PixelRecipe | None:
    """The :class:`PixelRecipe` of an open_clip preprocess (a torchvision ``Compose`` of
    ``Resize`` to the shortest side, ``CenterCrop``, an RGB conversion, ``ToTensor`` and
    ``Normalize``), or None for any other transform (a keep-ratio or longest-side resize,
    padding, another filter), which is then run image by image as before."""
    steps = list(getattr(transform, "transforms", None) or [])
    names = [type(step).__name__ for step in steps]
    known = ["Resize", "CenterCrop", "ToTensor", "Normalize"]
    others = [step for name, step in zip(names, steps, strict=True) if name not in known]
    if ([name for name in names if name in known] != known
            or any("rgb" not in getattr(step, "__name__", "").lower() for step in others)):
        return None
    resize, crop, normalize = (steps[names.index(name)]
                               for name in ("Resize", "CenterCrop", "Normalize"))
    mode = str(getattr(resize.interpolation, "value", resize.interpolation)).lower()
    size = list(resize.size) if isinstance(resize.size, (list, tuple)) else [resize.size]
    crop_size = list(crop.size) if isinstance(crop.size, (list, tuple)) else [crop.size]
    mean, std = _rgb_triple(list(normalize.mean)), _rgb_triple(list(normalize.std))
    if (mode not in ("bicubic", "bilinear") or getattr(resize, "max_size", None)
            or mean is None or std is None or len(size) not in (1, 2)
            or len(crop_size) not in (1, 2)):
        return None
    return PixelRecipe(
        shortest_edge=int(size[0]) if len(size) == 1 else None,
        resize_to=(int(size[0]), int(size[1])) if len(size) == 2 else None,
        crop=(int(crop_size[0]), int(crop_size[-1])),
        interpolation=mode,  # type: ignore[arg-type]
        scale=1 / 255, mean=mean, std=std, crop_offset="round")


def _to_device(tensor: Any, device: str, pinned: bool) -> Any:
    """A small host tensor on ``device`` without waiting for the device: a plain copy from
    pageable memory would make the host wait for the queued work, losing the overlap."""
    return tensor.pin_memory().to(device, non_blocking=True) if pinned else tensor.to(device)


def device_pixels(images: Sequence[np.ndarray], recipe: PixelRecipe, device: str,
                  dtype: Any = None) -> Any:
    """The model input of ``images`` (uint8 RGB, any sizes) as a float tensor (N, 3, h, w) on
    ``device``, in input order, made by ``recipe``.

    Images of one shape are stacked into one host tensor (page-locked on CUDA, so the copy
    is asynchronous and the host can go on to the next batch) and copied to the device in one
    transfer; resize (antialiased, as PIL's filters are), crop and normalisation run there.
    torch's antialiased bicubic uses PIL's kernel (a = -0.5), so the pixels match the
    processor's to about one grey level.
    """
    import torch

    arrays = [_rgb(image) for image in images]
    pinned = torch.device(device).type == "cuda"
    groups: dict[tuple[int, int], list[int]] = {}
    for index, array in enumerate(arrays):
        groups.setdefault((array.shape[0], array.shape[1]), []).append(index)
    parts, order = [], []
    for (height, width), indices in groups.items():
        host = torch.empty((len(indices), height, width, 3), dtype=torch.uint8,
                           pin_memory=pinned)
        np.stack([arrays[i] for i in indices], out=host.numpy())
        batch = host.to(device, non_blocking=pinned).permute(0, 3, 1, 2)
        batch = batch.to(torch.float32, memory_format=torch.contiguous_format)
        out_h, out_w = recipe.resized_size(height, width)
        # PIL resizes in two passes, width then height, and stores the first pass as uint8;
        # rounding and clipping in between as it does keeps bicubic overshoot on sharp edges
        # (a cartoon's outline, noise) within a grey level or two of PIL instead of ten or more.
        for size in ((height, out_w), (out_h, out_w)):
            if tuple(batch.shape[2:]) != size:
                batch = torch.nn.functional.interpolate(
                    batch, size=size, mode=recipe.interpolation, align_corners=False,
                    antialias=True).round_().clamp_(0, 255)
        crop_h, crop_w = recipe.crop
        if crop_h > out_h or crop_w > out_w:
            raise ValueError(f"an image of {height}x{width} px resizes to {out_h}x{out_w}, "
                             f"smaller than the {crop_h}x{crop_w} crop; this processor pads, "
                             "which the device path does not reproduce")
        if recipe.crop_offset == "floor":
            top, left = (out_h - crop_h) // 2, (out_w - crop_w) // 2
        else:
            top, left = round((out_h - crop_h) / 2.0), round((out_w - crop_w) / 2.0)
        parts.append(batch[:, :, top:top + crop_h, left:left + crop_w])
        order.extend(indices)
    pixels = parts[0] if len(parts) == 1 else torch.cat(parts)
    if order != sorted(order):
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        pixels = pixels.index_select(0, _to_device(inverse, device, pinned))
    mean = _to_device(torch.tensor(recipe.mean, dtype=torch.float32).view(1, 3, 1, 1), device,
                      pinned)
    std = _to_device(torch.tensor(recipe.std, dtype=torch.float32).view(1, 3, 1, 1), device,
                     pinned)
    pixels = (pixels * recipe.scale - mean) / std
    return pixels if dtype is None else pixels.to(dtype)


class _OpenClipEncoder:
    """open_clip: ``create_model_and_transforms(model, pretrained=...)`` and its tokenizer."""

    def __init__(self, params: ClipRefusalParams) -> None:
        _require(["torch", "open_clip", "torchvision"], "open_clip",
                 " (open_clip needs torchvision; backend transformers does not)")
        import open_clip
        import torch

        self._torch = torch
        self.device = _device(params.device)
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                params.model, pretrained=params.pretrained, device=self.device)
            self._tokenizer = open_clip.get_tokenizer(params.model)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"open_clip could not load {params.model!r} with pretrained="
                f"{params.pretrained!r}{_offline_note()}: {exc}",
                "download the weights once on a machine with network (they land in the "
                "Hugging Face cache), or set evaluate.clip.pretrained to a local checkpoint "
                "file (.pt/.bin/.safetensors) of that architecture",
            ) from exc
        self._model = model.eval()
        self._preprocess = preprocess
        self._recipe = recipe_from_transform(preprocess)
        self._dtype = next(iter(model.parameters())).dtype

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        tokens = self._tokenizer(list(texts)).to(self.device)
        with self._torch.inference_mode():
            return _unit_rows(self._model.encode_text(tokens))

    def image_features(self, images: Sequence[np.ndarray], via_processor: bool = False) -> Any:
        if self._recipe is not None and not via_processor:
            pixels = device_pixels(images, self._recipe, self.device, self._dtype)
        else:
            pixels = self._torch.stack([self._preprocess(_pil(image)) for image in images])
            pixels = pixels.to(self.device, self._dtype)
        with self._torch.inference_mode():
            return _unit_tensor_rows(self._model.encode_image(pixels))


def _projected(output: Any) -> Any:
    """transformers 4 returns the projected embedding; 5 returns it as ``pooler_output``."""
    return output if hasattr(output, "detach") else output.pooler_output


class _TransformersEncoder:
    """transformers: ``CLIPModel``, its tokenizer and its (PIL) image processor."""

    def __init__(self, params: ClipRefusalParams) -> None:
        _require(["torch", "transformers"], "transformers")
        import torch
        import transformers
        from transformers import AutoTokenizer, CLIPModel

        self._torch = torch
        self.device = _device(params.device)
        # transformers 5 makes the torchvision-backed processor by default; the PIL one gives
        # the same pixels without torchvision (in transformers 4 the plain class is PIL-based).
        processor_class = getattr(transformers, "CLIPImageProcessorPil", None)
        if processor_class is None:
            processor_class = transformers.CLIPImageProcessor
        pinned: dict[str, Any] = {"revision": params.revision} if params.revision else {}
        try:
            # Auto* classes raise on missing files; a concrete tokenizer class offline may
            # silently build a two-token vocabulary instead.
            self._tokenizer = AutoTokenizer.from_pretrained(params.model, **pinned)
            self._processor = processor_class.from_pretrained(params.model, **pinned)
            model: Any = CLIPModel.from_pretrained(params.model, **pinned)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"transformers could not load the CLIP model {params.model!r}"
                f"{f' at revision {params.revision!r}' if params.revision else ''}"
                f"{_offline_note()}: {exc}",
                "download it once with network (`huggingface-cli download "
                f"{params.model}`) and run with HF_HUB_OFFLINE=1, or set evaluate.clip.model "
                "to a local folder holding config.json, the weights, the tokenizer files and "
                "preprocessor_config.json",
            ) from exc
        if len(self._tokenizer) < 3:
            raise ConfigError(f"the tokenizer of {params.model!r} has {len(self._tokenizer)} "
                              "tokens: its vocabulary files are missing",
                              "give evaluate.clip.model a folder with the tokenizer files")
        self._model: Any = model.to(self.device).eval()
        self._recipe = recipe_from_processor(self._processor)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        tokens = self._tokenizer(list(texts), padding=True, truncation=True,
                                 return_tensors="pt").to(self.device)
        with self._torch.inference_mode():
            return _unit_rows(_projected(self._model.get_text_features(**tokens)))

    def image_features(self, images: Sequence[np.ndarray], via_processor: bool = False) -> Any:
        if self._recipe is not None and not via_processor:
            pixels = device_pixels(images, self._recipe, self.device, self._model.dtype)
        else:
            pixels = self._processor(images=[_pil(image) for image in images],
                                     return_tensors="pt")["pixel_values"]
            pixels = pixels.to(self.device, self._model.dtype)
        with self._torch.inference_mode():
            features = self._model.get_image_features(pixel_values=pixels)
            return _unit_tensor_rows(_projected(features))


class ClipRefusalChecker:
    """Scores images by their highest CLIP cosine similarity to a refusal template.

    Built from ``evaluate.clip`` (:class:`acrb.config.ClipRefusalParams`) and the project root
    (against which a relative template path is read). The template file is read now, so a bad
    file stops the stage before any work; the model is loaded on the first :meth:`scores` call,
    and the template embeddings are computed once then.
    """

    def __init__(self, params: ClipRefusalParams, root: Path) -> None:
        self.params = params
        self.templates = load_templates(resolve_templates_path(params.templates, root))
        self._encoder: _Encoder | None = None
        self._text: np.ndarray | None = None

    @property
    def threshold(self) -> float:
        return self.params.threshold

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (it is only when there were images to score)."""
        return self._encoder is not None

    def identity(self) -> dict[str, Any]:
        """What determines a score and a flag, for the evaluator hash: backend, model, weights,
        revision, the templates' name, version and digest, and the threshold."""
        p = self.params
        return {
            "backend": p.backend, "model": p.model,
            "pretrained": p.pretrained if p.backend == "open_clip" else None,
            "revision": p.revision, "templates": self.templates.name,
            "templates_version": self.templates.version,
            "templates_digest": self.templates.digest, "threshold": p.threshold,
        }

    def _load(self) -> tuple[_Encoder, np.ndarray]:
        if self._encoder is None or self._text is None:
            import torch

            torch.manual_seed(0)
            encoder: _Encoder = (_OpenClipEncoder(self.params) if self.params.backend == "open_clip"
                                 else _TransformersEncoder(self.params))
            self._text = encoder.encode_texts(self.templates.texts)
            self._encoder = encoder
        return self._encoder, self._text

    def scores(self, images: Sequence[np.ndarray], *, via_processor: bool = False
               ) -> np.ndarray:
        """Highest cosine similarity (-1..1) of each uint8 RGB image to any template, float64,
        computed ``batch_size`` images per forward pass; empty input loads nothing.

        Pixels are prepared on the model's device (:func:`device_pixels`) and nothing is
        read back until the last batch is queued, so staging a batch overlaps the device's
        work on the one before. ``via_processor`` runs the library's own per-image (PIL)
        preprocessing instead: slower, kept to check the device path against it.
        """
        if len(images) == 0:
            return np.zeros(0, dtype=np.float64)
        encoder, text = self._load()
        import torch

        templates = torch.from_numpy(text.astype(np.float32)).to(encoder.device)
        size = self.params.batch_size
        best = [(encoder.image_features(images[start:start + size], via_processor)
                 @ templates.T).amax(dim=1) for start in range(0, len(images), size)]
        return np.asarray(torch.cat(best).double().cpu().numpy(), dtype=np.float64)

    def flags(self, scores: np.ndarray) -> np.ndarray:
        """``scores >= threshold``: the outputs the CLIP layer calls refusals."""
        return np.asarray(scores >= self.threshold, dtype=bool)
