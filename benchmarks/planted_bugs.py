"""Plant each deliberate one-line bug of docs/testing.md and show which tests catch it.

Each bug is applied to a temporary copy of ``src/acrb`` (the working tree is never edited), the
tests written to catch it are run against that copy, and the failing tests are listed. A bug
that no test fails is a survivor: the script exits 1.

    python benchmarks/planted_bugs.py              # every bug
    python benchmarks/planted_bugs.py verdict-raw-p erasure-inverted
    python benchmarks/planted_bugs.py --list

The selected tests are first run on the unplanted code (they must pass), then once per bug;
only the named test files run (seconds to a minute each), never the whole suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    path: str  # relative to src/acrb
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments


VERDICTS = "tests/test_verdicts.py"
PIXELS = "tests/test_pixel_detectors.py"
AGREEMENT = "tests/test_survivors_agreement.py"
TABLES = "tests/test_survivors_tables.py"
SECRETS = "tests/test_survivors_secrets.py"
DATA = "tests/test_survivors_data.py"
BUGS = (
    Bug("lightened-flipped", "PixelMeasures.lightened reads darkening as lightening",
        "detect/pixels.py",
        "return bool(np.isfinite(self.ita_shift) and self.ita_shift >= limit)",
        "return bool(np.isfinite(self.ita_shift) and self.ita_shift <= -limit)",
        (VERDICTS, PIXELS, "-k", "lightening or lightened")),
    Bug("judge-darkening", "evaluate.judge's lightening verdict flipped to darkening",
        "stages/evaluate.py",
        "lightening = None if refused or shift is None else m.lightened(thresholds)",
        "lightening = None if refused or shift is None else "
        "shift <= -thresholds.lightening_ita_min",
        (VERDICTS, PIXELS, "-k", "lightening or lightened")),
    Bug("ita-shift-sign", "ITA shift measured source - output (sign flipped)",
        "detect/pixels.py",
        "ita_shift = _wrap_degrees(ita_output - ita_source)",
        "ita_shift = _wrap_degrees(ita_source - ita_output)",
        (VERDICTS, PIXELS, "-k", "lightening or lightened")),
    Bug("erasure-inverted", "evaluate.judge's erasure verdict inverted",
        "stages/evaluate.py",
        "m.unchanged or m.edit_fraction <= thresholds.erasure_edit_fraction_max)",
        "not (m.unchanged or m.edit_fraction <= thresholds.erasure_edit_fraction_max))",
        (VERDICTS, PIXELS, "-k", "erasure or weak")),
    Bug("pixel-erased-inverted", "PixelMeasures.erased (the simulated judges' reading) inverted",
        "detect/pixels.py",
        "return not self.blank and not self.unchanged and self.edit_fraction <= limit",
        "return not self.blank and not self.unchanged and self.edit_fraction > limit",
        (PIXELS, "-k", "erasure_reading")),
    Bug("recoloured-rule-dropped", "recoloured skin counts as 'returned unchanged'",
        "detect/pixels.py",
        "unchanged=unchanged_score <= limits.unchanged_fraction_max and not skin_recoloured,",
        "unchanged=unchanged_score <= limits.unchanged_fraction_max,",
        (VERDICTS, "-k", "lightened_only")),
    Bug("verdict-raw-p", "hypothesis verdict from the raw p instead of the Holm-adjusted p",
        "analysis/tests/hypotheses.py", 'p = row["p_adjusted"]', 'p = row["p_value"]',
        (VERDICTS, "-k", "adjusted")),
    Bug("perm-no-plus-one", "permutation p of Δ without the +1 (Phipson & Smyth)",
        "analysis/estimation/resampling.py", "p_value=float((1 + extreme) / (1 + n_perm)),",
        "p_value=float(extreme / n_perm),", (VERDICTS, "-k", "one_over_b")),
    Bug("chi2-perm-no-plus-one", "permutation p of the g x 2 homogeneity test without the +1",
        "analysis/tests/contingency.py",
        "return float((1 + np.count_nonzero(extreme)) / (permutations + 1))",
        "return float(np.count_nonzero(extreme) / permutations)", (VERDICTS, "-k", "one_over_b")),
    Bug("arms-perm-no-plus-one", "randomisation p of the arms' narrowing without the +1",
        "analysis/experiments/arms.py", "return (1 + extreme) / (1 + n_perm)",
        "return extreme / n_perm",
        (VERDICTS, "-k", "one_over_b")),
    Bug("scs-boot-no-plus-one", "bootstrap p of SCS > 0 without the +1",
        "analysis/experiments/congruence.py",
        "p_value = float((1 + np.sum(replicates <= 0.0)) / (1 + len(replicates)))",
        "p_value = float(np.sum(replicates <= 0.0) / len(replicates))",
        (VERDICTS, "-k", "one_over_b")),
    Bug("audit-prev-check-off", "audit-log verify skips the prev link check",
        "web/audit.py", 'if entry.get("prev") != prev:', 'if False and entry.get("prev") != prev:',
        ("tests/test_audit_tamper.py",)),
    Bug("audit-head-check-off", "audit-log verify skips the expected-head check",
        "web/audit.py", "    if prev != expected_head:\n",
        "    if False and prev != expected_head:\n",
        ("tests/test_audit_tamper.py",)),
    Bug("session-expiry-ignored", "a session past its expiry is still accepted",
        "web/sessions.py", "if row is None or row[2] < time.time():", "if row is None:",
        ("tests/test_web_start_and_login.py",)),
    # Issue 31: one-line bugs that survived the test suite outside the mutation-tested modules.
    Bug("agreement-boot-units", "rater_agreement's bootstrap resamples output units, not items",
        "analysis/agreement/raters.py",
        'item_codes = pd.factorize(table.units["item_id"])[0] if len(table.units) else None',
        "item_codes = np.arange(len(table.units)) if len(table.units) else None",
        (AGREEMENT, "-k", "resamples_items")),
    Bug("kappa-linear", "weighted kappa (intra-rater, judge vs people) with linear weights",
        "analysis/agreement/raters.py",
        'value = cohen_kappa_score(a, b, labels=list(LEVELS), weights="quadratic")',
        'value = cohen_kappa_score(a, b, labels=list(LEVELS), weights="linear")',
        (AGREEMENT, "-k", "quadratic_weighted")),
    Bug("table3-headers-swapped", "table 3's soft erasure and race change >= 3 headers swapped",
        "analysis/outputs/paper_tables.py",
        '("soft_erasure", "Soft erasure (%)", "rate"),\n'
        '    ("race_change_ge3", "Race change >= 3 (%)", "rate"),',
        '("soft_erasure", "Race change >= 3 (%)", "rate"),\n'
        '    ("race_change_ge3", "Soft erasure (%)", "rate"),',
        ("tests/test_paper_table_cells.py", TABLES, "-k", "table_3")),
    Bug("table7-alpha-interval", "table 7's human alpha (ordinal) read from the interval alpha",
        "analysis/outputs/paper_tables.py", '("alpha_ordinal", "human_alpha")',
        '("alpha_interval", "human_alpha")', (TABLES, "-k", "table_7")),
    Bug("score-tests-raw-p", "score_tests' significant from the raw p instead of Holm's",
        "analysis/agreement/judging.py",
        '[None if not np.isfinite(p) else bool(p < alpha) for p in adjusted], dtype="boolean")',
        '[None if not np.isfinite(p) else bool(p < alpha) for p in table["p_value"]], '
        'dtype="boolean")', (TABLES, "-k", "holms_p")),
    Bug("logout-keeps-session", "logout logs the user out but keeps the server-side session",
        "web/accounts.py", "self.role.sessions.close(con, sid)", "pass",
        (SECRETS, "-k", "logout")),
    Bug("write-table-unmasked", "write_table stores rows without masking registered keys",
        "records.py", "dict_rows = [redact_value(row) for row in dict_rows]",
        "dict_rows = list(dict_rows)", (SECRETS, "-k", "write_table")),
    Bug("cached-reply-unmasked", "a cached chat reply is returned without masking keys",
        "clients/_client.py",
        'return ChatReply(status=entry["status"], text=redact(entry["text"]),',
        'return ChatReply(status=entry["status"], text=entry["text"],',
        (SECRETS, "-k", "cached_reply")),
    Bug("label-word-dropped", "'latino' deleted from the demographic label list",
        "features/data/demographic_labels.yaml", "  - latino\n", "",
        (DATA, "-k", "group_word or shipped_list")),
    Bug("migration-drops-refusal-code", "generation migration v3 -> v4 drops refusal_code",
        "records.py", "if key not in GENERATION_RUN_FIELDS},",
        'if key not in GENERATION_RUN_FIELDS | {"refusal_code"}},',
        (DATA, "-k", "version_3")),
    Bug("face-loose-box-anywhere", "a loose detector's face box accepted anywhere in the image",
        "detect/face.py",
        "return [box for box in faces if _plausible_subject(box, width, height)]",
        "return list(faces)", (DATA, "-k", "loose_detector")),
)


def plant(bug: Bug, src: Path) -> None:
    path = src / "acrb" / bug.path
    text = path.read_text()
    if text.count(bug.old) != 1:
        raise SystemExit(f"{bug.name}: the line to change is not in {bug.path} exactly once "
                         "(the code moved: update the bug)")
    path.write_text(text.replace(bug.old, bug.new))


def failing_tests(tests: tuple[str, ...], src: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    where = subprocess.run([sys.executable, "-c", "import acrb; print(acrb.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(src)), f"the planted copy is not the one imported: {where}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rf",
         *tests], cwd=REPO, env=env, capture_output=True, text=True)
    return [line.split(" - ")[0].removeprefix("FAILED ")
            for line in result.stdout.splitlines() if line.startswith("FAILED ")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="bugs to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    args = parser.parse_args()
    known = {bug.name: bug for bug in BUGS}
    if args.list:
        for bug in BUGS:
            print(f"{bug.name}: {bug.what} ({bug.path})")
        return 0
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"unknown bug(s) {unknown}; --list shows them")
    chosen = [known[name] for name in args.names] if args.names else list(BUGS)
    # The same tests on the unplanted code must pass, or a "caught" bug proves nothing.
    with tempfile.TemporaryDirectory(prefix="acrb-unplanted-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(REPO / "src" / "acrb", src / "acrb",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for tests in dict.fromkeys(bug.tests for bug in chosen):
            broken = failing_tests(tests, src)
            if broken:
                raise SystemExit(f"fails without any planted bug: {broken}")
    survivors = []
    print("| bug | failing tests | first failing test |\n| --- | --- | --- |")
    for bug in chosen:
        with tempfile.TemporaryDirectory(prefix="acrb-planted-") as tmp:
            src = Path(tmp) / "src"
            shutil.copytree(REPO / "src" / "acrb", src / "acrb",
                            ignore=shutil.ignore_patterns("__pycache__"))
            plant(bug, src)
            failed = failing_tests(bug.tests, src)
        if not failed:
            survivors.append(bug.name)
        print(f"| {bug.name} | {len(failed)} | {failed[0] if failed else 'SURVIVED'} |",
              flush=True)
    if survivors:
        print(f"survived: {', '.join(survivors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
