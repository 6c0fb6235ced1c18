"""The HTML report in a real headless Chromium: it renders every figure, logs no error, fetches nothing,
and hostile frame names cannot run script.

Uses Debian's chromium (/usr/bin/chromium, `apt-get install chromium`) through Playwright; Playwright's own
browser download is never needed. Skipped with the reason when chromium is absent — except under CI
(CI=true), where .ci/run installs it and its absence is a failure.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import load
from snapanalyze import schema as schemas
from snapanalyze.report.html import build_path_report, build_report

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "fixtures" / "scenarios"
RUNS = ROOT / "fixtures" / "runs"
CHROMIUM = os.environ.get("SNAPANALYZE_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
HOSTILE = "</script><script>window.pwned=1</script>"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _need_chromium() -> None:
    if Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK):
        return
    reason = f"Debian chromium not found at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason + "; .ci/run installs it, so CI must have it")
    pytest.skip(reason)


@dataclass
class PageRun:
    errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    figures: int = 0
    rendered: int = 0
    pwned: Any = None
    links: list[str] = field(default_factory=list)   # every link on the page that leaves it
    verdict_top: str = ""          # the verdict as it first shows: headline, lines, advice (details folded)
    verdict: str = ""              # the verdict with its details opened by a click
    text: str = ""
    data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # categories and segment map traces


# The traces plotly drew in the categories and segment map figures, read back from the page.
FIGURE_DATA = """() => Object.fromEntries([...document.querySelectorAll('div.sa-figure')]
  .filter(d => d.id.startsWith('fig-categories') || d.id.startsWith('fig-segments'))
  .map(d => [d.id, d._fullData.map(t => ({name: t.name, stackgroup: t.stackgroup || null,
     shape: (t.line || {}).shape || null,
     x: Array.from(t.x || []), y: Array.from(t.y || []), customdata: Array.from(t.customdata || []),
     bars: d.querySelectorAll('.barlayer .point').length}))]))"""


def open_report(path: Path, screenshot: Path | None = None) -> PageRun:
    """Open `path` in headless Chromium; record console errors, page errors, every non-file request and the
    categories and segment map traces as drawn; optionally save a full-page screenshot."""
    _need_chromium()
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is a dev dependency: pip install -e '.[dev]'")
    run = PageRun()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page()

            def route(r: Any) -> None:
                url = r.request.url
                if url.startswith(("file:", "data:", "blob:", "about:")):
                    r.continue_()
                else:
                    run.foreign_requests.append(url)
                    r.abort()

            page.route("**/*", route)
            page.on("request", lambda req: None if req.url.startswith(("file:", "data:", "blob:", "about:"))
                    else run.foreign_requests.append(req.url))
            page.on("console", lambda msg: run.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
            page.on("pageerror", lambda exc: run.errors.append(f"page error: {exc}"))
            page.goto(path.resolve().as_uri(), wait_until="load")
            run.figures = page.locator("div.sa-figure").count()
            page.wait_for_function(
                "() => [...document.querySelectorAll('div.sa-figure')].every("
                "d => d.querySelector('.main-svg') !== null)", timeout=30_000)
            run.rendered = page.evaluate(
                "() => [...document.querySelectorAll('div.sa-figure.js-plotly-plot')].filter("
                "d => d.querySelectorAll('.main-svg').length > 0 && d.getBoundingClientRect().height > 100"
                " && d.querySelectorAll('path, rect').length > 0).length")
            run.pwned = page.evaluate("() => typeof window.pwned === 'undefined' ? null : window.pwned")
            run.links = page.evaluate(
                "() => [...document.querySelectorAll('a')].map(a => a.getAttribute('href')"
                " || a.getAttribute('xlink:href') || a.getAttributeNS('http://www.w3.org/1999/xlink', 'href') || '')"
                ".filter(h => h && !h.startsWith('#'))")
            verdict = page.locator("#verdict")
            words = "s => s.replaceAll('\\u00a0', ' ')"      # a number and its unit are joined by U+00A0
            run.verdict_top = verdict.evaluate(f"v => ({words})(v.innerText)") if verdict.count() else ""
            if page.locator("#verdict details > summary").count():
                page.locator("#verdict details > summary").click()
            run.verdict = verdict.evaluate(f"v => ({words})(v.innerText)") if verdict.count() else ""
            run.text = page.evaluate(f"() => ({words})(document.body.innerText)")
            run.data = page.evaluate(FIGURE_DATA)
            if screenshot is not None:
                page.set_viewport_size({"width": 1280, "height": 900})
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return run


def test_fixture_report_renders_offline_without_errors(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text(build_report(load(SCENARIOS / "oom_fragmentation.pickle")), encoding="utf-8")
    run = open_report(path)
    assert run.errors == []
    assert run.foreign_requests == []
    assert run.figures >= 5   # timeline, categories, one icicle for its three same peaks, segment maps at peak 1, OOM
    assert run.rendered == run.figures
    shown = [line for line in run.verdict_top.splitlines() if line.strip()]
    assert shown[0] == "Verdict" and shown[1].startswith("Device 0 ran out of memory")  # the headline, unfolded
    assert "Allocation failure from fragmentation" not in run.verdict_top and "Allocation failure" in run.verdict
    oom_map = run.data["fig-segments-d0-oom-e66"]
    names = [t["name"] for t in oom_map]
    assert any(n.startswith("failed request") for n in names)
    assert any(n.startswith("largest usable free block") for n in names)
    assert oom_map[0]["bars"] > 10                        # the bars are on the page, not only in the data
    assert "Segment map" in run.text and "The failed request needed 1.96 GiB in one block" in run.text


def test_run_directory_report_renders_every_rank_offline(tmp_path: Path) -> None:
    """Two ranks with NVML and markers: per-rank timelines (NVML line, phase bands), categories and icicles,
    the rank comparison and the outside-allocator chart all draw, with no error and no request."""
    path = tmp_path / "run.html"
    path.write_text(build_path_report(RUNS / "tp2_vision_encoder", samples=8), encoding="utf-8")
    run = open_report(path)
    assert run.errors == []
    assert run.foreign_requests == []
    assert run.figures == 2 * 4 + 2       # per rank: timeline, categories, icicle, segment map; + ranks, outside
    assert run.rendered == run.figures
    assert "The peak on rank 1 was 59.41 GiB active" in run.verdict and "during prefill#1" in run.verdict
    assert "Rank 1 peaked 3.53 GiB above the median rank" in run.verdict
    assert "Memory outside the allocator at the peak" in run.verdict


def test_hostile_phase_names_cannot_break_a_run_report(tmp_path: Path) -> None:
    """Phase and request names come from the user's markers: escaped in the tables, the bands and the verdict."""
    pq = pytest.importorskip("pyarrow.parquet")
    rank = tmp_path / "run" / "rank=0"
    shutil.copytree(RUNS / "oom_other_process" / "rank=0", rank)
    markers = pq.read_table(rank / "markers.parquet")
    names = [HOSTILE + n for n in markers.column("name").to_pylist()]
    markers = markers.set_column(markers.schema.get_field_index("name"), "name", pa.array(names))
    schemas.write_table(markers.cast(schemas.MARKERS_SCHEMA), rank / "markers.parquet", schema=schemas.MARKERS_SCHEMA)
    page = build_path_report(tmp_path / "run", samples=4)
    assert HOSTILE not in page
    path = tmp_path / "hostile-run.html"
    path.write_text(page, encoding="utf-8")
    run = open_report(path)
    assert run.pwned is None and run.errors == [] and run.foreign_requests == []
    assert run.rendered == run.figures
    assert f"during {HOSTILE}prefill#2" in run.verdict      # shown as the literal name


