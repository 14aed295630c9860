"""Analysis frames built by hand for the statistics tests: one row per request."""

from __future__ import annotations

import pandas as pd


def requests(
    n: int,
    *,
    refused: int = 0,
    erased: int = 0,
    category: str = "A",
    race: str = "Black",
    gender: str = "Female",
    age: str = "20s",
    status: str = "ok",
) -> pd.DataFrame:
    """n requests of one group: the first ``refused`` hard-refused, then ``erased`` erased."""
    hard_refusal = pd.array([i < refused for i in range(n)], dtype="boolean")
    erasure = pd.array([refused <= i < refused + erased for i in range(n)], dtype="boolean")
    erasure[hard_refusal.to_numpy(dtype=bool, na_value=False)] = pd.NA
    if status == "error":
        hard_refusal[:] = pd.NA
        erasure[:] = pd.NA
    return pd.DataFrame(
        {
            "request_id": [f"{category}-{race}-{gender}-{age}-{status}-{i}" for i in range(n)],
            "category": category,
            "race": race,
            "gender": gender,
            "age": age,
            "status": status,
            "hard_refusal": hard_refusal,
            "erasure": erasure,
            "lightening": erasure.copy(),
        }
    )
