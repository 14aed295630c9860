"""Screenshots of the MLflow UI on a tracking store (headless chromium).

Serves a tracking store with `mlflow server` on a free local port and saves one page:

- `--view runs`: the address `acrb mlflow-url` prints, the runs table with every model's Δ
  beside each pipeline run (the `analyze` stage's shared view), in a 1920 x 1080 window;
- `--view compare` (the default): the compare view of the newest pipeline run's
  `analyze/<model>` runs of the two named models.

    python benchmarks/mlflow_compare_screenshot.py --view runs --store mlflow.db \
        --out benchmarks/results/mlflow-runs.png
    python benchmarks/mlflow_compare_screenshot.py --store mlflow.db \
        --models synthetic-fair synthetic-biased --out build/mlflow-compare.png

The store comes from `dvc repro` (or any run of the stages with tracking on).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the local-server helpers live with the tests

from tests.servers import MLFLOW_SERVER_ENV, free_port, stop, wait_for  # noqa: E402


def compare_url(base: str, store: Path, models: list[str]) -> str:
    """The compare-view URL of the newest pipeline run's analyze runs of ``models``."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store.resolve()}")
    experiment = client.get_experiment_by_name("acrb/embedded-default")
    if experiment is None:
        raise SystemExit(f"{store} has no experiment acrb/embedded-default")
    runs = client.search_runs([experiment.experiment_id],
                              filter_string="tags.`acrb.stage` = 'analyze'",
                              order_by=["attributes.start_time DESC"])
    parent = runs[0].data.tags["mlflow.parentRunId"]
    chosen = {r.data.tags["acrb.model"]: r.info.run_id for r in runs
              if r.data.tags.get("mlflow.parentRunId") == parent}
    missing = [m for m in models if m not in chosen]
    if missing:
        raise SystemExit(f"no analyze run of {missing} under the newest pipeline run")
    query = urllib.parse.urlencode({
        "runs": json.dumps([chosen[m] for m in models]),
        "experiments": json.dumps([experiment.experiment_id])})
    return f"{base}/#/compare-runs?{query}"


def runs_url(base: str, store: Path, profile: str) -> str:
    """The address `acrb mlflow-url` prints for a UI at ``base`` serving ``store``."""
    from acrb.tracking import runs_address

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store.resolve()}"
    address, why = runs_address(profile, base)
    if why:
        raise SystemExit(why)
    return address


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--view", choices=["compare", "runs"], default="compare")
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"))
    parser.add_argument("--profile", default="embedded-default",
                        help="the params profile whose experiment --view runs opens")
    parser.add_argument("--models", nargs=2, default=["synthetic-fair", "synthetic-biased"])
    parser.add_argument("--out", type=Path,
                        help="default: build/mlflow-compare.png, benchmarks/results/"
                             "mlflow-runs.png with --view runs")
    parser.add_argument("--window", help="width,height in pixels (default: 1400,2600 for "
                        "compare, tall enough for its metrics table; 1920,1080 for runs)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    runs = args.view == "runs"
    out = args.out or Path("benchmarks/results/mlflow-runs.png" if runs
                           else "build/mlflow-compare.png")
    window = args.window or ("1920,1080" if runs else "1400,2600")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{args.store.resolve()}", "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **MLFLOW_SERVER_ENV})
    try:
        wait_for(f"{base}/health", server)
        url = (runs_url(base, args.store, args.profile) if runs
               else compare_url(base, args.store, args.models))
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="acrb-chromium-") as profile:
            subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            f"--user-data-dir={profile}", "--hide-scrollbars",
                            "--virtual-time-budget=20000", f"--window-size={window}",
                            f"--screenshot={out.resolve()}", url],
                           check=True, capture_output=True, timeout=180)
        print(f"{out}: {url}")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
