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


def largest_remainders(sizes: pd.Series, n: int, seed: int,
                       behind: pd.Series | None = None) -> pd.Series:
    """Proportional shares of ``n`` over ``sizes`` (largest remainders, ties broken by a seeded
    draw), never more than an entry holds. ``behind`` (same index), where given, breaks ties
    before the draw: the entry furthest behind its target elsewhere gets the extra unit first."""
    total = int(sizes.sum())
    if n >= total:
        return sizes.astype(int).copy()
    exact = sizes * n / total
    counts = np.floor(exact).astype(int)
    left = n - int(counts.sum())
    tiebreak = pd.Series([unit_key(seed, "alloc", k) for k in sizes.index], index=sizes.index)
    remainders = exact - counts
    if behind is not None:  # rounded, so that equal shares computed another way still tie
        remainders = remainders.round(9)
    keys = pd.DataFrame({"rem": remainders,
                         "behind": 0.0 if behind is None else behind.round(9),
                         "tie": tiebreak})
    order = keys.sort_values(["rem", "behind", "tie"], ascending=[False, False, True]).index
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


def allocate(sizes: pd.Series, n: int, seed: int, *, balance_last: bool = False) -> pd.Series:
    """Proportional allocation of ``n`` draws to the strata of ``sizes`` (a Series indexed by
    one or more levels), level by level: first over the first level, then over the second
    inside each value of the first, and so on. So every margin above the last gets its
    proportional share to within one draw, even when there are more strata than draws.

    With ``balance_last`` the last level's margin is held too: inside each branch a tie between
    remainders goes to the value of the last level furthest behind its proportional share of
    ``n`` so far (a controlled rounding; e.g. 500 over 20 prompts x 3 editors gives 25 per
    prompt and 167/167/166 per editor, where independent tie-breaks could give 171/165/164)."""
    levels = list(sizes.index.names)
    last_totals = sizes.groupby(level=len(levels) - 1).sum() if len(levels) > 1 else sizes
    target = last_totals * min(n, int(sizes.sum())) / max(int(sizes.sum()), 1)
    given = pd.Series(0, index=last_totals.index, dtype=float)

    def split(part: pd.Series, k: int, depth: int, prefix: tuple[Any, ...]) -> dict[Any, int]:
        if depth == len(levels) - 1:
            leaf = part.droplevel(list(range(depth))) if depth else part
            behind = None
            if balance_last:
                # Shortfall so far, relative to the share of the branches already allocated.
                done = float(given.sum()) + k
                behind = (target.reindex(leaf.index) * done / max(float(target.sum()), 1.0)
                          - given.reindex(leaf.index))
            shares = largest_remainders(leaf, k, seed, behind)
            given.loc[shares.index] += shares.to_numpy()
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
                    key: Sequence[str], *, balance_last: bool = False) -> pd.DataFrame:
    """``n`` rows of ``units`` (all when ``n`` is None or not smaller): :func:`allocate` gives
    each stratum of ``strata`` its proportional share, and inside a stratum the rows with the
    smallest seeded :func:`unit_key` of their ``key`` columns are taken (a simple random sample
    without replacement). Rows keep their order in ``units``."""
    if n is None or n >= len(units):
        return units
    groups = units.groupby(list(strata), sort=True)
    shares = allocate(groups.size(), n, seed, balance_last=balance_last)
    draws = units.assign(_key=[unit_key(seed, "unit", *row)
                               for row in units[list(key)].itertuples(index=False)])
    chosen: list[Any] = []
    for stratum, frame in draws.groupby(list(strata), sort=True):
        label: Any = stratum if len(strata) > 1 else cast(tuple[Any, ...], stratum)[0]
        share = int(shares.loc[label])
        chosen.extend(frame.nsmallest(share, "_key").index)
    return units.loc[units.index.isin(chosen)]
