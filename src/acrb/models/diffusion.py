"""What every open-weights diffusers adapter shares: config, loading, seeding, batching, OOM.

An adapter (:mod:`acrb.models.qwen_image_edit`, :mod:`acrb.models.flux2`, ...) names its
diffusers pipeline class and says how one batch of requests becomes the keyword arguments of
one pipeline call; everything else is here:

* :class:`DiffusersConfig`, the typed config (unknown keys rejected): where the weights are
  (``hub_id``), in which dtype on which device, the sampling settings, and the memory options
  of the diffusers memory guide (model or sequential CPU offload, attention slicing, VAE
  tiling, on-the-fly quantization through :class:`diffusers.PipelineQuantizationConfig`);
* loading, once per process: pipelines are cached by class, weights, revision, dtype, device
  and memory options, and loaded on the first request, never when a config is validated (the
  plan stage validates configs without a GPU);
* one :class:`torch.Generator` per request, seeded with the request's seed on the pipeline's
  device, so an output depends on its own seed and not on its neighbours in a batch (the
  reproducibility recipe of the diffusers docs, "Reproducible pipelines");
* :func:`run_in_batches`: ``batch_size`` requests per pipeline call where the pipeline takes
  lists; on CUDA out-of-memory the cache is emptied and the batch halved and retried, down to
  one request, whose outcome is then an ``error`` naming the memory options to try;
* per request, the seconds (the call's time over its size) and the peak GPU memory of the
  call (MiB; None on CPU).

torch and diffusers are imported inside functions, so that importing this module (the plan
stage does, to validate configs) costs nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import Field, field_validator

from acrb.errors import ConfigError
from acrb.models.base import (
    Editor,
    EditRequest,
    GenerationRequest,
    Generator,
    ImageModel,
    ModelConfig,
    Outcome,
)

if TYPE_CHECKING:
    import torch

Request = TypeVar("Request", EditRequest, GenerationRequest)

DType = Literal["float32", "float16", "bfloat16"]
CpuOffload = Literal["none", "model", "sequential"]
#: On-the-fly quantization of the big components (diffusers' ``PipelineQuantizationConfig``):
#: bitsandbytes NF4 or LLM.int8(), or torchao int8 weight-only.
Quantization = Literal["none", "bitsandbytes-4bit", "bitsandbytes-8bit", "torchao-int8wo"]

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
#: The package each quantization option needs, and the pip command that installs it.
_QUANT_PACKAGE = {
    "bitsandbytes-4bit": ("bitsandbytes", "pip install bitsandbytes"),
    "bitsandbytes-8bit": ("bitsandbytes", "pip install bitsandbytes"),
    "torchao-int8wo": ("torchao", "pip install torchao"),
}
#: The memory options to suggest when even one request does not fit.
MEMORY_HINT = ("try config.cpu_offload: model (or sequential), config.vae_tiling: true, "
               "config.attention_slicing: true, config.quantization: bitsandbytes-4bit, a "
               "smaller width/height, or dtype bfloat16")


class DiffusersConfig(ModelConfig):
    """The config every diffusers adapter takes (``models.<name>.config``); an adapter adds the
    pipeline's own guidance knobs in its subclass."""

    hub_id: str = Field(description="Hugging Face repo id, or a local folder written by "
                        "save_pretrained (the pinned revision is then recorded, not passed)")
    dtype: DType = Field(default="bfloat16", description="weights and compute dtype")
    device: str = Field(default="auto", description="auto (cuda if available, else cpu), cpu, "
                        "cuda or cuda:N")
    steps: int = Field(ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(
        default=None, description="guidance_scale of the pipeline (None: the pipeline default)")
    width: int | None = Field(default=None, ge=16, description="output width in pixels (None: "
                              "the pipeline's default or the source image's)")
    height: int | None = Field(default=None, ge=16, description="output height in pixels")
    batch_size: int = Field(default=1, ge=1, description="requests per pipeline call (where "
                            "the pipeline takes lists; halved on CUDA out-of-memory)")
    cpu_offload: CpuOffload = Field(
        default="none", description="none; model (whole components moved to the GPU when "
        "used); sequential (submodules streamed, slowest, least memory)")
    attention_slicing: bool = Field(default=False, description="compute attention in slices")
    vae_tiling: bool = Field(default=False, description="decode the VAE in tiles")
    quantization: Quantization = Field(
        default="none", description="quantize the big components on load (needs bitsandbytes "
        "or torchao)")
    local_files_only: bool = Field(default=False, description="never contact the hub")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device {value!r} is not auto, cpu, cuda or cuda:N")
        return value


def resolve_device(config: DiffusersConfig) -> str:
    """The torch device the pipeline computes on: ``config.device``, with ``auto`` meaning the
    first CUDA device when there is one, else the CPU."""
    import torch

    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"config.device is {config.device!r}, but torch sees no CUDA device",
                          "set config.device: cpu (slow), or run on a machine with a GPU")
    return config.device


