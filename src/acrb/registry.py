"""One registry type for every pluggable kind: the keys users type, mapped to lazy import targets.

A :class:`Registry` maps keys (``synthetic:biased`` under ``models.<name>.key``, ``openai`` under
``prompts.synthesis.backends.<name>.kind``) to ``"module:Class"`` targets, in the manner of
lm-evaluation-harness ``lm_eval/api/registry.py`` and inspect_ai's model providers:

* nothing is imported until a key is loaded, so a diffusers adapter costs nothing to a stage
  that only checks its key, and checking a key never imports anything;
* each entry names the optional-dependency *extra* it needs and the modules that extra brings;
  loading a key whose modules are missing raises a :class:`~acrb.errors.ConfigError` whose fix
  is the exact install command (``pip install -e ".[llm-local]"``);
* other packages add entries through an entry-point group (``acrb.editors``,
  ``acrb.chat_backends``): name = key, value = ``module:Class``, optionally followed by
  ``[extra]``; code can add entries with :meth:`Registry.register`.

A key is looked up in the built-in entries, then in entry points (which cannot shadow a
built-in), then in entries registered at run time (which override both).

The instances live at the bottom of this module. A new kind is one line once its base class
exists, e.g. ``JUDGES`` (``acrb.judges``) and ``DETECTORS`` (``acrb.detectors``); add the
instance to :data:`REGISTRIES` so that ``acrb models`` lists it.

The models under audit are of two kinds, :data:`EDITORS` (image to image) and
:data:`GENERATORS` (text to image), whose keys share one namespace (``models.<name>.key``):
:func:`model_registry` finds the registry of a key, and a key may not be in both.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from acrb.errors import ConfigError

if TYPE_CHECKING:
    from acrb.clients import ChatClient
    from acrb.models.base import Editor, Generator, ImageModel
    from acrb.sections import ChatBackendParams

T = TypeVar("T")

_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: The distribution whose extras the built-in entries name.
PROJECT = "acrb"

Origin = Literal["built-in", "entry point", "registered"]


@dataclass(frozen=True)
class RegistryEntry:
    """One registered key.

    ``target`` is ``"module:Class"``; ``extra`` the optional-dependency group that installs what
    it needs (``None`` when the core install suffices); ``requires`` the top-level modules that
    must be importable before the target is imported (checked with
    :func:`importlib.util.find_spec`, so a missing one is reported without a traceback);
    ``distribution`` the package whose extra it is (``acrb`` for built-ins; the providing
    package for an entry point).
    """

    key: str
    target: str
    extra: str | None = None
    requires: tuple[str, ...] = ()
    description: str = ""
    origin: Origin = "built-in"
    distribution: str | None = PROJECT

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.target.partition(":")[2]

    def install_command(self) -> str | None:
        """The command that installs this entry's extra, or None when it names none."""
        if self.extra is None:
            return None
        if self.distribution in (None, PROJECT):
            return f'pip install -e ".[{self.extra}]"'
        return f'pip install "{self.distribution}[{self.extra}]"'


def _check_target(target: str) -> None:
    if not _TARGET.match(target):
        raise ValueError(f"a registry target must look like 'module:Class', got {target!r}")


