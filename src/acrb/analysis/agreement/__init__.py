"""Judges and people: the judges' tables (:mod:`.judging`), tests on their scores by group
(:mod:`.judge_scores`), agreement between raters and between judges and people
(:mod:`.raters`), and rates corrected by people's ratings (:mod:`.corrected`)."""
