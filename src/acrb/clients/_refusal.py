"""Refusal detection in a chat reply's text: first-person refusal formulas, conservatively."""

from __future__ import annotations

import re

# "I can't", "I cannot", "I won't", "I'm unable to", "I am not able to", ...
_I_NEG = (r"i(?:\s+(?:can't|cannot|can\s+not|won't|will\s+not|am\s+unable\s+to"
          r"|am\s+not\s+able\s+to)|'m\s+(?:unable|not\s+able)\s+to)")
_ACT = (r"(?:help|assist|create|provide|comply|generate|write|produce|fulfil|fulfill|do\s+that"
        r"|do\s+this|make|support|engage|continue|complete|draft|describe)")
# Only the opening of a reply is inspected: a synthesised image prompt may well contain "can't"
# or "sorry" ("a nurse who can't stop smiling"), but it does not open with a first-person
# refusal formula.
_REFUSAL_START = re.compile(
    r"""^(?:
        (?:i'm|i\s+am)\s+(?:really\s+|very\s+|so\s+|truly\s+)?sorry\s*(?:,|but\b|;|\.|!|-)
      | sorry\s*,?\s*(?:but\s+)?""" + _I_NEG + r"""
      | """ + _I_NEG + r"""\s+(?:\w+\s+)?""" + _ACT + r"""\b
      | i\s+apologi[sz]e\b
      | unfortunately\s*,?\s*""" + _I_NEG + r"""
      | as\s+an?\s+(?:ai|language\s+model|llm)(?:\s+(?:language\s+model|assistant|model))?\s*,
      | i\s+(?:must|have\s+to|need\s+to|will\s+have\s+to)\s+(?:respectfully\s+)?(?:decline|refuse)
      | i\s+(?:do\s+not|don't)\s+feel\s+comfortable\b
      | i'm\s+not\s+comfortable\b
    )""",
    re.IGNORECASE | re.VERBOSE,
)
# In a short reply, these phrases mean a refusal wherever they stand ("Understood. However, I
# can't help with that.").
_REFUSAL_ANYWHERE = re.compile(
    r"\b" + _I_NEG + r"\s+(?:help|assist|comply)\s+with\b"
    r"|\bi\s+(?:must|have\s+to|need\s+to)\s+(?:respectfully\s+)?decline\b"
    r"|\bagainst\s+my\s+(?:guidelines|policies|programming)\b",
    re.IGNORECASE,
)
_SHORT_REPLY = 300
_LEADING_NOISE = re.compile(r"^[\s\"'“”‘’`*_>#\-]+")


def looks_like_refusal(text: str) -> bool:
    """True when ``text`` reads like a model declining the request ("I'm sorry, but I can't").

    Deliberately conservative: only first-person refusal formulas at the start of the reply (or,
    in a short reply, a few unambiguous phrases anywhere) count, so an ordinary image prompt
    such as "A photo of a nurse who can't stop smiling" is never flagged.
    """
    normalised = text.replace("’", "'").replace("‘", "'").strip()
    normalised = _LEADING_NOISE.sub("", normalised)
    if not normalised:
        return False
    if _REFUSAL_START.match(normalised):
        return True
    return len(normalised) <= _SHORT_REPLY and bool(_REFUSAL_ANYWHERE.search(normalised))