def _import_attribute(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    value: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        value = getattr(value, name)
    return value


class Registry(Generic[T]):
    """Keys of one kind (editor, chat backend, ...) mapped to lazily imported classes.

    ``kind`` names the kind in messages; ``base`` is the ``"module:Class"`` every target must
    derive from (imported only by :meth:`load`); ``group`` the entry-point group other packages
    register under; ``key_label`` what users call a key in messages (default ``"<kind> key"``).
    """

    def __init__(self, kind: str, base: str, group: str, builtins: Iterable[RegistryEntry] = (),
                 *, key_label: str | None = None) -> None:
        _check_target(base)
        self.kind = kind
        self.base = base
        self.group = group
        self.key_label = key_label or f"{kind} key"
        self._builtins: dict[str, RegistryEntry] = {}
        for entry in builtins:
            _check_target(entry.target)
            self._builtins[entry.key] = replace(entry, origin="built-in")
        self._registered: dict[str, RegistryEntry] = {}
        self._scanned: tuple[Callable[..., Any], dict[str, RegistryEntry]] | None = None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, base={self.base!r}, group={self.group!r})"

    # ---- the entries --------------------------------------------------------------------------

    def register(self, key: str, target: str, *, extra: str | None = None,
                 requires: Iterable[str] = (), description: str = "") -> RegistryEntry:
        """Add (or replace) ``key`` -> ``target`` for the rest of this process.

        ``target`` is ``"module:Class"``, a subclass of :attr:`base`; nothing is imported now.
        """
        if not key or key != key.strip():
            raise ValueError(f"a {self.key_label} must be a non-empty name, got {key!r}")
        _check_target(target)
        entry = RegistryEntry(key=key, target=target, extra=extra, requires=tuple(requires),
                              description=description, origin="registered")
        self._registered[key] = entry
        return entry

    def unregister(self, key: str) -> None:
        """Forget an entry added with :meth:`register` (built-ins and entry points stay)."""
        self._registered.pop(key, None)

    def _entry_points(self) -> dict[str, RegistryEntry]:
        # Scanning the installed distributions takes ~20 ms and a stage asks for every model
        # and judge it checks: the answer is kept per lookup function (tests replace it).
        lookup = entry_points
        cached = self._scanned
        if cached is not None and cached[0] is lookup:
            return dict(cached[1])
        found = self._scan(lookup)
        self._scanned = (lookup, found)
        return dict(found)

    def _scan(self, lookup: Callable[..., Any]) -> dict[str, RegistryEntry]:
        found = {}
        for point in lookup(group=self.group):
            target = f"{point.module}:{point.attr}"
            if not _TARGET.match(target):
                continue  # a malformed third-party entry must not break every other key
            dist = getattr(point, "dist", None)
            found[point.name] = RegistryEntry(
                key=point.name, target=target, extra=point.extras[0] if point.extras else None,
                origin="entry point", distribution=dist.name if dist is not None else None,
                description=f"from the {self.group} entry points"
                + (f" of {dist.name}" if dist is not None else ""))
        return found

    def entries(self) -> list[RegistryEntry]:
        """Every known entry (built-ins, entry points, registered), sorted by key."""
        merged = dict(self._builtins)
        for key, entry in self._entry_points().items():
            merged.setdefault(key, entry)
        merged.update(self._registered)
        return [merged[key] for key in sorted(merged)]

    def keys(self) -> list[str]:
        """Every known key, sorted."""
        return [entry.key for entry in self.entries()]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def entry(self, key: str) -> RegistryEntry:
        """The entry of ``key``; a ConfigError listing the valid keys if there is none.

        Imports nothing.
        """
        known = {entry.key: entry for entry in self.entries()}
        if key not in known:
            raise ConfigError(
                f"unknown {self.key_label} {key!r}",
                "use one of: " + ", ".join(known) + f" (other packages add {self.kind}s through "
                f"the '{self.group}' entry points)",
            )
        return known[key]

    def check(self, key: str) -> str:
        """Return ``key`` if it is known, else raise a ConfigError listing the valid keys.

        Imports nothing: safe wherever params are loaded.
        """
        self.entry(key)
        return key

    # ---- loading ------------------------------------------------------------------------------

    def missing_modules(self, key: str) -> list[str]:
        """The modules ``key`` requires that cannot be found here (nothing is imported)."""
        return [name for name in self.entry(key).requires if not _findable(name)]

    def is_available(self, key: str) -> bool:
        """True when ``key``'s required modules and its target's module can be found here.

        Finds modules without running them, so this is cheap and has no side effects beyond
        importing the target's parent packages.
        """
        entry = self.entry(key)
        return not self.missing_modules(key) and _findable(entry.module)

    def _missing_fix(self, entry: RegistryEntry, modules: list[str]) -> str:
        command = entry.install_command()
        if command is not None:
            return command
        return ("install the package(s) providing " + ", ".join(repr(m) for m in modules)
                + f" (e.g. pip install {' '.join(m.partition('.')[0] for m in modules)})")

    def load(self, key: str) -> type[T]:
        """Import and return the class registered under ``key``.

        Raises :class:`ConfigError` when the key is unknown, when a module it needs is not
        installed (the fix is the install command of its extra), when the target does not
        exist, and when the target is not a subclass of :attr:`base`.
        """
        entry = self.entry(key)
        where = f"{self.kind} {key!r} ({entry.target})"
        missing = self.missing_modules(key)
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            raise ConfigError(f"{where} needs {' and '.join(missing)}, which {verb} not installed",
                              self._missing_fix(entry, missing))
        try:
            value = _import_attribute(entry.target)
        except ModuleNotFoundError as exc:
            missing_root = (exc.name or "").partition(".")[0]
            if missing_root and missing_root != entry.module.partition(".")[0]:
                # A third-party module the target imports: an optional dependency not installed.
                raise ConfigError(
                    f"{where} could not be imported: module {exc.name!r} is not installed",
                    self._missing_fix(entry, [exc.name or missing_root]),
                ) from exc
            raise ConfigError(
                f"{where}: module {exc.name or entry.module!r} not found",
                f"check the target of {self.key_label} {key!r} ('module:Class'), or install the "
                "package that provides it",
            ) from exc
        except AttributeError as exc:
            raise ConfigError(
                f"{where}: module {entry.module!r} has no attribute {entry.attribute!r}",
                f"check the target of {self.key_label} {key!r} ('module:Class')",
            ) from exc
        base = self.base_class()
        if not (isinstance(value, type) and issubclass(value, base)):
            raise ConfigError(
                f"{where} is not a subclass of {self.base}",
                f"register a class derived from {self.base} under {self.key_label} {key!r}",
            )
        return cast("type[T]", value)

    def base_class(self) -> type[T]:
        """The base class every target derives from (imported on first use)."""
        return cast("type[T]", _import_attribute(self.base))


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        # find_spec imports parent packages; a missing parent means the module is missing too.
        return False


