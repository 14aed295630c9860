"""Step1X-Edit-v1p2 (StepFun), the study's third editor, through its authors' diffusers pipeline.

Why this runner and no other (the evidence and the commands are in ``docs/step1x.md``):

* No diffusers release has Step1X-Edit: 0.42.1 has nothing named Step1X, and the pull request
  that adds the v1p1 pipeline (huggingface/diffusers#12249) is not merged.
* DiffSynth-Studio (``diffsynth`` 2.1.12 on PyPI) runs Step1X-Edit v1.0 only (the single-file
  ``step1x-edit-i1258.safetensors`` through ``FluxImagePipeline(step1x_reference_image=...)``).
  v1p2 is another architecture (new text conditioning, thinking and reflection modes), so it
  cannot run the model under audit.
* The model's authors run v1p2 with ``Step1XEditPipelineV1P2`` from their fork of diffusers
  (branch ``step1xedit_v1p2``, which reports version 0.36.0.dev0), tested with
  ``transformers==4.55.0``. The fork is not on PyPI and replaces diffusers, so it lives in an
  environment of its own, beside but not inside the one that runs the other editors.

So this adapter looks ``Step1XEditPipelineV1P2`` up in the installed ``diffusers`` when it is
built, and stops with a :class:`~acrb.errors.ConfigError` naming the exact install when it is not
there. Nothing heavy is imported at module import: ACRB works, and lists this key, without the
fork, torch or diffusers.

Each request gets its own CPU ``torch.Generator`` seeded with the request's seed, so an output
depends on its request alone (not on the batch, the order, or the GPU that drew the noise). The
model is loaded once per process and shared by every editor instance with the same weights and
load options. Settings that change the pixels (steps, guidance, resolution, dtype, the thinking
and reflection modes, RegionE) are part of :meth:`Step1XEdit.resolve_revision`, hence of every
request id; where the weights are loaded from, the device and CPU offload are not.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from acrb.errors import ConfigError
from acrb.models.base import Editor, EditorConfig, EditOutcome, EditRequest, RecordedSeconds
from acrb.storage import content_hash

#: The pipeline class, as the authors' diffusers fork exports it.
PIPELINE_CLASS = "Step1XEditPipelineV1P2"
#: Where that class lives: the authors' fork of diffusers, on its v1p2 branch.
FORK_REQUIREMENT = (
    "diffusers @ git+https://github.com/Peyton-Chen/diffusers.git@step1xedit_v1p2")
#: The transformers release the model's authors tested v1p2 with.
TRANSFORMERS_REQUIREMENT = "transformers==4.55.0"
#: The one-line install of a Step1X environment (pin the fork's commit for an audit).
INSTALL_COMMAND = (f'pip install -e . "{FORK_REQUIREMENT}" "{TRANSFORMERS_REQUIREMENT}" '
                   '"accelerate>=0.30" "torch>=2.2,<=2.14.1"')
#: RegionE, the training-free speed-up (PyPI ``regione``; imported as ``RegionE``).
REGIONE_REQUIREMENT = "regione==0.1.0"
#: Its own requirements pin some fifty exact versions (transformers 4.55.4, triton 3.1.0, ...),
#: which would overwrite the Step1X environment: install it without them.
REGIONE_INSTALL_COMMAND = f"pip install --no-deps {REGIONE_REQUIREMENT}"
#: RegionE's helper accepts exactly this many denoising steps.
REGIONE_STEPS = 28

#: Config fields that do not change the pixels: left out of the revision, so moving the weights
#: to another folder or turning offload on does not make every request new.
_OUTPUT_NEUTRAL = frozenset({"model", "device", "cpu_offload"})


class Step1XEditConfig(EditorConfig):
    """How Step1X-Edit-v1p2 is loaded and called (names follow the pipeline's arguments)."""

    model: str = Field(
        default="stepfun-ai/Step1X-Edit-v1p2",
        description="hub repository id (loaded at the pinned revision, from the local cache "
        "when HF_HUB_OFFLINE=1) or a local folder of the diffusers-format weights",
    )
    device: str = Field(default="cuda", description="torch device the model runs on")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="weights and activations; the authors use bfloat16")
    steps: int = Field(default=28, ge=1, le=200,
                       description="denoising steps (num_inference_steps; RegionE needs 28)")
    true_cfg_scale: float = Field(default=6.0, ge=1.0, le=20.0,
                                  description="classifier-free guidance scale (1 turns it off)")
    guidance_scale: float = Field(default=6.0, ge=0.0, le=20.0,
                                  description="the pipeline's guidance_scale argument")
    size_level: int = Field(
        default=1024, ge=256, le=2048,
        description="working resolution: the source is resized to about size_level² pixels at "
        "its aspect ratio; the output is returned at the source's size",
    )
    thinking: bool = Field(default=False,
                           description="thinking mode: the MLLM rewrites the instruction first")
    reflection: bool = Field(
        default=False,
        description="reflection mode: the MLLM judges each output and retries (up to 3 edits)")
    cpu_offload: Literal["none", "model", "sequential"] = Field(
        default="none",
        description="diffusers CPU offload: 'model' moves whole components to the GPU in turn, "
        "'sequential' single layers (least memory, slowest)",
    )
    regione: bool = Field(
        default=False,
        description=f"RegionE speed-up ({REGIONE_REQUIREMENT}; CUDA only, {REGIONE_STEPS} "
        "steps); it approximates the pipeline, so it is part of the revision",
    )

    @model_validator(mode="after")
    def _regione_limits(self) -> Step1XEditConfig:
        if self.regione and self.steps != REGIONE_STEPS:
            raise ValueError(f"regione runs exactly {REGIONE_STEPS} steps (its helper asserts "
                             f"it); set steps: {REGIONE_STEPS} or regione: false")
        if self.regione and not self.device.startswith("cuda"):
            raise ValueError("regione needs a CUDA device (its kernels are written in triton); "
                             "set device: cuda or regione: false")
        return self

    def output_settings(self) -> dict[str, Any]:
        """The settings that change the pixels (what the revision hashes)."""
        return self.model_dump(mode="json", exclude=set(_OUTPUT_NEUTRAL))