def hostile_snapshot(tmp_path: Path) -> Path:
    """A small snapshot whose every frame is named like a script injection, in a file and a function."""
    b = SnapshotBuilder()
    frames = [{"filename": f"/srv/{HOSTILE}/model.py", "line": 7, "name": HOSTILE},
              {"filename": "/srv/app.py", "line": 1, "name": "<img src=x onerror=window.pwned=2>"},
              {"filename": '/srv/<a href="https://evil.example/f">lib.py</a>', "line": 3,
               "name": '<a href="https://evil.example/n">step</a>'}]
    b.segment(0x7F00_0000_0000, [(4 << 20, 4 << 20, "inactive")])
    b.alloc(0x7F00_0000_0000, 1 << 20, frames=frames)
    b.alloc(0x7F00_0010_0000, 2 << 20, frames=frames, user_metadata=HOSTILE)
    b.free(0x7F00_0010_0000, 2 << 20, frames=frames)
    b.free(0x7F00_0000_0000, 1 << 20, frames=frames)
    return write_pickle(tmp_path / f"hostile-{'x'}.pickle", b.build())


def test_hostile_frame_names_cannot_break_the_page(tmp_path: Path) -> None:
    snap = load(hostile_snapshot(tmp_path))
    page = build_report(snap)
    assert HOSTILE not in page                       # escaped everywhere: HTML text and JSON blocks
    assert "&lt;/script&gt;&lt;script&gt;window.pwned=1&lt;/script&gt;" in page    # but there, as text
    path = tmp_path / "hostile.html"
    path.write_text(page, encoding="utf-8")
    run = open_report(path)
    assert run.pwned is None
    assert run.errors == []
    assert run.foreign_requests == []
    assert run.links == []                           # plotly's label HTML cannot plant a link either
    assert run.figures >= 3 and run.rendered == run.figures
    assert "The peak on device 0 was 3.00 MiB" in run.verdict
    assert HOSTILE in run.text                       # shown to the reader as the literal frame name


