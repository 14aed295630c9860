"""Cells of the paper's tables and a verdict of the judge analysis that a planted bug once
changed without any test failing (issue 31): table 7's people's alpha (ordinal beside
interval), table 3's headers over the numbers computed on a known design, and
``significant`` of :func:`acrb.analysis.agreement.judging.score_tests` (Holm's p, not the raw one).

Each test fails with its bug planted (``benchmarks/planted_bugs.py``, the bugs
``table7-alpha-interval``, ``table3-headers-swapped`` and ``score-tests-raw-p``) and passes
without it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.agreement.judging import score_tests
from acrb.analysis.agreement.raters import judge_human_agreement, rater_agreement
from acrb.analysis.outputs import paper_tables
from acrb.demographics import RACES
from tests.test_agreement import KRIPPENDORFF_ALPHAS, krippendorff_frames
from tests.test_judging import design_frame
from tests.test_paper_table_cells import MODEL, SETTINGS, _small_frame


def test_table_7_people_alpha_is_the_ordinal_one_beside_the_interval_one() -> None:
    """People's agreement on Krippendorff's (2011) worked example, where the published alphas
    differ by level (ordinal 0.815, interval 0.849): each sits in its own column of table 7
    and under its own header."""
    ratings, items = krippendorff_frames()
    agreement = rater_agreement(ratings, items, axes=("skin_tone",), n_boot=50)
    units = pd.DataFrame({"output": "edited", "model": "m", "race": "White",
                          "gender": "Female", "age": "20s",
                          "human_skin_tone": [1, 2, 3, 4, 5], "judge_skin_tone": [1, 2, 3, 4, 4]})
    review = judge_human_agreement(units, axes=("skin_tone",))
    table = paper_tables.judge_human(review, agreement, None, "median")
    row = table[table["model"] == paper_tables.ALL_MODELS].iloc[0]
    assert round(row["human_alpha"], 3) == KRIPPENDORFF_ALPHAS["ordinal"]
    assert round(row["human_alpha_interval"], 3) == KRIPPENDORFF_ALPHAS["interval"]
    for column, statistic in (("human_alpha", "alpha_ordinal"),
                              ("human_alpha_interval", "alpha_interval")):
        source = agreement[(agreement["statistic"] == statistic)
                           & (agreement["dimension"] == "all")].iloc[0]
        assert (row[f"{column}_low"], row[f"{column}_high"]) == pytest.approx(
            (source["ci_low"], source["ci_high"])), column
    shown = paper_tables.SPECS["judge_human"].display(table)
    overall = [r[0] for r in shown.rows].index(paper_tables.ALL_MODELS)
    assert shown.rows[overall][shown.header.index("Human alpha (ordinal)")].startswith("0.82")
    assert shown.rows[overall][shown.header.index("Human alpha (interval)")].startswith("0.85")


def score_frame() -> pd.DataFrame:
    """Every race x gender x age source under three prompts (tests.test_judging's design),
    with two 1-5 score axes built without randomness:

    - edit success: a spread over race, prompt and age, one step higher for Black and East
      Asian men: Kruskal-Wallis across races p = 0.033 on its own, 0.16 after Holm;
    - skin tone: the same spread, one step higher for every man: across genders p = 0.0036,
      0.021 after Holm.
    """
    frame = design_frame()
    race = frame["race"].map({name: i for i, name in enumerate(RACES)})
    prompt = frame["prompt_id"].str[1:].astype(int)
    spread = 1 + (race * 3 + prompt + (frame["age"] == "70plus")) % 5
    male = frame["gender"] == "Male"
    return frame.assign(edit_success=np.clip(spread + (male & (race < 2)), 1, 5).astype(float),
                        skin_tone=np.clip(spread + male, 1, 5).astype(float))


def test_score_tests_significance_is_read_from_holms_p() -> None:
    table = score_tests(score_frame(), 0.05, axes=("edit_success", "skin_tone"),
                        ordinal=False).set_index(["axis", "dimension"])
    assert len(table) == 6
    race = table.loc[("edit_success", "race")]
    assert race["p_value"] == pytest.approx(0.0327, abs=5e-4)  # raw p below alpha...
    assert race["p_adjusted"] > 0.05  # ...Holm's above it: not significant
    assert not race["significant"]
    gender = table.loc[("skin_tone", "gender")]  # below alpha either way: significant
    assert gender["p_adjusted"] < 0.05 and gender["significant"]
    assert (table["significant"].astype(bool) == (table["p_adjusted"] < 0.05)).all()


def test_table_3_cells_from_a_known_design_sit_under_their_headers() -> None:
    """Table 3 computed on 8 answered requests and shown: each header over its own number
    (edit success 5 of 8 at 4 or more, mean 3.5; soft erasure 2 of 8; race change 3 of 8 at
    3 or more, 1 of 8 at 4 or more: all different)."""
    erased = [False, False, False, False, True, True, False, False]
    frame = _small_frame({"edit_success": [5, 4, 4, 3, 1, 2, 5, 4],
                          "race_change": [1, 1, 3, 3, 5, 1, 2, 1]}, ["Black", "White"] * 4)
    frame["soft_erasure"] = pd.array(erased, dtype="boolean")
    summary = paper_tables.model_summary({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["model_summary"].display(summary)
    cells = dict(zip(shown.header, shown.rows[0], strict=True))
    expected = {"Edit success >= 4 (%)": "62.5", "Edit success (mean, 1-5)": "3.50",
                "Soft erasure (%)": "25.0", "Race change >= 3 (%)": "37.5",
                "Race change >= 4 (%)": "12.5"}
    for header, number in expected.items():
        assert cells[header].split(" ")[0] == number, header
