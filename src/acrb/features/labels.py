"""Does a feature description name a demographic group? The check every feature prompt passes.

A feature prompt must describe what is visible (colours, shapes, textures) and never say which
race, ethnicity or nationality a person belongs to: the feature arm tests whether describing a
face keeps it intact, and a label would turn it into a demographic instruction. The word lists
are data (``data/demographic_labels.yaml``); matching is case-insensitive on whole words.

The hard part is colour words. "black hair", "white teeth", "brown eyes" and "the whites of the
eyes" are observable descriptions; "a Black man", "white woman", "of black descent",
"she is white" and "white skin" use the colour as a group label. A colour word is therefore a
label only

- before a word for a person or for descent, optionally with one age or gender adjective
  between ("a black young man", "white descent");
- after a person subject and a copula ("he is black", "the person looks white"), not after
  another noun ("the hair is black");
- applied to skin, for the person-colour words ("white skin", "black-skinned", "skin is
  white"): no skin is white or black, and describing its depth (fair, light, brown, deep brown)
  says what is visible. "brown skin" is a description and passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from acrb.storage import sha256_file

LABELS_FILE = Path(__file__).parent / "data" / "demographic_labels.yaml"


def _alternation(words: list[str]) -> str:
    # Longest first, so a phrase wins over a word it contains ("east asian" over "asian").
    ordered = sorted({w.lower() for w in words}, key=lambda w: (-len(w), w))
    return "|".join(re.escape(w).replace(r"\ ", r"[\s-]+") for w in ordered)


@dataclass(frozen=True)
class LabelCheck:
    """The compiled word lists of one labels file; :meth:`find` applies them."""

    version: int
    sha256: str
    groups: re.Pattern[str]
    colour_person: re.Pattern[str]
    subject_colour: re.Pattern[str]
    colour_skin: re.Pattern[str]
    skin_colour: re.Pattern[str]
    allowed: re.Pattern[str]

    @classmethod
    def load(cls, path: Path = LABELS_FILE) -> LabelCheck:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        colours = _alternation(data["colour_labels"])
        skin_colours = _alternation(data["skin_labels"])
        persons = _alternation(data["person_nouns"])
        between = _alternation(data["between"])
        subjects = _alternation(data["subjects"])
        verbs = _alternation(data["verbs"])
        skin = _alternation(data["skin_words"])
        flags = re.IGNORECASE
        return cls(
            version=int(data["version"]),
            sha256=sha256_file(path),
            # A group word stays one with a hyphen after it ("Asian-looking").
            groups=re.compile(rf"(?<!\w)(?:{_alternation(data['groups'])})(?!\w)", flags),
            colour_person=re.compile(
                rf"(?<![\w-])(?:{colours})\s+(?:(?:{between})\s+)?(?:{persons})(?![\w-])", flags),
            subject_colour=re.compile(
                rf"(?<![\w-])(?:{subjects})\s+(?:{verbs})\s+(?:to\s+be\s+)?(?:{colours})"
                rf"(?![\w-])", flags),
            colour_skin=re.compile(rf"(?<![\w-])(?:{skin_colours})[\s-]+(?:{skin})(?![\w-])",
                                   flags),
            skin_colour=re.compile(
                rf"(?<![\w-])(?:{skin})\s+(?:tone\s+)?(?:{verbs})\s+(?:(?:very|quite|rather|"
                rf"almost|pure)\s+)?(?:{skin_colours})(?![\w-])", flags),
            allowed=re.compile(rf"(?<![\w-])(?:{_alternation(data['allowed'])})(?![\w-])",
                               flags),
        )

    def find(self, text: str) -> list[str]:
        """The group labels ``text`` uses, lower-cased with single spaces, in order of
        appearance, each once; empty when it names none."""
        cleaned = self.allowed.sub(lambda m: " " * len(m.group(0)), text)
        found: list[tuple[int, str]] = []
        for pattern in (self.groups, self.colour_person, self.subject_colour, self.colour_skin,
                        self.skin_colour):
            found += [(m.start(), " ".join(m.group(0).lower().split()))
                      for m in pattern.finditer(cleaned)]
        seen: dict[str, None] = {}
        for _, label in sorted(found):
            seen.setdefault(label, None)
        return list(seen)


@lru_cache(maxsize=4)
def label_check(path: Path = LABELS_FILE) -> LabelCheck:
    """The label check of ``path`` (the shipped word lists by default), compiled once."""
    return LabelCheck.load(path)


def demographic_labels(text: str) -> list[str]:
    """The race, ethnicity or nationality labels ``text`` names (see the module docstring);
    empty when it describes only what is visible."""
    return label_check().find(text)