def _install_fix() -> str:
    return (
        "Step1X-Edit-v1p2 runs only through its authors' diffusers fork (branch step1xedit_v1p2, "
        "version 0.36.0.dev0), tested with transformers 4.55.0: no diffusers release has it, and "
        "diffsynth 2.1.12 runs only Step1X-Edit v1.0. The fork replaces diffusers, so give it an "
        f"environment of its own: python -m venv .venv-step1x && .venv-step1x/bin/{INSTALL_COMMAND}"
        " (pin the fork to the commit you audit with, e.g. ...diffusers.git@<commit>; see "
        "docs/step1x.md)"
    )


def pipeline_class() -> type[Any]:
    """``Step1XEditPipelineV1P2`` from the installed diffusers; a ConfigError naming the install
    when diffusers is missing, is a release without it, or cannot import it."""
    try:
        diffusers = importlib.import_module("diffusers")
    except Exception as exc:  # an ImportError, or a broken install failing on import
        raise ConfigError(
            f"Step1X-Edit-v1p2 needs {PIPELINE_CLASS} from diffusers, and diffusers cannot be "
            f"imported here ({type(exc).__name__}: {exc})",
            _install_fix(),
        ) from exc
    version = getattr(diffusers, "__version__", "unknown")
    try:
        found = getattr(diffusers, PIPELINE_CLASS, None)
    except Exception as exc:  # diffusers imports pipelines lazily: the fork's own imports fail here
        raise ConfigError(
            f"diffusers {version} has {PIPELINE_CLASS} but cannot import it "
            f"({type(exc).__name__}: {exc})",
            f"check the Step1X environment against {TRANSFORMERS_REQUIREMENT}; "
            + _install_fix(),
        ) from exc
    if found is None:
        raise ConfigError(
            f"the installed diffusers {version} has no {PIPELINE_CLASS}, the pipeline of "
            "Step1X-Edit-v1p2",
            _install_fix(),
        )
    return found


