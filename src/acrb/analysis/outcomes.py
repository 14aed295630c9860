"""The outcomes an audit measures, and the names metrics, reports and papers give them.

An outcome is one boolean column of the analysis frame (one row per request, see
:mod:`acrb.analysis.frame`):

- ``hard_refusal``: the model declined (unconditional);
- ``erasure``: the edit dropped the requested attribute or weakened the edit (conditional on
  the request not being refused: NA on refused rows);
- ``lightening``: the edit lightened the person's skin (conditional, like erasure).

This module is the one place that lists them; params (``analyze.hypotheses``), the stages, the
HTML report and the LaTeX tables all read the names from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

#: An outcome column of the analysis frame.
Outcome = Literal["hard_refusal", "erasure", "lightening"]

#: Every outcome, in the order tables and reports list them.
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


@dataclass(frozen=True)
class OutcomeNames:
    """How one outcome is named where people read it.

    ``metric``: the word in metric keys (``refusal_rate.race.Black``, ``delta_erasure.C.race``);
    ``title``: the heading of its tables in the report; ``phrase``: the outcome in running text
    and captions ("disparity in hard refusal rate").
    """

    metric: str
    title: str
    phrase: str


OUTCOME_NAMES: dict[str, OutcomeNames] = {
    "hard_refusal": OutcomeNames("refusal", "Hard refusal", "hard refusal"),
    "erasure": OutcomeNames("erasure", "Erasure (given not refused)", "erasure"),
    "lightening": OutcomeNames("lightening", "Skin lightening (given not refused)", "lightening"),
}


def outcome_title(outcome: str) -> str:
    """The report heading of ``outcome``; an outcome not listed here is shown by its column."""
    names = OUTCOME_NAMES.get(outcome)
    return outcome if names is None else names.title


def outcome_phrase(outcome: str) -> str:
    """``outcome`` in running text ("hard refusal"); an unlisted outcome by its column."""
    names = OUTCOME_NAMES.get(outcome)
    return outcome if names is None else names.phrase
