"""Stratified random samples: proportional allocation and reproducible named draws.

Shared by the review set (which outputs people rate) and the plan (which cells the feature arm
repeats). Every draw is keyed by a content hash of the seed and what is drawn, so a sample does
not depend on the order rows arrive in, and equal inputs give equal samples on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from acrb.storage import content_hash


def unit_key(seed: int, *parts: Any) -> float:
    """A reproducible uniform draw in [0, 1) for one named thing."""
    return int(content_hash({"seed": seed, "parts": [str(p) for p in parts]}, 16), 16) / 16**16


def largest_remainders(sizes: pd.Series, n: int, seed: int) -> pd.Series:
    """Proportional shares of ``n`` over ``sizes`` (largest remainders, ties broken by a seeded
    draw), never more than an entry holds."""
    total = int(sizes.sum())
    if n >= total:
        return sizes.astype(int).copy()
    exact = sizes * n / total
    counts = np.floor(exact).astype(int)
    left = n - int(counts.sum())
    tiebreak = pd.Series([unit_key(seed, "alloc", k) for k in sizes.index], index=sizes.index)
    order = pd.DataFrame({"rem": exact - counts, "tie": tiebreak}).sort_values(
        ["rem", "tie"], ascending=[False, True]).index
    while left > 0:
        progressed = False
        for key in order:
            if left == 0:
                break
            if counts[key] < sizes[key]:
                counts[key] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return counts


def allocate(sizes: pd.Series, n: int, seed: int) -> pd.Series:
    """Proportional allocation of ``n`` draws to the strata of ``sizes`` (a Series indexed by
    one or more levels), level by level: first over the first level, then over the second
    inside each value of the first, and so on. So every margin gets its proportional share to
    within one draw, even when there are more strata than draws."""
    levels = list(sizes.index.names)

    def split(part: pd.Series, k: int, depth: int, prefix: tuple[Any, ...]) -> dict[Any, int]:
        if depth == len(levels) - 1:
            shares = largest_remainders(part.droplevel(list(range(depth)))
                                        if depth else part, k, seed)
            return {(*prefix, key) if len(levels) > 1 else key: int(v)
                    for key, v in shares.items()}
        level_sizes = part.groupby(level=depth).sum()
        shares = largest_remainders(level_sizes, k, _branch_seed(seed, prefix))
        out: dict[Any, int] = {}
        for key, share in shares.items():
            sub = part.xs(key, level=depth, drop_level=False)
            out.update(split(sub, int(share), depth + 1, (*prefix, key)))
        return out

    counts = split(sizes, n, 0, ())
    return pd.Series([counts[k] for k in sizes.index], index=sizes.index)


def _branch_seed(seed: int, prefix: tuple[Any, ...]) -> int:
    """A seed for the tie-breaks inside one branch of the allocation."""
    return int(content_hash({"seed": seed, "branch": [str(p) for p in prefix]}, 8), 16)


def stratified_draw(units: pd.DataFrame, n: int | None, strata: Sequence[str], seed: int,
                    key: Sequence[str]) -> pd.DataFrame:
    """``n`` rows of ``units`` (all when ``n`` is None or not smaller): :func:`allocate` gives
    each stratum of ``strata`` its proportional share, and inside a stratum the rows with the
    smallest seeded :func:`unit_key` of their ``key`` columns are taken (a simple random sample
    without replacement). Rows keep their order in ``units``."""
    if n is None or n >= len(units):
        return units
    groups = units.groupby(list(strata), sort=True)
    shares = allocate(groups.size(), n, seed)
    draws = units.assign(_key=[unit_key(seed, "unit", *row)
                               for row in units[list(key)].itertuples(index=False)])
    chosen: list[Any] = []
    for stratum, frame in draws.groupby(list(strata), sort=True):
        label: Any = stratum if len(strata) > 1 else cast(tuple[Any, ...], stratum)[0]
        share = int(shares.loc[label])
        chosen.extend(frame.nsmallest(share, "_key").index)
    return units.loc[units.index.isin(chosen)]