def test_the_page_really_fails_on_a_network_request(tmp_path: Path) -> None:
    """Control: a page that fetches is caught, so the clean results above are meaningful."""
    path = tmp_path / "fetching.html"
    path.write_text('<!DOCTYPE html><html><body><div class="sa-figure"><svg class="main-svg"></svg></div>'
                    '<img src="https://cdn.example.invalid/x.png"></body></html>', encoding="utf-8")
    run = open_report(path)
    assert run.foreign_requests
    assert run.errors                                  # the aborted request is logged as an error



def stacked_totals_meet_the_exact_curve(traces: list[dict[str, Any]]) -> int:
    """Assert that wherever the stacked categories are drawn they sum to the exact active curve drawn over them
    (a point where nothing is drawn is where the live set moved before the next attributed instant), and that
    every line is a step; return the number of drawn points checked."""
    stacked = [t for t in traces if t["stackgroup"] == "categories"]
    (exact,) = [t for t in traces if t["name"] == "active (exact)"]
    assert stacked and all(t["shape"] == "hv" for t in traces)
    at = dict(zip(exact["customdata"], exact["y"]))
    drawn = 0
    for n, index in enumerate(stacked[0]["customdata"]):
        total = sum(t["y"][n] for t in stacked)
        if total:
            assert total == pytest.approx(at[index], rel=1e-9, abs=1e-12), index
            drawn += 1
    return drawn


def test_categories_over_time_equal_the_exact_curve_at_their_points(tmp_path: Path) -> None:
    """Read back from the page: a fixture, a run (both ranks) and a real-format trace."""
    pages = {"fixture": build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle")),
             "run": build_path_report(RUNS / "tp2_vision_encoder"),
             "torch214": build_report(load(SCENARIOS / "torch214_graph_pools_host.pickle"))}
    for name, page in pages.items():
        path = tmp_path / f"{name}.html"
        path.write_text(page, encoding="utf-8")
        run = open_report(path, screenshot=tmp_path / f"{name}.png")
        assert run.errors == [] and run.foreign_requests == []
        assert run.rendered == run.figures
        charts = [k for k in run.data if k.startswith("fig-categories")]
        assert charts and all(stacked_totals_meet_the_exact_curve(run.data[k]) >= 3 for k in charts)
        maps = [k for k in run.data if k.startswith("fig-segments")]
        assert maps and all(run.data[k][0]["bars"] > 0 for k in maps)
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
