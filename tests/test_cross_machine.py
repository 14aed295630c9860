"""The detectors' records are the same bytes on CPUs with and without AVX-512.

numpy computes the colour conversions' powers and roots with other SIMD code where AVX-512 is
present, so a measure's last bits depend on the CPU; the judgement tables (and through them
dvc.lock) differed between machines. ``NPY_DISABLE_CPU_FEATURES`` makes numpy take the other
machine's code path in a second process; the records must still be identical, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json
from acrb.config import PixelThresholds
from acrb.detect.pixels import measure_pixels
from acrb.models.synthetic_edits import compliant_edit, lighten_skin
from acrb.records import GenerationRecord, record_line
from acrb.sources.portraits import draw_portrait
from acrb.stages.evaluate import evaluator_hash, judge

thresholds = PixelThresholds()
evaluator = evaluator_hash(thresholds)
raw, stored = [], []
for tone in range(1, 11):
    source = draw_portrait("Black", "Female", "30s", 128, tone, skin_tone=tone).pixels
    output = lighten_skin(compliant_edit(source, "p1", tone), 8.0)
    m = measure_pixels(source, output, thresholds)
    raw.append([m.ita_source, m.ita_output, m.ita_shift, m.edit_fraction])
    generation = GenerationRecord(
        request_id=f"r{tone}", model="m", status="ok", image_path="x.png",
        image_sha256="0" * 64, model_revision="v", library_versions="{}")
    stored.append(record_line(judge(generation, source, output, thresholds, evaluator)))
print(json.dumps({"raw": raw, "stored": stored}))
"""
#: numpy's names for the AVX-512 code paths (numpy >= 2.4: the x86-64-v4 group).
WITHOUT_AVX512 = "X86_V4 AVX512_ICL AVX512_SPR"


def _probe(**env: str) -> dict[str, list]:
    result = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_judgement_records_do_not_depend_on_the_cpus_simd_code() -> None:
    here = _probe()
    other = _probe(NPY_DISABLE_CPU_FEATURES=WITHOUT_AVX512)
    if here["raw"] == other["raw"]:
        pytest.skip("this CPU runs the same numpy code either way (no AVX-512): nothing to compare")
    # The measures differ in their last bits ...
    assert here["raw"] != other["raw"]
    # ... and the records stored from them do not.
    assert here["stored"] == other["stored"]
