"""Figures already drawn, kept by what they were drawn from.

A figure of :mod:`acrb.analysis.outputs.figures` or :mod:`acrb.analysis.outputs.dvc_plots` is a
drawing call (a :func:`functools.partial` of frames, strings, numbers and the PNG's path) whose
bytes depend only on its inputs, the drawing code and the plotting libraries: the PNGs carry no
timestamp. The analyze stage draws each figure through :func:`draw`, which keeps the PNG in a cache
folder under a key of all three and, when the same key comes again, copies the PNG instead of
drawing it (a figure takes 0.2-0.5 s to draw; the embedded default has over a hundred, and most are
unchanged when a param such as the confidence level changes).

The key: SHA-256 of the drawing function's name; every argument but the output path (a frame
by its columns, dtypes and :func:`pandas.util.hash_pandas_object` of its rows and index); the
source of the drawing modules; the versions of Python, matplotlib (and its FreeType), seaborn,
numpy, pandas and Pillow; and the font file matplotlib resolves. A call with an argument of
any other kind is drawn, never cached. The folder is ``.acrb-cache/figures`` in the project
(see :func:`cache_folder` for the variables that move it or turn it off); deleting it only
costs the next run the drawing time.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import platform
import shutil
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.storage import atomic_path

#: Environment variable naming the cache folder, or ``off``.
CACHE_VARIABLE = "ACRB_FIGURE_CACHE"
#: The folder of all of ACRB's caches, when not the project's (acrb.stages.prompts).
SHARED_CACHE_VARIABLE = "ACRB_CACHE_DIR"
_OFF = {"off", "0", "no", "false"}
_LIBRARIES = ("matplotlib", "seaborn", "numpy", "pandas", "pillow")


class _Uncacheable(TypeError):
    """An argument the key cannot describe."""


def cache_folder(default: Path) -> Path | None:
    """The folder figures are kept in: ``$ACRB_FIGURE_CACHE`` when set (None for ``off``),
    else ``$ACRB_CACHE_DIR/figures`` when that is set (as the LLM and VLM reply caches: a
    `dvc exp run --queue` experiment runs in a temporary copy of the project), else
    ``default`` (the project's ``.acrb-cache/figures``)."""
    value = os.environ.get(CACHE_VARIABLE, "").strip()
    if value:
        return None if value.lower() in _OFF else Path(value)
    shared = os.environ.get(SHARED_CACHE_VARIABLE, "").strip()
    return Path(shared) / "figures" if shared else default


def draw(call: Callable[[], Path], cache: Path | None) -> Path:
    """Run the drawing ``call`` (it writes a PNG and returns its path), or copy the PNG it drew
    before for the same key from ``cache``; the path either way. ``cache`` None draws."""
    key = figure_key(call) if cache is not None else None
    output = _output_path(call)
    if key is None or cache is None or output is None:
        return call()
    kept = cache / key[:2] / f"{key}.png"
    if kept.is_file():
        try:
            with atomic_path(output) as tmp:
                shutil.copyfile(kept, tmp)
            return output
        except OSError:
            pass  # an unreadable entry: drawn instead (a write error recurs when drawing)
    written = Path(call())
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(kept) as tmp:
            shutil.copyfile(written, tmp)
    except OSError as error:
        # A cache that cannot be written (a read-only shared folder, a full disk) costs the
        # next run the drawing time, never this run its figures.
        warnings.warn(f"the figure cache {cache} cannot be written ({error}); figures are "
                      "drawn and not kept (set ACRB_FIGURE_CACHE to another folder, or off)",
                      stacklevel=2)
    return written


def figure_key(call: Callable[[], Path]) -> str | None:
    """The cache key of a drawing call (a :func:`functools.partial` with one :class:`Path`
    argument, the output); None for a call that cannot be keyed."""
    if not isinstance(call, functools.partial) or _output_path(call) is None:
        return None
    digest = hashlib.sha256(_environment_key(inspect.getsourcefile(call.func) or ""))
    digest.update(f"{call.func.__module__}.{call.func.__qualname__}".encode())
    try:
        for value in call.args:
            _feed(digest, value)
        for name in sorted(call.keywords):
            digest.update(f"\x00{name}=".encode())
            _feed(digest, call.keywords[name])
    except _Uncacheable:
        return None
    return digest.hexdigest()


def _output_path(call: functools.partial[Any] | Callable[[], Path]) -> Path | None:
    """The one :class:`Path` argument of a drawing call (its output), else None."""
    if not isinstance(call, functools.partial):
        return None
    paths = [v for v in (*call.args, *call.keywords.values()) if isinstance(v, Path)]
    return paths[0] if len(paths) == 1 else None


def _feed(digest: Any, value: object) -> None:
    """Add ``value`` to ``digest``, its type included, so that no two different arguments
    feed the same bytes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        digest.update(f"\x00{type(value).__name__}:{value!r}".encode())
    elif isinstance(value, Path):
        digest.update(b"\x00path")  # the output: where a figure goes does not change it
    elif isinstance(value, (pd.DataFrame, pd.Series)):
        frame = value.to_frame() if isinstance(value, pd.Series) else value
        # repr, not str, of a dtype: a categorical's categories and their order are its repr.
        digest.update(f"\x00frame:{frame.shape}:{list(frame.columns)!r}:"
                      f"{[repr(t) for t in frame.dtypes]!r}:{list(frame.index.names)!r}:"
                      f"{frame.index.dtype!r}".encode())
        try:
            rows = pd.util.hash_pandas_object(frame, index=True)
        except TypeError as error:  # cells that cannot be hashed (lists, dicts)
            raise _Uncacheable(str(error)) from error
        digest.update(rows.to_numpy().tobytes())
    elif isinstance(value, (tuple, list)):
        digest.update(f"\x00{type(value).__name__}:{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        raise _Uncacheable(type(value).__name__)


@functools.cache
def _environment_key(function_source: str) -> bytes:
    """The drawing code and the libraries that render it, as bytes."""
    from matplotlib import font_manager, ft2font, rcParams

    from acrb.analysis.outputs import dvc_plots, figures

    parts = [f"python {platform.python_version()}",
             f"freetype {ft2font.__freetype_version__}",
             "font " + font_manager.findfont(font_manager.FontProperties(
                 family=rcParams["font.family"]))]
    parts += [f"{name} {metadata.version(name)}" for name in _LIBRARIES]
    sources = {figures.__file__, dvc_plots.__file__, function_source}
    digest = hashlib.sha256("\n".join(parts).encode())
    for source in sorted(s for s in sources if s):
        digest.update(Path(source).read_bytes())
    return digest.digest()
