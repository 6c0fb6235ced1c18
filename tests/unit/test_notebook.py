"""Notebook display: Snapshot, Timeline and Attribution show a compact, escaped HTML table — no plotly.js,
no figure, and numbers that match the analyses."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import attribute, load, replay
from snapanalyze.report.notebook import attribution_html, snapshot_html, timeline_html
from snapanalyze.units import fmt_bytes

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
BASE = 0x7F00_0000_0000


@pytest.fixture(scope="module")
def logits():
    snap = load(SCENARIOS / "prompt_logprobs_logits.pickle")
    timeline = replay(snap)
    return snap, timeline, attribute(snap, timeline=timeline)


def _compact(html: str) -> None:
    assert html.startswith('<div class="snapanalyze">') and html.rstrip().endswith("</div>")
    assert "<script" not in html and "plotly" not in html.lower()
    assert len(html) < 10_000


def test_snapshot_shows_devices_events_and_ooms(logits) -> None:
    snap, _, _ = logits
    html = snap._repr_html_()
    assert html == snapshot_html(snap)
    _compact(html)
    html = html.replace("\u00a0", " ")              # a number and its unit are joined by a no-break space
    assert "prompt_logprobs_logits.pickle" in html and "<td>619</td>" in html and "2.41 ms" in html
    oom = load(SCENARIOS / "oom_fragmentation.pickle")._repr_html_()
    assert oom.count("<td>1</td>") >= 1 and "OOM entries" in oom


def test_timeline_shows_the_global_peak_and_the_replay_check(logits) -> None:
    _, timeline, _ = logits
    html = timeline._repr_html_()
    assert html == timeline_html(timeline)
    _compact(html)
    html = html.replace("\u00a0", " ")              # a number and its unit are joined by a no-break space
    assert f"<td>{fmt_bytes(timeline[0].active_at(598))}</td><td>598</td>" in html
    assert "matches the end state" in html


def test_attribution_shows_categories_with_their_top_site(logits) -> None:
    _, _, result = logits
    html = result._repr_html_()
    assert html == attribution_html(result)
    _compact(html)
    html = html.replace("\u00a0", " ")              # a number and its unit are joined by a no-break space
    assert "<td>logits</td><td>9.56 GiB</td><td>13.4%</td><td>5</td>" in html
    assert "vllm/v1/sample/sampler.py:150:compute_logprobs" in html
    assert "global peak (event 598)" in html


def test_attribution_flags_inferred_bytes() -> None:
    html = attribution_html(attribute(load(SCENARIOS / "concurrent_requests.pickle"))).replace("\u00a0", " ")
    weights = html[html.index("<td>weights"):]
    assert weights.startswith("<td>weights <i") and "(inferred)</i></td><td>2.30 GiB</td>" in weights
    assert "<td>concurrent_request</td>" in html          # proven by frames and metadata: no flag


def test_hostile_text_is_escaped(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    name = "<img src=x onerror=alert(1)>"
    b.alloc(BASE, 1 << 20, frames=[{"filename": "/app/<b>.py", "line": 1, "name": name}], user_metadata=name)
    snap = load(write_pickle(tmp_path / "<hostile>.pickle", b.build(n_devices=1)))
    for html in (snap._repr_html_(), replay(snap)._repr_html_(), attribute(snap)._repr_html_()):
        assert "<img" not in html and "<b>.py" not in html and "<hostile>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in attribute(snap)._repr_html_()
