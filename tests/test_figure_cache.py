"""The figure cache: a figure drawn before from the same tables is copied, byte for byte, and
every input of a figure is part of its key (acrb.analysis.outputs.figure_cache). That analyze keeps
its figures there and draws none again on a rerun: tests/test_pipeline.py."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest

from acrb.analysis.outputs import figure_cache
from acrb.analysis.outputs.figures import delta_bars, rate_heatmap

drawn: list[Path] = []


def _rates(shift: float = 0.0) -> pd.DataFrame:
    rows = [{"outcome": "hard_refusal", "dimension": "race", "value": race, "category": category,
             "rate": 0.1 * number + shift, "n": 40, "k": 4 * number}
            for number, (race, category) in enumerate(
                (r, c) for r in ("Black", "White", "Indian") for c in ("A", "B"))]
    return pd.DataFrame(rows)


def counted_heatmap(rates: pd.DataFrame, outcome: str, dimension: str, title: str,
                    path: Path) -> Path:
    """:func:`rate_heatmap`, noting each figure it really draws."""
    drawn.append(path)
    return rate_heatmap(rates, outcome, dimension, title, path)


def _heatmap(path: Path, rates: pd.DataFrame | None = None, title: str = "t"
             ) -> functools.partial[Path]:
    return functools.partial(counted_heatmap, _rates() if rates is None else rates,
                             "hard_refusal", "race", title, path)


def test_a_figure_drawn_before_is_copied_with_the_same_bytes(tmp_path: Path) -> None:
    drawn.clear()
    cache = tmp_path / "cache"
    first = figure_cache.draw(_heatmap(tmp_path / "a.png"), cache)
    second = figure_cache.draw(_heatmap(tmp_path / "b.png"), cache)
    assert (first, second) == (tmp_path / "a.png", tmp_path / "b.png")
    assert drawn == [tmp_path / "a.png"]  # the second was copied, not drawn
    assert second.read_bytes() == first.read_bytes()
    assert rate_heatmap(_rates(), "hard_refusal", "race", "t", tmp_path / "c.png"
                        ).read_bytes() == first.read_bytes()
    assert len(list(cache.rglob("*.png"))) == 1
    # Without a cache every figure is drawn.
    figure_cache.draw(_heatmap(tmp_path / "d.png"), None)
    assert drawn == [tmp_path / "a.png", tmp_path / "d.png"]


def test_every_input_of_a_figure_is_in_its_key(tmp_path: Path) -> None:
    base = figure_cache.figure_key(_heatmap(tmp_path / "a.png"))
    assert base is not None
    # Where the figure goes does not change it.
    assert figure_cache.figure_key(_heatmap(tmp_path / "elsewhere.png")) == base
    changed = _rates()
    changed.loc[3, "rate"] += 1e-9
    reordered = _rates().astype({"value": "category"})
    reordered_too = _rates().astype({"value": pd.CategoricalDtype(["White", "Black", "Indian"])})
    as_float = _rates().astype({"n": float})
    renamed = _rates().rename(columns={"k": "events"})
    reindexed = _rates().set_axis(range(1, 7))
    variants = [
        _heatmap(tmp_path / "a.png", changed), _heatmap(tmp_path / "a.png", title="u"),
        _heatmap(tmp_path / "a.png", reordered), _heatmap(tmp_path / "a.png", reordered_too),
        _heatmap(tmp_path / "a.png", as_float), _heatmap(tmp_path / "a.png", renamed),
        _heatmap(tmp_path / "a.png", reindexed),
        functools.partial(rate_heatmap, _rates(), "hard_refusal", "race", "t", tmp_path / "a.png"),
        functools.partial(counted_heatmap, _rates(), "hard_refusal", "gender", "t",
                          tmp_path / "a.png"),
    ]
    keys = [figure_cache.figure_key(call) for call in variants]
    assert None not in keys and base not in keys and len(set(keys)) == len(keys), keys
    # Keyword arguments count by name and value.
    gaps = pd.DataFrame({"outcome": ["hard_refusal"], "category": ["A"], "dimension": ["race"],
                         "delta": [0.1], "ci_low": [0.0], "ci_high": [0.2], "flagged": [True]})
    with_planted = [figure_cache.figure_key(functools.partial(
        delta_bars, gaps, "hard_refusal", "t", tmp_path / "d.png", planted=planted))
        for planted in (None, gaps.assign(planted=0.1), gaps.assign(planted=0.2))]
    assert None not in with_planted and len(set(with_planted)) == 3


def test_a_call_it_cannot_key_is_drawn_every_time(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    drawn.clear()
    calls = [
        lambda: counted_heatmap(_rates(), "hard_refusal", "race", "t", tmp_path / "a.png"),
        functools.partial(counted_heatmap, _rates().assign(extra=[[1]] * 6), "hard_refusal",
                          "race", "t", tmp_path / "b.png"),  # a cell that cannot be hashed
        functools.partial(counted_heatmap, _rates(), "hard_refusal", "race",
                          {"title": "t"}, tmp_path / "c.png"),  # an argument of another kind
    ]
    for call in calls:
        assert figure_cache.figure_key(call) is None
        figure_cache.draw(call, cache)
        figure_cache.draw(call, cache)
    assert len(drawn) == 6 and not cache.exists()
    # A drawing call with two paths: which one it writes is unknown, so nothing is cached.
    two_paths = functools.partial(counted_heatmap, _rates(), "hard_refusal", "race",
                                  tmp_path / "t", tmp_path / "d.png")
    assert figure_cache.figure_key(two_paths) is None


def test_the_cache_folder_is_the_projects_unless_the_variable_says(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = tmp_path / ".acrb-cache" / "figures"
    monkeypatch.delenv(figure_cache.CACHE_VARIABLE, raising=False)
    monkeypatch.delenv("ACRB_CACHE_DIR", raising=False)
    assert figure_cache.cache_folder(default) == default
    monkeypatch.setenv("ACRB_CACHE_DIR", str(tmp_path / "caches"))
    assert figure_cache.cache_folder(default) == tmp_path / "caches" / "figures"
    for off in ("off", "OFF", "0"):
        monkeypatch.setenv(figure_cache.CACHE_VARIABLE, off)
        assert figure_cache.cache_folder(default) is None
    monkeypatch.setenv(figure_cache.CACHE_VARIABLE, str(tmp_path / "shared"))
    assert figure_cache.cache_folder(default) == tmp_path / "shared"


def test_a_cache_that_cannot_be_written_costs_drawing_time_not_the_figure(tmp_path: Path) -> None:
    drawn.clear()
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    with pytest.warns(UserWarning, match="cannot be written"):
        first = figure_cache.draw(_heatmap(tmp_path / "a.png"), blocked)
    assert first.read_bytes().startswith(b"\x89PNG") and drawn == [tmp_path / "a.png"]
    # An entry that cannot be read is drawn again, not copied.
    cache = tmp_path / "readable"
    figure_cache.draw(_heatmap(tmp_path / "b.png"), cache)
    (entry,) = cache.rglob("*.png")
    entry.unlink()
    entry.mkdir()  # a folder where the PNG should be
    with pytest.warns(UserWarning, match="cannot be written"):  # nor stored there again
        again = figure_cache.draw(_heatmap(tmp_path / "c.png"), cache)
    assert again.read_bytes() == first.read_bytes() and len(drawn) == 3
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary left
