"""What a judge is: the interface every judge implements (:class:`Judge`).

A judge scores generations on the rubric's axes (:mod:`acrb.judges.rubric`). The ``judge``
stage hands it :class:`JudgeItem` batches and records one :class:`JudgeAnswer` per item, in
order. A judge never sees the simulators' planted state; only a simulated judge reads
``design`` (the source's group labels), to apply its own planted group-dependent errors, and
``reading`` (the detectors' reading of the pixels). A real judge is not given the group, except
where its params say that its prompt states the labels (``judges.<name>.prompt.labels``, as the
seed study's judge prompt does): then, and only then, the stage fills ``labels``, the request
states them and the answer records ``labels_given``. A judge is an instrument; the audited
editors never receive labels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from acrb.judges.items import JudgeAnswer, JudgeItem
from acrb.storage import content_hash

if TYPE_CHECKING:
    from acrb.judges.rubric import Rubric
    from acrb.judges.winobias import RoleRubric


class Judge(ABC):
    """A judge: scores items on a rubric, in batches, in order."""

    #: True for judges whose errors are planted (never a measurement of a real judge).
    simulated: bool = False
    #: True for judges that start from the detectors' reading of an edit when an item has one
    #: (:attr:`JudgeItem.reading`) and then look at no pixel: the stage does not decode them.
    reads_reading: bool = False

    def __init__(self, name: str, rubric: Rubric | RoleRubric) -> None:
        self.name = name
        self.rubric = rubric

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything that determines this judge's answers (no secrets): kind, model, revision,
        sampling settings or planted config. Hashed with the rubric into :attr:`judge_id`."""

    @property
    def judge_id(self) -> str:
        """Hash of :meth:`identity` and the rubric: stored answers are reused only under the
        same id."""
        return content_hash({"judge": self.identity(), "rubric": self.rubric.digest})

    @abstractmethod
    def judge_many(self, items: Sequence[JudgeItem]) -> list[JudgeAnswer]:
        """One answer per item, in order. Never raises for an item's own failure: that is an
        ``error`` or ``abstained`` answer. Raises :class:`~acrb.errors.ConfigError` when the
        judge cannot work at all (credentials, model, endpoint)."""

    def close(self) -> None:
        """Release the model or connections."""
        return None

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