def is_local(hub_id: str) -> bool:
    """True when ``hub_id`` names a folder here rather than a hub repository."""
    return Path(hub_id).expanduser().is_dir()


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def quantization_config(config: DiffusersConfig, components: Sequence[str]) -> Any:
    """The ``PipelineQuantizationConfig`` for ``config.quantization`` over ``components``, or
    None. Raises a ConfigError naming the pip command when the backend is not installed."""
    if config.quantization == "none":
        return None
    package, command = _QUANT_PACKAGE[config.quantization]
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"config.quantization is {config.quantization!r}, which needs "
                          f"{package}, and it is not installed", command)
    from diffusers import PipelineQuantizationConfig

    kwargs: dict[str, Any]
    if config.quantization == "bitsandbytes-4bit":
        backend = "bitsandbytes_4bit"
        kwargs = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                  "bnb_4bit_compute_dtype": torch_dtype(config.dtype)}
    elif config.quantization == "bitsandbytes-8bit":
        backend, kwargs = "bitsandbytes_8bit", {"load_in_8bit": True}
    else:
        backend, kwargs = "torchao", {"quant_type": "int8wo"}
    return PipelineQuantizationConfig(quant_backend=backend, quant_kwargs=kwargs,
                                      components_to_quantize=list(components))


_PIPELINES: dict[tuple[Any, ...], Any] = {}
_PIPELINES_LOCK = threading.Lock()


def load_pipeline(pipeline_class: str, config: DiffusersConfig, revision: str,
                  quantized_components: Sequence[str] = ()) -> Any:
    """The diffusers pipeline ``pipeline_class`` for ``config``, loaded once per process.

    The revision pinned in params is passed to ``from_pretrained`` for a hub id; a local folder
    has no revisions, so it is only recorded. The cache key holds everything that changes the
    loaded object.
    """
    device = resolve_device(config)
    key = _cache_key(pipeline_class, config, revision, device)
    with _PIPELINES_LOCK:
        if key not in _PIPELINES:
            _PIPELINES[key] = _load(pipeline_class, config, revision, device,
                                    quantized_components)
        return _PIPELINES[key]


def _cache_key(pipeline_class: str, config: DiffusersConfig, revision: str,
               device: str) -> tuple[Any, ...]:
    return (pipeline_class, config.hub_id, revision, config.dtype, device, config.cpu_offload,
            config.attention_slicing, config.vae_tiling, config.quantization,
            config.local_files_only)


def preload_pipeline(pipeline: Any, pipeline_class: str, config: DiffusersConfig,
                     revision: str) -> None:
    """Put a pipeline built in memory where :func:`load_pipeline` finds it for ``config``.

    For measurements of the harness (benchmarks/harness_overhead.py builds a full-size model
    with random weights instead of downloading one); everything after loading runs as usual.
    """
    pipeline.set_progress_bar_config(disable=True)
    with _PIPELINES_LOCK:
        _PIPELINES[_cache_key(pipeline_class, config, revision, resolve_device(config))] = pipeline


def forget_pipelines() -> None:
    """Drop every cached pipeline (tests; or to free memory between models)."""
    with _PIPELINES_LOCK:
        _PIPELINES.clear()