#: What the open-weights diffusers adapters import (the ``models`` extra installs them).
_DIFFUSERS = ("torch", "diffusers", "transformers")

EDITORS: Registry[Editor] = Registry(
    "editor", "acrb.models.base:Editor", "acrb.editors", key_label="model key",
    builtins=[
        RegistryEntry("synthetic:fair", "acrb.models.synthetic:SyntheticEditor",
                      description="simulated editor with no planted bias (embedded default)"),
        RegistryEntry("synthetic:biased", "acrb.models.synthetic:SyntheticEditor",
                      description="simulated editor with planted, published biases"),
        *[RegistryEntry(key, target, extra="models", requires=_DIFFUSERS, description=text)
          for key, target, text in (
              ("qwen-image-edit", "acrb.models.qwen_image_edit:QwenImageEdit",
               "Qwen-Image-Edit-2511 (diffusers), 1 to 3 portraits per request"),
              ("flux2-dev:edit", "acrb.models.flux2:Flux2Editor",
               "FLUX.2 [dev] editing with reference images (diffusers), up to 6 per request"),
              ("flux-kontext", "acrb.models.flux_kontext:FluxKontext",
               "FLUX.1 Kontext [dev] (diffusers), one portrait per request"),
              ("instruct-pix2pix", "acrb.models.instruct_pix2pix:InstructPix2Pix",
               "InstructPix2Pix (diffusers), safety checker on, one portrait per request"),
          )],
        # No extra: its pipeline exists only in its authors' diffusers fork, installed in an
        # environment of its own; loading it without the fork says exactly what to install.
        RegistryEntry("step1x-edit-v1p2", "acrb.models.step1x:Step1XEdit",
                      requires=("torch", "diffusers", "transformers"),
                      description="Step1X-Edit-v1p2 on its authors' diffusers fork (an "
                      "environment of its own; docs/step1x.md)"),
        RegistryEntry("openai:gpt-image-1:edit", "acrb.models.openai_images:OpenAIImageEditor",
                      extra="api", requires=("openai",),
                      description="OpenAI gpt-image-1 image edits (up to 16 input images)"),
        RegistryEntry("gemini:image:edit", "acrb.models.gemini_images:GeminiImageEditor",
                      extra="api", requires=("google.genai",),
                      description="Gemini image editing (gemini-2.5-flash-image by default)"),
    ],
)