def regione_helper_class() -> type[Any]:
    """``RegionE.RegionEHelper``; a ConfigError naming the install when it cannot be imported."""
    try:
        module = importlib.import_module("RegionE")
        helper: type[Any] = module.RegionEHelper
        return helper
    except Exception as exc:
        raise ConfigError(
            f"config.regione is on, but RegionE cannot be imported ({type(exc).__name__}: {exc})",
            f"in the Step1X environment: {REGIONE_INSTALL_COMMAND} (without its dependencies: "
            "they pin transformers 4.55.4, triton 3.1.0, numpy 2.1.2 and about fifty more exact "
            "versions), or set regione: false",
        ) from exc


def installed_version(distribution: str) -> str | None:
    """``distribution``'s version, with the commit appended when it was installed from a VCS
    URL (the fork reports 0.36.0.dev0 for every commit, so the version alone pins nothing)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        direct = {}
    commit = (direct.get("vcs_info") or {}).get("commit_id")
    return f"{version}+git.{commit}" if commit else version


# One pipeline per process and load key: Ray actors and repeated stage calls reuse it.
_PIPELINES: dict[tuple[Any, ...], Any] = {}
_PIPELINES_LOCK = threading.Lock()


def forget_pipelines() -> None:
    """Drop the loaded pipelines (frees their memory once nothing else holds them)."""
    with _PIPELINES_LOCK:
        _PIPELINES.clear()


class Step1XEdit(Editor):
    """Step1X-Edit-v1p2 on the authors' ``Step1XEditPipelineV1P2`` (see the module docstring).

    Building the editor checks that the pipeline (and RegionE, when asked for) can be imported,
    so a missing install stops the generate stage with its fix instead of recording an error per
    request; the weights load on the first non-empty :meth:`edit`.
    """

    Config: ClassVar[type[EditorConfig]] = Step1XEditConfig
    #: The pipeline edits one image per call.
    max_source_images: ClassVar[int] = 1
    #: The study's report of its run: about 50 s per edit on one A800 (80 GB).
    recorded_seconds: ClassVar[RecordedSeconds | None] = RecordedSeconds(
        seconds=50.0, hardware="1x NVIDIA A800 80GB", source="reported for the study's run")

    def __init__(self, key: str, config: EditorConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        assert isinstance(config, Step1XEditConfig)
        self.options: Step1XEditConfig = config
        self._pipeline_class = pipeline_class()
        if config.regione:
            regione_helper_class()

    @classmethod
    def resolve_revision(cls, key: str, config: EditorConfig, pinned_revision: str | None) -> str:
        # The pinned weights plus a hash of the settings that change the pixels: request ids
        # hash the revision and params' `settings`, never the adapter config, and every one of
        # these settings yields other images from the same weights.
        weights = super().resolve_revision(key, config, pinned_revision)
        assert isinstance(config, Step1XEditConfig)
        return f"{weights}+{content_hash(config.output_settings(), 12)}"

    @classmethod
    def output_config(cls, config: EditorConfig) -> dict[str, Any]:
        return {}  # the revision hashes the settings that change the pixels already

    # ---- loading ------------------------------------------------------------------------------

    def _load_key(self) -> tuple[Any, ...]:
        o = self.options
        return (self._pipeline_class, o.model, self.pinned_revision, o.dtype, o.device,
                o.cpu_offload, o.regione)

    def load(self) -> Any:
        """Load the pipeline now (the generate stage calls this before the first batch)."""
        return self.pipeline()

    def pipeline(self) -> Any:
        """The loaded pipeline (loaded on first use, then shared within the process)."""
        key = self._load_key()
        with _PIPELINES_LOCK:
            if key not in _PIPELINES:
                _PIPELINES[key] = self._load()
            return _PIPELINES[key]

    def _load(self) -> Any:
        import torch

        o = self.options
        if o.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                f"Step1X-Edit is configured for device {o.device!r}, but torch "
                f"{torch.__version__} sees no CUDA GPU",
                "run on a GPU machine (bfloat16 needs about 50 GB at 1024², 29 GB with "
                "cpu_offload: model), or set device: cpu (hours per edit)",
            )
        kwargs: dict[str, Any] = {"torch_dtype": getattr(torch, o.dtype)}
        if self.pinned_revision and not Path(o.model).exists():
            kwargs["revision"] = self.pinned_revision  # the hub snapshot the revision pins
        pipe = self._pipeline_class.from_pretrained(o.model, **kwargs)
        if o.cpu_offload == "model":
            pipe.enable_model_cpu_offload(device=o.device)
        elif o.cpu_offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=o.device)
        else:
            pipe = pipe.to(o.device)
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)  # the stage draws its own progress bar
        if o.regione:
            helper = regione_helper_class()(pipe)
            helper.set_params(num_inference_steps=REGIONE_STEPS)
            helper.enable()  # swaps the pipeline's class and attention processors in place
        return pipe

    # ---- editing ------------------------------------------------------------------------------

    def edit(self, requests: Sequence[EditRequest]) -> list[EditOutcome]:
        if not requests:
            return []
        pipe = self.pipeline()
        return [self._edit_one(pipe, request) for request in requests]

    def _edit_one(self, pipe: Any, request: EditRequest) -> EditOutcome:
        import torch
        from PIL import Image

        o = self.options
        source = Image.fromarray(np.ascontiguousarray(request.source_image, dtype=np.uint8))
        # A CPU generator per request: the noise depends on the seed alone, on any device.
        generator = torch.Generator(device="cpu").manual_seed(request.seed)
        try:
            output = pipe(
                image=source,
                prompt=request.instruction,
                num_inference_steps=o.steps,
                true_cfg_scale=o.true_cfg_scale,
                guidance_scale=o.guidance_scale,
                size_level=o.size_level,
                generator=generator,
                enable_thinking_mode=o.thinking,
                enable_reflection_mode=o.reflection,
            )
            image = _final_image(output)
        except Exception as exc:  # one request's failure (e.g. out of memory) is its error
            return EditOutcome(status="error", message=f"{type(exc).__name__}: {exc}")
        if image.size != source.size:
            # The pipeline works at about size_level²; detectors compare with the source pixel
            # by pixel, so the output comes back at the source's size.
            image = image.resize(source.size, Image.Resampling.LANCZOS)
        pixels = np.array(image.convert("RGB"), dtype=np.uint8)
        rewritten = getattr(output, "reformat_prompt", None) if o.thinking else None
        message = f"thinking mode rewrote the instruction as: {rewritten}" if rewritten else ""
        return EditOutcome(status="ok", image=pixels, message=message)

    def library_versions(self) -> dict[str, Any]:
        versions: dict[str, Any] = {
            name: installed_version(name) for name in ("torch", "diffusers", "transformers",
                                                       "accelerate")}
        if self.options.regione:
            versions["regione"] = installed_version("regione")
        cls = self._pipeline_class
        versions["pipeline"] = f"{cls.__module__}.{cls.__qualname__}"
        return versions


def _final_image(output: Any) -> Any:
    """The edit the pipeline chose: ``final_images[0]`` (with reflection, the best of its
    tries), else ``images[0]``."""
    for name in ("final_images", "images"):
        images = getattr(output, name, None)
        if images:
            return images[0]
    raise RuntimeError(f"{PIPELINE_CLASS} returned no image ({type(output).__name__})")