def _load(pipeline_class: str, config: DiffusersConfig, revision: str, device: str,
          quantized_components: Sequence[str]) -> Any:
    import diffusers

    if device == "cpu" and config.cpu_offload != "none":
        raise ConfigError(f"config.cpu_offload is {config.cpu_offload!r}, but the pipeline "
                          "runs on the CPU", "set config.cpu_offload: none, or use a GPU")
    cls = getattr(diffusers, pipeline_class)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(config.dtype),
                              "local_files_only": config.local_files_only}
    if not is_local(config.hub_id):
        kwargs["revision"] = revision
    quantization = quantization_config(config, quantized_components)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    try:
        pipe = cls.from_pretrained(config.hub_id, **kwargs)
    except OSError as exc:
        raise ConfigError(
            f"could not load {pipeline_class} from {config.hub_id!r} at revision {revision!r}: "
            f"{exc}",
            "check config.hub_id and models.<name>.revision; download the weights first "
            "(huggingface-cli download, after accepting the model's licence) or point hub_id at "
            "a local folder",
        ) from exc
    if config.cpu_offload == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif config.cpu_offload == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:
        pipe.to(device)
    if config.attention_slicing:
        pipe.enable_attention_slicing()
    if config.vae_tiling and getattr(pipe, "vae", None) is not None:
        pipe.vae.enable_tiling()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def seeded_generators(seeds: Sequence[int], device: str) -> list[torch.Generator]:
    """One generator per request, each seeded with its own seed, on ``device``."""
    import torch

    return [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]


def to_rgb_array(image: Any) -> np.ndarray:
    """A pipeline's PIL output as an RGB uint8 array (height, width, 3)."""
    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()


