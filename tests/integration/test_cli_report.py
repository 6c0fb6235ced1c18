"""`snapanalyze report`: writes one HTML file atomically, never replaces one without --force, passes its
options through, reports every rank of a run directory (or the one --rank names), adds a diff against a
--compare baseline, and shows progress only on a terminal."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import snapanalyze.cli.report as cli_report
from snapanalyze import atomic
from snapanalyze.cli import main
from snapanalyze.cli.progress import Progress

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
RUNS = SCENARIOS.parent / "runs"
SWEEPS = SCENARIOS.parent / "sweeps"
FIXTURE = SCENARIOS / "oom_fragmentation.pickle"


def run(*args: object) -> Result:
    """The CLI; `report` gets few category samples unless the test sets them (they only cost time here)."""
    argv = [str(a) for a in args]
    if argv[0] == "report" and "--samples" not in argv:
        argv += ["--samples", "4"]
    return CliRunner().invoke(main, argv)


def test_writes_one_html_file_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = run("report", FIXTURE, "-o", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out} (") and result.stdout.rstrip().endswith("MB)")
    page = out.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert page.startswith("<!DOCTYPE html>") and "The peak on device 0 was 36.70 GiB" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]     # no temporary file left
    assert result.stderr == ""                                                # not a terminal: no progress


def test_refuses_to_replace_without_force(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text("keep me")
    result = run("report", FIXTURE, "-o", out)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"snapanalyze: error: {out}: exists already; pass --force to replace it"
    assert out.read_text() == "keep me"
    assert run("report", FIXTURE, "-o", out, "--force").exit_code == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_a_failure_midway_leaves_the_old_file_and_no_partial_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "report.html"
    out.write_text("previous report")

    def failing_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)       # the one atomic writer
    result = run("report", FIXTURE, "-o", out, "--force")
    assert result.exit_code != 0
    assert out.read_text() == "previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]     # the temporary file is gone


def test_bad_input_and_missing_directory_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    result = run("report", bad, "-o", tmp_path / "r.html")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and str(bad) in result.stderr
    result = run("report", FIXTURE, "-o", tmp_path / "missing" / "r.html")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    result = run("report", FIXTURE, "-o", tmp_path / "r.html", "--at", "peak:99")
    assert result.exit_code == 2 and "peak(s)" in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_options_reach_the_report(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = run("report", SCENARIOS / "concurrent_requests.pickle", "-o", out, "--redact-paths",
                 "--at", "event:700", "--at", "peak", "--samples", "4", "--top", "2")
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "At event 700 on device 0" in page and 'id="instant-d0-p1"' in page
    assert str(SCENARIOS) not in page and "srv/scoring" not in page


def test_capacity_completes_the_oom_verdict_of_a_lone_snapshot(tmp_path: Path) -> None:
    """A snapshot outside a run has no NVML or meta.json: --capacity supplies the device memory."""
    path = SCENARIOS / "oom_live_exhaustion.pickle"
    assert run("report", path, "-o", tmp_path / "a.html").exit_code == 0
    assert "unknown: no NVML samples or meta.json" in (tmp_path / "a.html").read_text(encoding="utf-8")
    result = run("report", path, "-o", tmp_path / "b.html", "--capacity", "23.52GiB")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "b.html").read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "23.52 GiB capacity, 771.48 MiB of it outside the allocator" in page
    assert "given (--capacity)" in page and "unknown: no NVML samples or meta.json" not in page
    bad = run("report", path, "-o", tmp_path / "c.html", "--capacity", "lots")
    assert bad.exit_code == 2 and "Invalid value for '--capacity': not a size: 'lots'" in bad.stderr
    assert not (tmp_path / "c.html").exists()


def test_a_run_directory_reports_every_rank_and_rank_chooses_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank, name in ((0, "oom_fragmentation"), (1, "prompt_logprobs_logits")):
        (run_dir / f"rank={rank}").mkdir(parents=True)
        shutil.copy(SCENARIOS / f"{name}.pickle", run_dir / f"rank={rank}" / "snapshot-final.pickle")
    out = tmp_path / "r.html"
    result = run("report", run_dir, "--rank", "1", "-o", out)
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "1 device, 619 events, rank 1" in page and "71.52 GiB" in page and "36.70 GiB" not in page
    both = tmp_path / "both.html"
    result = run("report", run_dir, "-o", both)
    assert result.exit_code == 0, result.output
    page = both.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "2 ranks (0, 1)" in page and "The peak on rank 0 was 36.70 GiB" in page and "rank 1 was 71.52 GiB" in page
    assert "Rank 0 ran out of memory" in page and '<section id="ranks">' in page
    assert "no nvml-part-*.parquet" in page            # what the run directory lacks is said, not fatal
    (run_dir / "rank=1" / "snapshot-final.pickle").rename(run_dir / "rank=1" / "snapshot-a.pickle")
    shutil.copy(run_dir / "rank=1" / "snapshot-a.pickle", run_dir / "rank=1" / "snapshot-b.pickle")
    result = run("report", run_dir, "-o", tmp_path / "partial.html")
    assert result.exit_code == 0, result.output
    partial = (tmp_path / "partial.html").read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "several snapshots (a, b)" in partial and "rank 1, tag final" not in partial
    (run_dir / "rank=0" / "snapshot-final.pickle").unlink()
    result = run("report", run_dir, "-o", tmp_path / "x.html")
    assert result.exit_code == 2 and "no snapshot to report" in result.stderr and "--tag" in result.stderr
    assert not (tmp_path / "x.html").exists()


def test_a_run_with_nvml_and_markers(tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    result = run("report", RUNS / "tp2_vision_encoder", "-o", out, "--top", "1")
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert "The peak on rank 1 was 59.41 GiB active" in page and "during prefill#1" in page
    assert 'id="fig-timeline-r0-d0"' in page and 'id="fig-outside"' in page


def test_compare_adds_the_diff_section(tmp_path: Path) -> None:
    fix = SWEEPS / "logits_float_fix"
    out = tmp_path / "diff.html"
    result = run("report", fix / "after.pickle", "--compare", fix / "before.pickle", "-o", out)
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8").replace("\u00a0", " ")
    assert '<section id="diff">' in page and "fell by 1.96 GiB" in page
    missing = run("report", fix / "after.pickle", "--compare", tmp_path / "nope.pickle", "-o", tmp_path / "y.html")
    assert missing.exit_code == 2 and "nope.pickle" in missing.stderr
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    result = run("report", fix / "after.pickle", "--compare", bad, "-o", tmp_path / "y.html")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and str(bad) in result.stderr
    assert not (tmp_path / "y.html").exists()


def test_progress_is_shown_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class OnTerminal(Progress):
        def __init__(self) -> None:
            super().__init__(enabled=True)

    monkeypatch.setattr(cli_report, "Progress", OnTerminal)
    result = run("report", FIXTURE, "-o", tmp_path / "r.html")
    assert result.exit_code == 0
    for step in ("loading…", "replaying…", "attributing…", "rendering…", "writing…"):
        assert f"snapanalyze: {step}" in result.stderr
    assert result.stderr.endswith("\r\033[K")          # the line is erased at the end
    assert "snapanalyze:" not in result.stdout


def test_progress_writes_nothing_when_piped() -> None:
    class Pipe(io.StringIO):
        def isatty(self) -> bool:
            return False

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped, tty = Pipe(), Tty()
    for stream in (piped, tty):
        p = Progress(stream=stream)
        p.step("loading")
        p.done()
    assert piped.getvalue() == ""
    assert tty.getvalue().startswith("\r\033[Ksnapanalyze: loading… 0.0 s")


def test_a_run_report_labels_each_instant_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's analyses (rank peaks, phases, categories over time, the views) ask for the same instants;
    each distinct one is labelled once per snapshot (86 labellings for 74 instants before the shared cache)."""
    import snapanalyze.analyze.attribute as attribution
    asked: list[tuple[int, int, int | None]] = []
    real = attribution.label

    def counted(snapshot, device, live, decider, markers=None, at_time=None, at_index=None,  # type: ignore[no-untyped-def]
                by_size=False, window=None):
        asked.append((id(snapshot), device, at_index))
        return real(snapshot, device, live, decider, markers, at_time, at_index, by_size, window)
    monkeypatch.setattr(attribution, "label", counted)
    result = run("report", RUNS / "tp2_vision_encoder", "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert len(asked) > 10 and len(asked) == len(set(asked))


def test_equal_markers_tables_are_one_key() -> None:
    from snapanalyze.analyze.attribute import markers_key
    from snapanalyze.load.samples import read_run
    samples = read_run(RUNS / "tp2_vision_encoder")
    one, again = samples.markers_of(0), samples.markers_of(0)
    assert one is not again and markers_key(one) == markers_key(again) is not None
    assert markers_key(samples.markers_of(1)) != markers_key(one) and markers_key(one.iloc[0:0]) is None
    changed = one.copy()
    changed.loc[0, "name"] = changed.loc[0, "name"] + "x"
    assert markers_key(changed) != markers_key(one)
