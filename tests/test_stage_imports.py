"""The stages that read the analysis (report, tables) and the review analysis import no
statistics or plotting library until they use one: seaborn with scipy.stats took about 2 s
and statsmodels, scikit-posthocs and scikit-learn another 1.5 s of each stage process's start,
paid by stages that never fit a model or draw a figure (`python -X importtime`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Imported only where used (inside the functions that fit, test or draw).
HEAVY = ("seaborn", "matplotlib", "statsmodels", "scikit_posthocs", "sklearn", "scipy.stats")


@pytest.mark.parametrize("module", ["acrb.stages.analyze", "acrb.stages.report",
                                    "acrb.stages.tables", "acrb.stages.review",
                                    "acrb.analysis.agreement.judging",
                                    "acrb.analysis.outputs.section",
                                    "acrb.analysis.outputs.figures",
                                    "acrb.analysis.outputs.dvc_plots"])
def test_importing_a_stage_imports_no_heavy_library(module: str) -> None:
    code = (f"import sys, json, {module}; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert json.loads(result.stdout) == []


def test_the_first_figure_brings_seaborn_with_a_headless_backend() -> None:
    code = ("import sys, matplotlib; from acrb.analysis.outputs.figures import plotting; "
            "sns = plotting(); print(sys.modules['seaborn'] is sns, matplotlib.get_backend())")
    # A display backend asked for by the environment is not the one figures are drawn with.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={**os.environ, "MPLBACKEND": "TkAgg"})
    assert result.stdout.split() == ["True", "Agg"]
