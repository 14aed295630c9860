"""Judges: what reads a generation the way a person would and scores it on a rubric.

- :mod:`acrb.judges.base`: :class:`JudgeItem`, :class:`JudgeAnswer`, the :class:`Judge` base;
- :mod:`acrb.judges.rubric`: the versioned rubric (``rubrics/*.yaml``), prompts and validation;
- :mod:`acrb.judges.vlm`: a vision-language model behind any chat backend of
  :mod:`acrb.clients` (transformers, OpenAI-compatible, Gemini);
- :mod:`acrb.judges.simulated`: a pixel-reading judge with planted group-dependent errors, so
  the embedded default can show a judge's bias propagating into the measured disparities;
- :mod:`acrb.judges.ensemble`: the study's two-judge rule (and mean, median, first), the
  outcomes read from it, and judge-judge agreement.
"""

from acrb.judges.base import Judge
from acrb.judges.items import JudgeAnswer, JudgeItem

__all__ = ["Judge", "JudgeAnswer", "JudgeItem"]