def to_pil(pixels: np.ndarray, size: tuple[int, int] | None = None) -> Any:
    """An RGB uint8 array as a PIL image, resized to ``size`` (width, height) when given."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), mode="RGB")
    if size is not None and image.size != size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def run_in_batches(items: Sequence[Request], batch_size: int,
                   call: Callable[[Sequence[Request]], list[Outcome]], device: str,
                   on_shrink: Callable[[int], None] | None = None) -> list[Outcome]:
    """Outcomes of ``items`` computed ``batch_size`` at a time by ``call``.

    ``call`` runs one pipeline call for a batch and returns one outcome per item (without
    timing). On ``torch.cuda.OutOfMemoryError`` the CUDA cache is emptied and the batch is split
    in halves, each retried; the smaller size is kept for the rest of ``items`` (and reported
    through ``on_shrink``). A single item that does not fit becomes an ``error`` outcome naming
    the memory options to try. Each outcome gets the seconds of its call divided by the call's
    size and, on CUDA, the call's peak allocated memory in MiB.
    """
    import torch

    outcomes: list[Outcome] = []
    size = max(1, batch_size)
    start = 0
    while start < len(items):
        batch = items[start : start + size]
        try:
            outcomes.extend(_timed_call(call, batch, device))
        except torch.cuda.OutOfMemoryError as exc:
            _free_cuda(device)
            if len(batch) == 1:
                outcomes.append(Outcome(
                    status="error",
                    message=f"CUDA out of memory for one request ({exc}); {MEMORY_HINT}"[:2000]))
            else:
                size = max(1, len(batch) // 2)
                if on_shrink is not None:
                    on_shrink(size)
                continue  # retry the same items with the halved size
        start += len(batch)
    return outcomes


def _free_cuda(device: str) -> None:
    import torch

    if _is_cuda(device) and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _timed_call(call: Callable[[Sequence[Request]], list[Outcome]], batch: Sequence[Request],
                device: str) -> list[Outcome]:
    import torch

    measure_memory = _is_cuda(device) and torch.cuda.is_available()
    if measure_memory:
        torch.cuda.reset_peak_memory_stats(device)
    tick = time.perf_counter()
    results = call(batch)
    if measure_memory:
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - tick) / len(batch)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if measure_memory else None
    if len(results) != len(batch):
        raise RuntimeError(f"the pipeline returned {len(results)} outcomes for {len(batch)} "
                           "requests")
    return [Outcome(status=r.status, image=r.image, refusal_kind=r.refusal_kind,
                    message=r.message, refusal_code=r.refusal_code, seconds=seconds,
                    peak_gpu_memory_mb=peak, cost_usd=r.cost_usd) for r in results]


@functools.cache
def _version(package: str) -> str | None:
    """The installed version of ``package``, looked up once per process: each lookup scans
    every distribution on the path, which on a machine with many packages costs tens of
    milliseconds, and every generate worker asks."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class DiffusersModel(ImageModel):
    """Shared behaviour of the diffusers adapters (mixed before :class:`Editor` or
    :class:`Generator`).

    A subclass sets :attr:`pipeline_class` (the name in ``diffusers``), optionally
    :attr:`max_batch` (1 where one call cannot take several requests) and
    :attr:`quantized_components`, and implements :meth:`call_kwargs` (the pipeline arguments of
    one batch, without ``generator``). :meth:`outcomes` turns the pipeline output into one
    outcome per request (override it where the pipeline reports a safety filter).
    """

    Config: ClassVar[type[ModelConfig]] = DiffusersConfig
    pipeline_class: ClassVar[str]
    #: Requests one pipeline call can take (None: as many as ``config.batch_size``).
    max_batch: ClassVar[int | None] = None
    #: The components quantized when ``config.quantization`` is set.
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer",)

    def __init__(self, key: str, config: ModelConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        self._pipeline: Any | None = None
        self._batch_limit: int | None = None

    @property
    def settings(self) -> DiffusersConfig:
        assert isinstance(self.config, DiffusersConfig)
        return self.config

    @property
    def pipeline(self) -> Any:
        """The loaded pipeline (loaded on first use, shared across instances)."""
        if self._pipeline is None:
            self._pipeline = load_pipeline(self.pipeline_class, self.settings, self.revision,
                                           self.quantized_components)
        return self._pipeline

    def load(self) -> Any:
        """Load the pipeline now (if it is not loaded yet) and return it."""
        return self.pipeline

    def use_pipeline(self, pipeline: Any) -> None:
        """Call ``pipeline`` instead of loading one (tests pass a stand-in)."""
        self._pipeline = pipeline

    @property
    def device(self) -> str:
        """Where generators are seeded: the pipeline's execution device (the GPU even when
        components are offloaded), else the configured one."""
        execution = getattr(self._pipeline, "_execution_device", None)
        if execution is not None and hasattr(execution, "type"):
            return str(execution)
        return resolve_device(self.settings)

    def batch_size(self) -> int:
        """Requests per call: the config's, capped by the pipeline and by earlier OOMs."""
        size = self.settings.batch_size
        if self.max_batch is not None:
            size = min(size, self.max_batch)
        if self._batch_limit is not None:
            size = min(size, self._batch_limit)
        return size

    def _shrink(self, size: int) -> None:
        self._batch_limit = size

    def common_kwargs(self) -> dict[str, Any]:
        """Sampling arguments every pipeline takes: steps, guidance, resolution."""
        cfg = self.settings
        kwargs: dict[str, Any] = {"num_inference_steps": cfg.steps}
        if cfg.guidance_scale is not None:
            kwargs["guidance_scale"] = cfg.guidance_scale
        if cfg.width is not None:
            kwargs["width"] = cfg.width
        if cfg.height is not None:
            kwargs["height"] = cfg.height
        return kwargs

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        """The pipeline's keyword arguments for ``batch`` (no ``generator``)."""
        raise NotImplementedError

    def outcomes(self, output: Any, batch: Sequence[Any]) -> list[Outcome]:
        """One outcome per request of ``batch`` from the pipeline's ``output``."""
        return [Outcome(status="ok", image=to_rgb_array(image)) for image in output.images]

    def _call(self, batch: Sequence[Any]) -> list[Outcome]:
        pipe = self.pipeline
        generators = seeded_generators([request.seed for request in batch], self.device)
        output = pipe(**self.call_kwargs(batch), generator=generators, output_type="pil")
        return self.outcomes(output, batch)

    def _run(self, requests: Sequence[Any]) -> list[Outcome]:
        if not requests:
            return []
        self.load()  # before timing, so that the first batch is not charged for the loading
        return run_in_batches(list(requests), self.batch_size(), self._call, self.device,
                              on_shrink=self._shrink)

    def library_versions(self) -> dict[str, Any]:
        """torch, diffusers, transformers and accelerate versions, and the device's name."""
        import torch

        device = self.device
        if _is_cuda(device) and torch.cuda.is_available():
            name = torch.cuda.get_device_name(torch.device(device))
        else:
            name = "cpu"
        return {"torch": torch.__version__, "diffusers": _version("diffusers"),
                "transformers": _version("transformers"), "accelerate": _version("accelerate"),
                "device": name}


class DiffusersEditor(DiffusersModel, Editor):
    """An image editor run through a diffusers pipeline."""

    def edit(self, requests: Sequence[EditRequest]) -> list[Outcome]:
        return self._run(requests)

    def source_size(self) -> tuple[int, int] | None:
        """(width, height) to resize sources to, when the config sets both; else None."""
        cfg = self.settings
        if cfg.width is not None and cfg.height is not None:
            return (cfg.width, cfg.height)
        return None


class DiffusersGenerator(DiffusersModel, Generator):
    """A text-to-image generator run through a diffusers pipeline."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        return self._run(requests)

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        return {"prompt": [request.prompt for request in batch], **self.common_kwargs()}