GENERATORS: Registry[Generator] = Registry(
    "generator", "acrb.models.base:Generator", "acrb.generators", key_label="model key",
    builtins=[
        RegistryEntry("synthetic:t2i", "acrb.models.synthetic_t2i:SyntheticGenerator",
                      description="simulated text-to-image generator with planted refusal "
                      "biases by prompt attribute"),
        RegistryEntry("flux2-dev", "acrb.models.flux2:Flux2Generator", extra="models",
                      requires=_DIFFUSERS, description="FLUX.2 [dev] text to image (diffusers)"),
        RegistryEntry("sd3.5", "acrb.models.sd35:SD35", extra="models", requires=_DIFFUSERS,
                      description="Stable Diffusion 3.5 Large text to image (diffusers)"),
        RegistryEntry("openai:gpt-image-1", "acrb.models.openai_images:OpenAIImageGenerator",
                      extra="api", requires=("openai",),
                      description="OpenAI gpt-image-1 text to image"),
        RegistryEntry("openai:dall-e-3", "acrb.models.openai_images:OpenAIImageGenerator",
                      extra="api", requires=("openai",),
                      description="OpenAI DALL-E 3 text to image"),
        RegistryEntry("gemini:image", "acrb.models.gemini_images:GeminiImageGenerator",
                      extra="api", requires=("google.genai",),
                      description="Gemini image generation (gemini-2.5-flash-image by default)"),
    ],
)

#: The registries whose keys go under ``models.<name>.key``: one namespace of model keys.
MODEL_REGISTRIES: tuple[Registry[Any], ...] = (EDITORS, GENERATORS)


def model_registry(key: str) -> Registry[Any]:
    """The registry (editors or generators) that knows the model key ``key``.

    Imports nothing. A ConfigError lists the valid keys of both kinds when neither knows it,
    and names both when both do (the namespace is shared; a key must be unique across it).
    """
    having = [registry for registry in MODEL_REGISTRIES if key in registry]
    if len(having) == 1:
        return having[0]
    if not having:
        valid = "; ".join(f"{registry.kind}s: " + (", ".join(registry.keys()) or "none")
                          for registry in MODEL_REGISTRIES)
        raise ConfigError(f"unknown model key {key!r}", f"use one of the {valid}")
    raise ConfigError(
        f"model key {key!r} is registered as both an editor and a generator",
        "register it under one kind only (e.g. suffix the text-to-image entry with ':t2i')",
    )


def load_model(key: str) -> type[ImageModel]:
    """The adapter class of the model key ``key``, editor or generator (imports it)."""
    return cast("type[ImageModel]", model_registry(key).load(key))


CHAT_BACKENDS: Registry[ChatClient] = Registry(
    "chat backend", "acrb.clients:ChatClient", "acrb.chat_backends",
    key_label="chat backend kind",
    builtins=[
        RegistryEntry("openai", "acrb.clients.openai:OpenAIChatClient",
                      description="any OpenAI-compatible chat-completions endpoint (OpenAI, "
                      "vLLM, Ollama, llama.cpp server)"),
        RegistryEntry("gemini", "acrb.clients.gemini:GeminiChatClient",
                      description="Google's Gemini generateContent REST API"),
        RegistryEntry("transformers", "acrb.clients.transformers:TransformersChatClient",
                      extra="llm-local", requires=("torch", "transformers"),
                      description="a local Hugging Face causal LM (text only)"),
        RegistryEntry("transformers-vlm",
                      "acrb.clients.transformers_vlm:TransformersVLMChatClient",
                      extra="llm-local", requires=("torch", "transformers"),
                      description="a local vision-language model (Qwen3-VL, Qwen2.5-VL), "
                      "batched generation"),
    ],
)

def open_chat_client(name: str, params: ChatBackendParams, cache_dir: Path) -> ChatClient:
    """The client for ``params.kind`` (a key of :data:`CHAT_BACKENDS`), caching
    replies under ``cache_dir``; ``name`` is the backend's name in params and records.

    Raises :class:`ConfigError` when the kind is unknown, its optional dependencies are not
    installed (the fix names the extra), or the API key's environment variable is missing.
    """
    try:
        client_class = CHAT_BACKENDS.load(params.kind)
    except ConfigError as exc:
        raise ConfigError(f"LLM backend {name!r}: {exc.problem}", exc.fix) from exc
    return client_class(name, params, Path(cache_dir))


#: Every registry, in the order ``acrb models`` lists them.
REGISTRIES: tuple[Registry[Any], ...] = (EDITORS, GENERATORS, CHAT_BACKENDS)
