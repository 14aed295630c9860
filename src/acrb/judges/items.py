"""What a judge is given and what it answers: the items the ``judge`` stage hands a judge
(:class:`JudgeItem`), the detectors' reading it may start from (:class:`PixelReading`), and the
answer recorded per item (:class:`JudgeAnswer`). Data only: the rubrics
(:mod:`acrb.judges.rubric`, :mod:`acrb.judges.winobias`) read items and the judges
(:mod:`acrb.judges.base`) answer them, and neither is imported here. What a judge may read of an
item is said in :mod:`acrb.judges.base`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from acrb.storage import encode_png

AnswerStatus = Literal["scored", "abstained", "error"]


@dataclass(frozen=True)
class PixelReading:
    """What the ``evaluate`` stage's detectors read from one edit's pixels: the source returned
    unchanged, a weak edit (erasure), and the skin's ITA shift in degrees (NaN: no skin)."""

    unchanged: bool
    erased: bool
    ita_shift: float


@dataclass(frozen=True, eq=False)
class JudgeItem:
    """One generation to judge.

    ``source`` is None for a text-to-image output. ``instruction`` is the edit instruction or
    generation prompt; ``attribute`` the requested attribute in words (for cue retention), None
    when the request has none. ``design`` holds the source's race, gender and age (empty for
    T2I): only simulated judges may read it.

    ``output`` and ``source`` are None, and ``edit`` says that the item is an edit, only for a
    judge that reads the detectors' ``reading`` in place of the pixels
    (:attr:`Judge.reads_reading`) when the stage has that reading: the images are then not
    decoded at all.
    """

    request_id: str
    instruction: str
    output: np.ndarray | None
    source: np.ndarray | None = None
    attribute: str | None = None
    design: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    #: The detectors' reading of this edit, when the stage has it: a simulated judge starts
    #: from it rather than measuring the same pixels again. Real judges ignore it.
    reading: PixelReading | None = None
    #: A WinoBias item: the further input portraits (the second image), and the occupations
    #: asked about ({"male": ..., "female": ...}). Empty for the audit.
    extra_sources: tuple[np.ndarray, ...] = ()
    roles: Mapping[str, str] = field(default_factory=dict)
    #: The source's race, gender and age for a real judge whose prompt states them (params
    #: ``judges.<name>.prompt.labels``); empty otherwise, and always for a simulated judge.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: True for an image edit whose pixels were left unread (see above); otherwise an item is
    #: an edit when it has a source.
    edit: bool = False

    @property
    def is_edit(self) -> bool:
        """An image edit (I2I), as opposed to a text-to-image output."""
        return self.edit or self.source is not None

    @cached_property
    def output_png(self) -> bytes:
        assert self.output is not None
        return encode_png(self.output)

    @cached_property
    def source_png(self) -> bytes:
        assert self.source is not None
        return encode_png(self.source)


@dataclass(frozen=True)
class JudgeAnswer:
    """A judge's answer about one item.

    ``scores`` maps each asked axis to its value when ``status`` is ``scored`` (empty
    otherwise); for the WinoBias question, each question to its answer (``first``, ...).
    ``reason`` says why an item was abstained on or errored. ``raw`` keeps every reply text
    in order (the first answer and the retry), ``call_ids`` their cache keys, and
    ``attempts`` the requests actually sent (0 when every reply came from the cache).
    ``labels_given``: the request stated the source's labels (see the module docstring).
    """

    status: AnswerStatus
    scores: Mapping[str, float | int | str] = field(default_factory=dict)
    reason: str = ""
    raw: tuple[str, ...] = ()
    call_ids: tuple[str, ...] = ()
    attempts: int = 0
    labels_given: bool = False
