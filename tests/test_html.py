"""The HTML report: deterministic, self-contained, bounded, escaped, redactable, and built from sections that
later analyses extend. A golden normalised copy of a small report is checked in (`pytest --update-golden`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline
import pytest
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import UsageError, load
from snapanalyze.report.context import ReportContext, build_context
from snapanalyze.report.html import PLOTLY_MARKER, build_report, normalise, render_report, script_json
from snapanalyze.report.redact import redact_path
from snapanalyze.report.sections import DEFAULT_SECTIONS, ORDER, FigureSpec, Section
from snapanalyze.report.templating import render

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "fixtures" / "scenarios"
GOLDEN = Path(__file__).resolve().parent / "golden" / "prompt_logprobs_logits.report.html"
MiB = 1 << 20
BASE = 0x7F00_0000_0000


def body(page: str) -> str:
    """The report without the inlined plotly.js bundle."""
    return normalise(page)


# -- golden -------------------------------------------------------------------------------------------------

def test_golden_report(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    page = normalise(build_report(load("fixtures/scenarios/prompt_logprobs_logits.pickle")))
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(page, encoding="utf-8")
    assert GOLDEN.exists(), "no golden file yet: run `python -m pytest tests/test_html.py --update-golden`"
    expected = GOLDEN.read_text(encoding="utf-8")
    assert page == expected, ("the report differs from tests/golden/; if the change is intended, run "
                              "`python -m pytest tests/test_html.py --update-golden` and review the diff")


def test_golden_file_is_normalised_and_small() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    assert PLOTLY_MARKER in text and "snapanalyze {version}" in text
    assert len(text) < 400_000
    assert "The peak on device 0 was 71.52 GiB active" in text


# -- self-contained, deterministic, bounded -----------------------------------------------------------------

def test_plotly_js_is_inlined_exactly_once_and_nothing_is_fetched() -> None:
    page = build_report(load(SCENARIOS / "oom_live_exhaustion.pickle"), samples=4)
    js = plotly.offline.get_plotlyjs()
    assert page.count(js[:500]) == 1 and page.count(js[-500:]) == 1
    rest = body(page)
    assert "<script src" not in rest and "<link" not in rest and "@import" not in rest
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", rest)
    assert "default-src 'none'" in rest      # the CSP forbids every fetch


def test_the_same_input_gives_the_same_bytes_whatever_the_hash_seed(tmp_path: Path) -> None:
    script = ("import hashlib, sys; from snapanalyze import load; from snapanalyze.report.html import build_report;"
              "print(hashlib.sha256(build_report(load(sys.argv[1]), samples=8).encode()).hexdigest())")
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script, str(SCENARIOS / "concurrent_requests.pickle")],
                             env=env, capture_output=True, text=True, check=True, cwd=ROOT)
        digests.add(out.stdout.strip())
    page = build_report(load(SCENARIOS / "concurrent_requests.pickle"), samples=8)
    digests.add(hashlib.sha256(page.encode()).hexdigest())
    assert len(digests) == 1
    assert not re.search(r"20\d\d-\d\d-\d\dT", body(page))     # no generation timestamp


def long_trace(tmp_path: Path, pairs: int) -> Path:
    b = SnapshotBuilder(frames=False)
    for i in range(pairs):
        b.alloc(BASE + (i % 7) * 4 * MiB, MiB + 512 * (i % 13))
        b.free(BASE + (i % 7) * 4 * MiB, MiB + 512 * (i % 13))
    return write_pickle(tmp_path / f"long-{pairs}.pickle", b.build(n_devices=1))


def test_report_size_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    small = body(build_report(load(long_trace(tmp_path, 3_000)), samples=8))
    large = body(build_report(load(long_trace(tmp_path, 30_000)), samples=8))
    assert "min/max envelope" in large
    assert len(large) < 1_000_000
    assert len(large) - len(small) < 100_000      # 10× the events, about the same report


def test_script_json_cannot_end_its_script_element() -> None:
    value = {"name": "</script><script>alert(1)</script>", "c": "<!-- & \u2028 \u2029", "n": [1, 2.5, None]}
    text = script_json(value)
    assert not set("<>&") & set(text) and "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == value
    assert list(json.loads(script_json({"b": 1, "a": 2}))) == ["a", "b"]


# -- content ------------------------------------------------------------------------------------------------

def test_verdict_names_the_peak_and_the_transient_categories() -> None:
    page = body(build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle")))
    verdict = page[page.index('<section id="verdict"'):page.index("</section>")]
    assert ("The peak on device 0 was 71.52 GiB active (72.46 GiB reserved), at 2.38 ms into the 2.41 ms window "
            "(event 598 of 619).") in verdict
    assert "9.56 GiB logits" in verdict and "on top of 46.88 GiB kv_cache and 14.96 GiB weights" in verdict
    for section in ("timelines", "categories", "instants", "rules", "facts"):
        assert f'<section id="{section}">' in page
    assert 'id="fig-timeline-d0"' in page and 'id="fig-icicle-d0-p1"' in page


def test_inferred_categories_are_flagged() -> None:
    page = body(build_report(load(SCENARIOS / "concurrent_requests.pickle"), samples=4))
    verdict = page[page.index('<section id="verdict"'):page.index("</section>")]
    assert "7.34 GiB logits (inferred from tensor sizes)" in verdict
    assert '<span class="flag"' in page


def test_oom_entries_get_a_section_and_a_verdict_line() -> None:
    page = body(build_report(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4))
    assert '<section id="oom">' in page
    assert ("Device 0 ran out of memory at 6.401 s into the 6.401 s window (event 66 of 67): a 1.96 GiB request "
            "failed with 1.08 GiB free on the device") in page
    no_oom = body(build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle"), samples=4, top=1))
    assert 'id="oom"' not in no_oom and "ran out of memory" not in no_oom


def test_at_replaces_the_peaks_as_detail_instants() -> None:
    page = body(build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle"), at=["event:100", "peak:2", "event:19"],
                                     samples=4))
    assert "At event 100 on device 0, " in page
    assert 'id="instant-d0-e100"' in page and 'id="instant-d0-p2"' in page
    assert 'id="instant-d0-e19"' not in page      # peak 2 is event 19: attributed once, under its first name
    assert 'id="instant-d0-p1"' not in page


def test_every_device_gets_its_own_figures(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    for device in (0, 1):
        b.alloc(BASE + device * (1 << 32), (device + 1) * MiB, device=device)
        b.free(BASE + device * (1 << 32), (device + 1) * MiB, device=device)
    page = body(build_report(load(write_pickle(tmp_path / "two.pickle", b.build()))))
    for device in (0, 1):
        assert f'id="fig-timeline-d{device}"' in page and f"The peak on device {device} was" in page
    only = body(build_report(load(write_pickle(tmp_path / "two.pickle", b.build())), device=1))
    assert 'id="fig-timeline-d0"' not in only
    with pytest.raises(UsageError):
        build_report(load(tmp_path / "two.pickle"), device=5)


def test_an_empty_snapshot_still_makes_a_page(tmp_path: Path) -> None:
    page = body(build_report(load(write_pickle(tmp_path / "empty.pickle", SnapshotBuilder().build()))))
    assert "The snapshot holds no devices" in page


# -- redaction ----------------------------------------------------------------------------------------------

def test_redact_path_keeps_package_tails_and_hashes_the_rest() -> None:
    assert redact_path("/usr/local/lib/python3.12/dist-packages/vllm/v1/a.py") == "vllm/v1/a.py"
    assert redact_path("/home/u/.venv/lib/python3.11/site-packages/torch/nn/f.py") == "torch/nn/f.py"
    assert redact_path("/usr/lib/python3.12/multiprocessing/spawn.py") == "multiprocessing/spawn.py"
    hidden = redact_path("/home/alice/secret-project/srv/server.py")
    assert re.fullmatch(r"\[[0-9a-f]{8}\]/server\.py", hidden)
    assert redact_path("/home/bob/other/server.py") != hidden                 # different dirs stay apart
    assert redact_path("/home/alice/secret-project/srv/server.py") == hidden   # and equal ones stay equal
    assert redact_path("<string>") == "<string>" and redact_path("??") == "??"


def test_redact_paths_removes_directories_from_the_page() -> None:
    path = SCENARIOS / "concurrent_requests.pickle"
    plain = body(build_report(load(path), samples=4))
    shared = body(build_report(load(path), samples=4, redact_paths=True))
    assert str(path) in plain and "srv/scoring/server.py" in plain
    assert str(SCENARIOS) not in shared and "srv/scoring" not in shared and "dist-packages" not in shared
    assert re.search(r"\[[0-9a-f]{8}\]/concurrent_requests\.pickle", shared)
    assert re.search(r"\[[0-9a-f]{8}\]/server\.py:61:score", shared)
    assert "transformers/models/llama/modeling_llama.py" in shared           # package-relative tails stay


# -- the extension point ------------------------------------------------------------------------------------

def _ranks_section(context: ReportContext) -> Section | None:
    """What a later per-rank section looks like: its own figure, body and verdict sentence."""
    fig = go.Figure(go.Bar(x=["rank 0", "rank 1"], y=[1, 2]))
    body_html = render("macros.html.j2") + render("sections/categories.html.j2", devices=[
        {"device": 0, "figure": "fig-ranks-bar", "instants": 2}])
    return Section(id="ranks", title="Ranks", body=body_html, figures=(FigureSpec("fig-ranks-bar", fig),),
                   verdict=("Rank 1 peaked 1 GiB above rank 0.",), order=ORDER["ranks"])


def test_a_new_section_plugs_in_with_its_figure_and_verdict() -> None:
    context = build_context(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4)
    page = body(render_report(context, (*DEFAULT_SECTIONS, _ranks_section, lambda _: None)))
    order = [m.group(1) for m in re.finditer(r'<section id="([a-z]+)"', page)]
    assert order == ["verdict", "timelines", "categories", "instants", "oom", "ranks", "rules", "facts"]
    verdict = page[page.index('<section id="verdict"'):page.index("</section>")]
    assert verdict.rstrip().endswith("<p>Rank 1 peaked 1 GiB above rank 0.</p>")
    assert 'id="fig-ranks-bar-data"' in page and '<a href="#ranks">Ranks</a>' in page


def test_sections_with_clashing_or_unplaced_figures_are_refused() -> None:
    context = build_context(load(SCENARIOS / "oom_fragmentation.pickle"), samples=2)
    with pytest.raises(ValueError, match="duplicate"):
        render_report(context, (*DEFAULT_SECTIONS, _ranks_section, _ranks_section))
    unplaced = Section(id="x", title="X", figures=(FigureSpec("fig-x", go.Figure()),))
    with pytest.raises(ValueError, match="not placed"):
        render_report(context, (lambda _: unplaced,))
