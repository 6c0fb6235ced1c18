"""The HTML report: deterministic, self-contained, bounded, escaped, redactable, and built from sections that
later analyses extend. A golden normalised copy of a small report is checked in (`pytest --update-golden`)."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import pytest
from conftest import SnapshotBuilder, frames_for, write_pickle
from markupsafe import Markup

from snapanalyze import UsageError, load
from snapanalyze.report.context import Report, ReportOptions, build_context, detail_ranks
from snapanalyze.report.html import (
    PLOTLY_MARKER,
    build_path_report,
    build_report,
    normalise,
    render_report,
    script_json,
)
from snapanalyze.report.redact import redact_path
from snapanalyze.report.sections import DEFAULT_SECTIONS, ORDER, FigureSpec, Section

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "fixtures" / "scenarios"
GOLDEN = Path(__file__).resolve().parent / "golden" / "prompt_logprobs_logits.report.html"
RUNS = ROOT / "fixtures" / "runs"
SWEEPS = ROOT / "fixtures" / "sweeps"
MiB = 1 << 20
BASE = 0x7F00_0000_0000


def body(page: str) -> str:
    """The report without the inlined plotly.js bundle, its no-break spaces (between a number and its unit)
    read as spaces, so that the tests match the words."""
    return normalise(page).replace("\u00a0", " ")


# -- golden -------------------------------------------------------------------------------------------------

def test_golden_report(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    page = normalise(build_report(load("fixtures/scenarios/prompt_logprobs_logits.pickle")))
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(page, encoding="utf-8")
    assert GOLDEN.exists(), "no golden file yet: run `python -m pytest tests/integration/test_html.py --update-golden`"
    expected = GOLDEN.read_text(encoding="utf-8")
    assert page == expected, ("the report differs from tests/integration/golden/; if the change is intended, run "
                              "`python -m pytest tests/integration/test_html.py --update-golden` and review the diff")


def test_golden_file_is_normalised_and_small() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    assert PLOTLY_MARKER in text and "snapanalyze {version}" in text
    assert len(text) < 400_000
    assert "The peak on device 0 was 71.52\u00a0GiB active" in text


# -- self-contained, deterministic, bounded -----------------------------------------------------------------

def test_plotly_js_is_inlined_exactly_once_and_nothing_is_fetched() -> None:
    page = build_report(load(SCENARIOS / "oom_live_exhaustion.pickle"), samples=4)
    js = plotly.offline.get_plotlyjs()
    assert page.count(js[:500]) == 1 and page.count(js[-500:]) == 1
    rest = body(page)
    assert "<script src" not in rest and "<link" not in rest and "@import" not in rest
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", rest)
    assert "default-src 'none'" in rest      # the CSP forbids every fetch


@pytest.mark.slow
def test_the_same_input_gives_the_same_bytes_whatever_the_hash_seed(tmp_path: Path) -> None:
    script = ("import hashlib, sys; from snapanalyze.report.html import build_path_report;"
              "print(hashlib.sha256(build_path_report(sys.argv[1], samples=int(sys.argv[2])).encode()).hexdigest())")
    for path, samples in ((SCENARIOS / "concurrent_requests.pickle", 8), (RUNS / "tp2_vision_encoder", 2)):
        digests = set()
        for seed in ("1", "2"):
            env = {**os.environ, "PYTHONHASHSEED": seed}
            out = subprocess.run([sys.executable, "-c", script, str(path), str(samples)],
                                 env=env, capture_output=True, text=True, check=True, cwd=ROOT)
            digests.add(out.stdout.strip())
        page = build_path_report(path, samples=samples)
        digests.add(hashlib.sha256(page.encode()).hexdigest())
        assert len(digests) == 1, path
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
    assert "on top of 2.30 GiB weights (inferred, not proven by a frame)" in verdict
    assert '<span class="flag"' in page


def test_oom_entries_get_a_section_and_a_verdict_line() -> None:
    page = body(build_report(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4))
    assert '<section id="oom">' in page
    assert ("Device 0 ran out of memory at 6.401 s into the 6.401 s window (event 66 of 67): a 1.96 GiB request "
            "from vllm/model_executor/layers/vocab_parallel_embedding.py:120:process_weights_after_loading failed with "
            "1.08 GiB free on the device") in page
    # led by the allocation that failed: who asked, and its stack
    assert ("<b>The allocation that failed</b>: <span title=\"2,101,346,304 bytes\">1.96 GiB</span> asked for by <code>"
            "vllm/model_executor/layers/vocab_parallel_embedding.py:120:process_weights_after_loading</code> (weights, "
            "rule vllm.weights.load_functions).") in page
    assert page.count('<ol class="stack">') == 1 and "<li class=\"muted\">… 5 more</li>" in page
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


def test_one_file_gets_one_redaction_when_the_source_names_its_classes() -> None:
    """With --source, labels name `Class.method`; each must be redacted as its frame's full path is (model.py
    showed under two hashes, one of them of its short path, before)."""
    import collections
    stem = "cs336-medium-ctx1024-training-t2.11"
    real = SCENARIOS.parent / "real"
    page = build_report(load(real / f"{stem}.pickle", source=real / "source" / stem), samples=4, redact_paths=True)
    hashes = collections.defaultdict(set)
    for digest, name in re.findall(r"\[([0-9a-f]{8})\]/([\w.]+\.py)", page):
        hashes[name].add(digest)
    assert "model.py" in hashes and all(len(found) == 1 for found in hashes.values()), dict(hashes)
    assert re.search(r"\[[0-9a-f]{8}\]/model\.py:\d+:\w+\.\w+", page)         # a Class.method label, redacted


def _own_files(snapshot: Any) -> set[str]:
    """"dir/name.py" of each of the program's own files (outside installed packages), as a leak would show it."""
    from snapanalyze.stacks import is_python_frame
    return {"/".join(f[0].split("/")[-2:]) for f in snapshot.interner.frames
            if is_python_frame(f[0]) and "-packages/" not in f[0] and "/lib/python" not in f[0] and "/" in f[0]}


def test_a_redacted_report_names_no_directory_of_the_programs_files_not_even_in_a_reason() -> None:
    """Reasons name frames too ("freed by the optimizer's code (cs336_basics/optimizer.py:72:step)"): they
    carry the frame, not its label, so the report redacts them as every other frame it shows."""
    real = SCENARIOS.parent / "real"
    snap = load(real / "cs336-step-annotations-t2.10.pickle")
    own = _own_files(snap)
    assert len(own) > 5
    plain = html.unescape(build_report(snap, samples=4))
    assert "optimizer's code (assignment2-systems/cs336_basics/optimizer.py" in plain    # a reason names a frame
    shared = html.unescape(build_report(snap, samples=4, redact_paths=True))
    assert not [f for f in own if f in shared]
    assert re.search(r"freed by the optimizer's code \(\[[0-9a-f]{8}\]/optimizer\.py:\d+:step\)", shared)


def test_a_compared_report_redacts_the_baselines_files_as_its_own() -> None:
    """The diff's stacks name the baseline's frames: each file is redacted from its full path, so one directory
    gets one hash on the whole page and an installed package keeps its package-relative path."""
    import collections
    real = SCENARIOS.parent / "real"
    page = html.unescape(build_path_report(real / "cs336-forward-bf16-t2.6.pickle",
                                           compare=real / "cs336-forward-fp32-t2.6.pickle", samples=4,
                                           redact_paths=True))
    assert 'id="diff"' in page
    hashes = collections.defaultdict(set)
    for digest, name in re.findall(r"\[([0-9a-f]{8})\]/([\w.]+\.py)", page):
        hashes[name].add(digest)
    assert "linear.py" in hashes and all(len(found) == 1 for found in hashes.values()), dict(hashes)
    assert len({next(iter(hashes[n])) for n in ("linear.py", "swiglu.py", "rmsnorm.py")}) == 1     # one directory
    assert re.search(r"torch/functional\.py:(\d+:)?einsum", page) and "[" + "functional.py" not in page


def test_the_redactor_labels_sites_and_words_from_their_full_paths() -> None:
    from snapanalyze.report.redact import Redactor
    from snapanalyze.sites import Site, words
    site = Site.of(("/home/alice/proj/model.py", 9, "forward"), "Block.forward")
    said = words("made in ", site, ", which works for it")
    hidden = redact_path("/home/alice/proj/model.py")
    assert Redactor(enabled=True).site(site) == f"{hidden}:9:Block.forward"
    assert Redactor(enabled=True).words(said) == f"made in {hidden}:9:Block.forward, which works for it"
    assert Redactor().site(site) == "alice/proj/model.py:9:Block.forward"          # disabled: as tables show it
    assert Redactor(enabled=True).site(None, none="(no frames)") == "(no frames)"


# -- the extension point ------------------------------------------------------------------------------------

def _ranks_section(context: Report) -> Section | None:
    """What a later per-rank section looks like: its own figure, body and verdict sentence."""
    fig = go.Figure(go.Bar(x=["rank 0", "rank 1"], y=[1, 2]))
    body_html = Markup('<p>Ranks side by side.</p>\n<div class="sa-figure" id="fig-ranks-bar"></div>')
    return Section(id="ranks", title="Ranks", body=body_html, figures=(FigureSpec("fig-ranks-bar", fig),),
                   verdict=("Rank 1 peaked 1 GiB above rank 0.",), order=ORDER["ranks"])


def test_a_new_section_plugs_in_with_its_figure_and_verdict() -> None:
    context = build_context(load(SCENARIOS / "oom_fragmentation.pickle"), options=ReportOptions(samples=4))
    page = body(render_report(context, (*DEFAULT_SECTIONS, _ranks_section, lambda _: None)))
    order = [m.group(1) for m in re.finditer(r'<section id="([a-z]+)"', page)]
    assert order == ["verdict", "timelines", "categories", "instants", "oom", "ranks", "rules", "facts"]
    verdict = page[page.index('<section id="verdict"'):page.index("</section>")]
    details = verdict[verdict.index("<details"):]
    assert details.rstrip().endswith("<p>Rank 1 peaked 1 GiB above rank 0.</p>\n</details>")   # after its own
    assert 'id="fig-ranks-bar-data"' in page and '<a href="#ranks">Ranks</a>' in page


def test_sections_with_clashing_or_unplaced_figures_are_refused() -> None:
    context = build_context(load(SCENARIOS / "oom_fragmentation.pickle"), options=ReportOptions(samples=2))
    with pytest.raises(ValueError, match="duplicate"):
        render_report(context, (*DEFAULT_SECTIONS, _ranks_section, _ranks_section))
    unplaced = Section(id="x", title="X", figures=(FigureSpec("fig-x", go.Figure()),))
    with pytest.raises(ValueError, match="not placed"):
        render_report(context, (lambda _: unplaced,))


# -- run directories: every rank, NVML, phases, the rank comparison, memory outside the allocator ------------

def run_expected(name: str) -> dict:
    return json.loads((RUNS / f"{name}.expected.json").read_text())


def figure_data(page: str, fig_id: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{re.escape(fig_id)}-data">(.*?)</script>', page, re.S)
    assert m, f"no data block for {fig_id}"
    return json.loads(m.group(1))


def verdict_of(page: str) -> str:
    return page[page.index('<section id="verdict"'):page.index("</section>")]


def section_ids(page: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r'<section id="([a-z]+)"', page)]


@pytest.fixture(scope="module")
def tp2_page() -> str:
    return build_path_report(RUNS / "tp2_vision_encoder", samples=8)


def test_a_run_report_covers_every_rank(tp2_page: str) -> None:
    page = body(tp2_page)
    assert "2 ranks (0, 1), 2 devices, 1,097 events, tag final" in page
    assert section_ids(page) == ["verdict", "timelines", "categories", "instants", "ranks", "outside", "rules",
                                 "facts"]
    for rank in (0, 1):
        for fig in ("timeline", "categories", "icicle"):
            suffix = "-p1" if fig == "icicle" else ""
            assert f'id="fig-{fig}-r{rank}-d0{suffix}"' in page
        assert f'id="instant-r{rank}-d0-p1"' in page and f"Rank {rank}, device 0, peak 1" in page
    assert 'id="fig-ranks"' in page and 'id="fig-outside"' in page


def test_run_verdict_names_the_rank_the_phase_and_the_outlier(tp2_page: str) -> None:
    verdict = verdict_of(body(tp2_page))
    assert ("The peak on rank 1 was 59.41 GiB active (60.34 GiB reserved), at 2.697 s into the 3.272 s window "
            "(event 437 of 571), during prefill#1 (request req-1).") in verdict
    assert "The peak on rank 0 was 55.89 GiB active" in verdict and "4.07 GiB vision_encoder" in verdict
    assert ("Rank 1 peaked 3.53 GiB above the median rank (rank 0), during prefill#1 (request req-1): "
            "vision_encoder +4.07 GiB") in verdict
    assert "Memory outside the allocator at the peak (NVML used − reserved): 1.56 GiB on rank 0 (an estimate" in verdict
    assert "1.56 GiB on rank 1 (measured by 3 samples during it)" in verdict


def test_run_timelines_draw_nvml_used_and_the_phases(tp2_page: str) -> None:
    expected = run_expected("tp2_vision_encoder")["ranks"]["1"]
    fig = figure_data(tp2_page, "fig-timeline-r1-d0")
    nvml = [t for t in fig["data"] if t["name"] == "NVML used (sampled)"]
    assert len(nvml) == 1
    top = max(v for v in _values(nvml[0]["y"]))
    assert abs(top * (1 << 30) - expected["nvml"]["max_used_sampled"]) < 1 << 20
    shapes = fig["layout"]["shapes"]
    names = {s["name"] for s in shapes}
    assert names == {"phase: load_model", "phase: initialize_kv_cache", "phase: prefill", "phase: decode"}
    assert all(s["yref"] == "paper" and s["layer"] == "below" for s in shapes)
    assert len(shapes) == 5                                # prefill twice; requests are not bands
    labels = {a["text"] for a in fig["layout"]["annotations"]}
    assert {"load_model", "prefill#1"} <= labels


def test_the_phase_table_flags_inferred_category_bytes(tp2_page: str) -> None:
    page = body(tp2_page)
    # rank 0's prefill: gate/up told by size
    assert page.count('<span class="flag" title="decided by sizes, lifetimes, layout, time, the call tree or a name '
                      'rather than proven by a frame">296.00 MiB inferred</span>') >= 1


def _values(y: Any) -> list[float]:
    """A plotly JSON array: a plain list or a typed-array block {"dtype", "bdata"}."""
    if isinstance(y, list):
        return [float(v) for v in y]
    import base64

    import numpy as np
    return np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).astype(float).tolist()


def test_ranks_section_tables_the_ranks_and_the_outliers_categories(tp2_page: str) -> None:
    page = body(tp2_page)
    section = page[page.index('<section id="ranks">'):page.index('<section id="outside">')]
    assert section.count("<tr><td>") >= 2 and '<span class="flag">outlier</span>' in section
    assert "Rank 1: 3.53 GiB above the median rank" in section
    rows = re.findall(r"<tr><td>(\w+)</td><td class=\"num\" title=\"([\d,]+) bytes\">", section)
    assert ("vision_encoder", "4,369,416,192") in rows
    assert 'href="#instant-r1-d0-p1"' in section


def test_outside_section_splits_and_says_when_it_is_an_estimate(tp2_page: str) -> None:
    expected = run_expected("tp2_vision_encoder")["ranks"]
    page = body(tp2_page)
    section = page[page.index('<section id="outside">'):page.index('<section id="rules">')]
    for rank in ("0", "1"):
        assert f'title="{expected[rank]["nvml"]["outside_bytes"]:,} bytes"' in section
        assert f'title="{expected[rank]["nvml"]["nvml_used_bytes"]:,} bytes"' in section
    assert section.count('<span class="flag">estimate</span>') == 1        # rank 0: its 4 µs peak fell between
    assert "3 during the 150.00 ms peak" in section
    assert "the peak held 4 µs, so NVML never saw it" in section


def test_slow_sampler_makes_the_outside_number_an_estimate() -> None:
    page = body(build_path_report(RUNS / "slow_nvml_spike", samples=4))
    expected = run_expected("slow_nvml_spike")["ranks"]["0"]["nvml"]
    verdict = verdict_of(page)
    assert "612.00 MiB on rank 0 (an estimate: no NVML sample fell inside its 6.00 ms peak" in verdict
    assert f'title="{expected["nvml_used_bytes"]:,} bytes"' in page
    assert "during prefill (request req-logprobs)" in verdict
    assert 'id="ranks"' not in page                        # one rank: nothing to compare


def test_the_oom_section_uses_the_explanation() -> None:
    frag = body(build_report(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4))
    verdict = verdict_of(frag)
    assert "Allocation failure from fragmentation: the 1.96 GiB request did not fit in any single free block" in verdict
    assert "What would have helped: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in verdict
    assert '<span class="flag">fragmentation</span>' in frag and "max_split_size_mb:256" in frag
    live = body(build_report(load(SCENARIOS / "oom_live_exhaustion.pickle"), samples=4))
    assert '<span class="flag">live memory exhaustion</span>' in live
    assert "Live memory exhaustion: the device could not give the 32.00 MiB request" in verdict_of(live)
    other = body(build_path_report(RUNS / "oom_other_process", samples=4))
    verdict = verdict_of(other)
    assert "Rank 0 ran out of memory at 2.501 s into the 2.501 s window (event 66 of 67), during prefill#2" in verdict
    assert "Pressure from outside the allocator" in verdict and "other processes held 7.12 GiB" in verdict
    assert "Of that, other processes held 7.12 GiB on rank 0." in verdict
    section = other[other.index('<section id="oom">'):other.index('<section id="outside">')]
    assert '<span class="flag">pressure from outside the allocator</span>' in section
    assert "<th>of it: other processes (NVML)</th>" in section


def test_a_rejected_request_without_an_oom_is_said_to_be_an_admission_limit() -> None:
    page = body(build_path_report(RUNS / "admission_rejected", samples=4))
    verdict = verdict_of(page)
    assert ("Rank 0: no allocation failure was recorded; the rejected request req-3 (prompt of 40,000 tokens "
            "exceeds max_model_len 32,768) was refused by an admission limit, not by the allocator; the peak stayed "
            "12.48 GiB below capacity") in verdict
    assert '<section id="oom">' in page and "<code>req-3</code>" in page
    quiet = body(build_path_report(RUNS / "slow_nvml_spike", samples=4))
    assert 'id="oom"' not in quiet and "admission limit" not in quiet       # no OOM, nothing refused


def test_a_lone_snapshot_has_no_run_sections_and_no_placeholders() -> None:
    page = body(build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle"), samples=4, top=1))
    assert section_ids(page) == ["verdict", "timelines", "categories", "instants", "rules", "facts"]
    for absent in ("rank", "NVML", "outside the allocator", "baseline"):
        assert absent not in verdict_of(page)
    assert "NVML used" not in page and 'id="fig-ranks"' not in page


def test_annotations_of_a_lone_snapshot_are_phases_too() -> None:
    page = body(build_report(load(SWEEPS / "logits_float_fix" / "after.pickle"), samples=4))
    assert "(event 890 of 905), during score." in verdict_of(page)
    fig = figure_data(page, "fig-timeline-d0")
    assert [s["name"] for s in fig["layout"]["shapes"]] == ["phase: score"]


def test_a_run_report_is_deterministic_and_bounded(tp2_page: str) -> None:
    again = build_path_report(RUNS / "tp2_vision_encoder", samples=8)
    assert hashlib.sha256(again.encode()).digest() == hashlib.sha256(tp2_page.encode()).digest()
    assert len(body(tp2_page)) < 600_000
    assert not re.search(r"20\d\d-\d\d-\d\dT", body(tp2_page))


def test_rank_option_reports_one_rank_without_a_comparison() -> None:
    page = body(build_path_report(RUNS / "tp2_vision_encoder", rank=1, samples=4))
    assert "1 device, 571 events, rank 1, tag final" in page
    assert 'id="fig-timeline-r1-d0"' in page and 'id="fig-timeline-r0-d0"' not in page
    assert 'id="ranks"' not in page and '<section id="outside">' in page


def test_a_file_inside_a_rank_directory_is_that_rank() -> None:
    page = body(build_path_report(RUNS / "slow_nvml_spike" / "rank=0" / "snapshot-final.pickle", samples=4))
    assert "The peak on rank 0 was 71.52 GiB" in page and "NVML used (sampled)" in page


def test_redacting_a_run_report_hides_the_directories() -> None:
    page = body(build_path_report(RUNS / "tp2_vision_encoder", samples=4, redact_paths=True))
    assert str(RUNS) not in page and "fixtures/runs" not in page
    assert re.search(r"\[[0-9a-f]{8}\]/tp2_vision_encoder", page)


def test_many_ranks_detail_at_most_a_few(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"rank": r, "device": 0, "active_bytes": 100 + r, "difference_bytes": r - 6, "outlier": False}
            for r in range(12)]
    rows[3].update(active_bytes=900, difference_bytes=800, outlier=True)
    table = pd.DataFrame(rows)
    comparison = SimpleNamespace(table=table, median_rank=6)
    chosen = detail_ranks(comparison, limit=4)       # type: ignore[arg-type]
    assert chosen == sorted(chosen) and len(chosen) == 4
    assert {6, 3, 0} <= set(chosen)                   # the median, the outlier, the lowest peak
    assert detail_ranks(SimpleNamespace(table=table.head(3), median_rank=1)) == [0, 1, 2]  # type: ignore[arg-type]


# -- a diff against a baseline ------------------------------------------------------------------------------

def test_compare_adds_the_diff_against_the_baseline() -> None:
    fix = SWEEPS / "logits_float_fix"
    expected = json.loads((fix / "expected.json").read_text())
    page = body(build_path_report(fix / "after.pickle", compare=fix / "before.pickle", samples=4))
    assert section_ids(page) == ["verdict", "timelines", "categories", "instants", "diff", "rules", "facts"]
    verdict = verdict_of(page)
    assert ("the peak on device 0 fell by 1.96 GiB (9.16 GiB → 7.20 GiB): logits -1.96 GiB; stacks: 1 vanished."
            in verdict)
    section = page[page.index('<section id="diff">'):page.index('<section id="rules">')]
    assert f'title="{-expected["planted"]["bytes"]:,} bytes">-1.96 GiB' in section
    assert "<td>vanished</td>" in section and "score.py:64:score" in section
    assert 'id="fig-diff-d0"' in section and "compared with" in page


def test_compare_with_itself_is_unchanged_rank_by_rank() -> None:
    run = RUNS / "tp2_vision_encoder"
    page = body(build_path_report(run, compare=run, samples=4))
    verdict = verdict_of(page)
    for rank in (0, 1):
        assert f"the peak on rank {rank} is unchanged" in verdict
        assert f'id="fig-diff-r{rank}-d0"' in page


def test_a_run_report_reads_each_rank_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Comparing the ranks and reporting each of them share one load and replay per rank, and the run's
    NVML, markers and meta files are read once (every read of a run goes through `session`)."""
    import snapanalyze.report.context as context
    import snapanalyze.session.runs as session

    read: list[str] = []
    runs_read: list[str] = []

    def counting(path: Any, *args: Any, **kw: Any) -> Any:
        read.append(str(path))
        return load(path, *args, **kw)

    real_read_run = session.read_run
    monkeypatch.setattr(session, "load", counting)
    monkeypatch.setattr(session, "read_run", lambda path: runs_read.append(str(path)) or real_read_run(path))
    run = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "tp2_vision_encoder"
    ctx = context.build_path_context(run, options=context.ReportOptions(samples=4))
    assert len(ctx.views) == 2 and ctx.run is not None and ctx.run.comparison is not None
    assert sorted(Path(p).parent.name for p in read) == ["rank=0", "rank=1"] and runs_read == [str(run)]


# -- the verdict: OOM first, a headline and a line per rank, advice in the engine's words, text that reads --

def verdict_top(page: str) -> str:
    """The verdict above its folded details (headline, lines, program, advice), as plain text."""
    verdict = verdict_of(page)
    return html.unescape(re.sub(r"<[^>]+>", "", verdict[:verdict.index("<details")]))


def headline(page: str) -> str:
    m = re.search(r'<p class="headline">(.*?)</p>', verdict_of(page), re.S)
    assert m, "the verdict has no headline"
    return html.unescape(m.group(1))


def verdict_lines(page: str) -> list[str]:
    return [html.unescape(x) for x in re.findall(r"<li[^>]*>(.*?)</li>", verdict_of(page).split("<details")[0], re.S)]


def visible_text(page: str) -> str:
    """What a reader sees: no scripts or styles, inline tags removed, block tags as line breaks."""
    page = re.sub(r"<script.*?</script>|<style.*?</style>", " ", page, flags=re.S)
    page = re.sub(r"</?(?:b|i|em|strong|code|span|a|abbr|sup|sub|small)\b[^>]*>", "", page)
    return html.unescape(re.sub(r"<[^>]+>", "\n", page))


@pytest.mark.parametrize("path", [SCENARIOS / "oom_fragmentation.pickle", RUNS / "tp2_vision_encoder",
                                  ROOT / "fixtures" / "real" / "cs336-medium-ctx1024-training-t2.11.pickle"],
                         ids=lambda p: p.name)
def test_a_number_never_wraps_away_from_its_unit(path: Path) -> None:
    """In a narrow window the browser breaks lines at spaces: every size and duration the report prints keeps
    its unit on the same line (a no-break space), in the values sections fill in and in the templates' text."""
    text = visible_text(build_path_report(path, samples=4))
    assert "\u00a0GiB" in text or "\u00a0MiB" in text
    assert re.findall(r".{0,30}\d (?:B|KiB|MiB|GiB|TiB|µs|ms|s)\b", text) == []


def _cycles(tmp_path: Path, same_site: bool) -> Path:
    """Sixty steps of one 4 GiB activation made and freed over 512 MiB of weights, each made at one line of
    the model (a training loop) or, as control, each at a line of its own."""
    b = SnapshotBuilder()
    b.segment(BASE, [(512 * 2**20, 512 * 2**20, "active_allocated"), (4 * 2**30, 0, "inactive")])
    for step in range(60):
        where = frames_for("forward", 42 if same_site else 100 + step)
        b.alloc(BASE + 512 * 2**20, 4 * 2**30, frames=where)
        b.free(BASE + 512 * 2**20, 4 * 2**30, frames=where)
    return write_pickle(tmp_path / f"cycles-{same_site}.pickle", b.build())


def test_near_identical_peaks_share_one_icicle(tmp_path: Path) -> None:
    """The top peaks of a periodic workload hold the same live stacks: one icicle is drawn, the other peaks keep
    their exact table and point to it. Peaks made at different sites keep one icicle each."""
    page = body(build_report(load(_cycles(tmp_path, same_site=True)), samples=4))
    assert len(re.findall(r'<div class="sa-figure" id="fig-icicle-[^"]*"', page)) == 1
    assert page.count('The live stacks are those of <a href="#instant-') == 2
    assert page.count("<h3 id=\"instant-") == 3                      # every peak keeps its heading and table
    control = body(build_report(load(_cycles(tmp_path, same_site=False)), samples=4))
    assert len(re.findall(r'<div class="sa-figure" id="fig-icicle-[^"]*"', control)) == 3
    assert "The live stacks are those of" not in control


def test_an_oom_is_the_first_thing_the_verdict_says() -> None:
    page = body(build_report(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4))
    assert headline(page) == ("Device 0 ran out of memory at 6.401 s into the 6.401 s window: a 1.96 GiB request "
                              "from vllm/model_executor/layers/vocab_parallel_embedding.py:120:"
                              "process_weights_after_loading failed (fragmentation: no free block fits it although "
                              "1.83 GiB is reserved but free); live then: only 36.39 GiB weights.")
    # The device's line sets the failure beside the peak before it; the advice is the OOM's.
    assert verdict_lines(page) == ["Device 0: out of memory at 6.401 s (fragmentation, a 1.96 GiB request); peak "
                                   "36.70 GiB active (38.48 GiB reserved) at 5.600 s: only 36.70 GiB weights."]
    assert "What would have helped: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in verdict_top(page)
    run = body(build_path_report(RUNS / "oom_other_process", samples=4))
    head = headline(run)
    assert head.startswith("Rank 0 ran out of memory at 2.501 s into the 2.501 s window, during prefill")
    assert ("(request req-2): a 512.00 MiB request from vllm/model_executor/layers/utils.py:105:"
            "default_unquantized_gemm failed (pressure from outside the allocator: other processes held 7.12 GiB); "
            "live then: 192.19 MiB other on top of 14.52 GiB of kv_cache and weights.") in head
    details = verdict_of(run)[verdict_of(run).index("<details"):]
    first = re.search(r"<p>(.*?)</p>", details, re.S)
    assert first and first.group(1).startswith("Rank 0 ran out of memory")      # the OOM opens the details too


def test_the_verdict_of_a_run_is_a_headline_and_a_line_per_rank(tp2_page: str) -> None:
    page = body(tp2_page)
    head = headline(page)
    assert head.startswith("Rank 1 peaked highest, 3.53 GiB above the median rank (rank 0): 59.41 GiB active "
                           "(60.34 GiB reserved) at 2.697 s into the 3.272 s window, during prefill")
    assert head.endswith("(request req-1); vision_encoder (+4.07 GiB against the median rank) made the difference.")
    assert not re.search(r"\. [A-Z]", head)                                   # one sentence
    lines = verdict_lines(page)
    assert [line.split(":")[0] for line in lines] == ["Rank 0", "Rank 1", "Headroom (the least, on rank 1)"]
    assert lines[2].startswith("Headroom (the least, on rank 1): the highest reserved, 60.34 GiB, left ")
    assert lines[1].startswith("Rank 1: peak 59.41 GiB active (60.34 GiB reserved) at 2.697 s, during prefill")
    assert "(request req-1): 4.07 GiB vision_encoder, " in lines[1]
    assert all(len(line) < 260 for line in lines)
    verdict = verdict_of(page)
    assert "<details" in verdict and "<details class=\"verdict-details\">" in verdict        # folded, closed
    assert verdict.count("Nothing was live when the trace window began") == 1
    assert "Nothing was live when the trace window began on rank 0 and rank 1" in verdict


def test_advice_speaks_the_words_of_the_engine_in_the_frames(tmp_path: Path) -> None:
    vllm_knobs = ("--max-num-batched-tokens", "--gpu-memory-utilization", "max_num_batched_tokens",
                  "gpu_memory_utilization")
    sglang_knobs = ("--mem-fraction-static", "--chunked-prefill-size", "mem_fraction_static", "chunked_prefill_size")
    vllm = body(build_report(load(SCENARIOS / "prompt_logprobs_logits.pickle"), samples=4))
    top = verdict_top(vllm)
    assert "Program: vLLM, recognised by vllm/" in top
    assert ("To lower the peak: for logits (9.56 GiB, 13.4% of the peak), fewer positions through lm_head at once: "
            "no prompt_logprobs") in top
    assert not any(k in vllm for k in sglang_knobs)
    sglang = body(build_report(load(SCENARIOS / "oom_live_exhaustion.pickle"), samples=4))
    assert "Program: SGLang, recognised by sglang/" in verdict_top(sglang)
    assert "a lower --mem-fraction-static" in verdict_top(sglang)
    assert not any(k in sglang for k in vllm_knobs)                  # the OOM section's advice too
    hf = body(build_report(load(SCENARIOS / "hf_eager_attention_threshold.pickle"), samples=4))
    assert "Program: transformers" in verdict_top(hf) and 'attn_implementation="sdpa"' in verdict_top(hf)
    assert not any(k in hf for k in vllm_knobs + sglang_knobs)
    training = body(build_report(load(write_pickle(tmp_path / "train.pickle", _training_snapshot())), samples=4))
    top = verdict_top(training)
    assert "Program: PyTorch training, recognised by torch/optim/adamw.py:90:_init_group" in top
    assert "for attention (300.00 MiB, 54.0% of the peak), activation checkpointing" in top
    assert "for optimizer_state (" in top and "of the peak), less optimizer state" in top
    assert not any(k in training for k in vllm_knobs + sglang_knobs)


def _training_snapshot() -> dict[str, Any]:
    """A training step: AdamW state made by torch.optim, then an attention activation on top of it."""
    site = "/usr/lib/python3.12/site-packages/"
    optim = [{"filename": site + "torch/optim/adamw.py", "line": 90, "name": "_init_group"},
             {"filename": "/app/train.py", "line": 10, "name": "main"}]
    forward = [{"filename": "/app/model.py", "line": 30, "name": "self_attn"},
               {"filename": "/app/train.py", "line": 9, "name": "main"}]
    scores = 300 * MiB + 512                       # no B·H·L² shape: attention by its frame, not by its size
    b = SnapshotBuilder()
    b.segment(BASE, [(128 * MiB, 128 * MiB, "active_allocated"), (128 * MiB, 128 * MiB, "active_allocated"),
                     (scores, scores, "inactive")])
    b.event("segment_alloc", BASE, 256 * MiB + scores)
    b.alloc(BASE, 128 * MiB, frames=optim)
    b.alloc(BASE + 128 * MiB, 128 * MiB, frames=optim)
    b.alloc(BASE + 256 * MiB, scores, frames=forward)
    b.free(BASE + 256 * MiB, scores, frames=forward)
    return b.build()


def test_inferred_bytes_are_flagged_in_the_verdict_lines() -> None:
    page = body(build_report(load(SCENARIOS / "concurrent_requests.pickle"), samples=4))
    assert headline(page).endswith("7.34 GiB concurrent_request made the difference, on top of 2.30 GiB weights "
                                   "(inferred).")
    assert ("inferred: decided by sizes, lifetimes, layout, time, the call tree or a name rather than proven by a "
            "frame") in verdict_top(page)
    proven = body(build_report(load(SCENARIOS / "oom_fragmentation.pickle"), samples=4))
    assert "inferred" not in verdict_top(proven)


TEXT_INPUTS = [SCENARIOS / f"{name}.pickle" for name in
               ("oom_fragmentation", "oom_live_exhaustion", "hf_eager_attention_threshold", "concurrent_requests",
                "torch214_graph_pools_host")] + [RUNS / name for name in ("tp2_vision_encoder", "admission_rejected")]


@pytest.mark.parametrize("path", TEXT_INPUTS, ids=lambda p: p.stem)
def test_the_report_text_reads_well(path: Path, tmp_path: Path) -> None:
    """Sentences are spaced, counts agree with their nouns, sizes never show four digits before the point,
    and every table column has a header."""
    page = body(build_path_report(path, samples=8))
    text = visible_text(page)
    joined = re.findall(r".{0,30}[a-z]\.[A-Z].{0,30}", text)
    assert not joined, f"sentences run together: {joined}"
    ones = re.findall(r"(?<![\d.,])\b1 (?!(?:was|has|is|does)\b)[a-z]+s\b", text)
    assert not ones, f"a count of 1 with a plural noun: {ones}"
    assert "(s)" not in text
    assert not re.findall(r"\b\d{4}\.\d\d [KMGTP]iB", text), "a size with four digits before the point"
    for head in re.findall(r"<thead>(.*?)</thead>", page, re.S):
        assert not re.search(r"<th[^>]*>\s*</th>", head), f"a column without a header: {head}"


def test_a_state_without_a_trace_says_in_the_report_what_it_cannot_show() -> None:
    page = body(build_report(load(SCENARIOS.parent / "real" / "docubox-state-only.pickle"), samples=4))
    assert '<section id="oom">' in page and "a state without a trace</h3>" in page
    assert "The file holds the allocator&#39;s state but no trace, so an allocation failure cannot be seen" in page
    assert "admission limit" not in page
    assert headline(page).startswith("The file holds the allocator's state but no trace: 86.65 MiB live on device 0")
    assert 'id="timelines"' not in page and 'id="categories"' not in page      # no time to draw without a trace


def test_a_given_capacity_gives_the_headroom_with_or_without_an_oom() -> None:
    fits = body(build_path_report(SCENARIOS / "kv_weights_baseline.pickle", samples=4, capacity=80 << 30))
    assert ("Headroom: the highest reserved, 62.11 GiB, left 17.89 GiB of headroom on the 80.00 GiB device, not "
            "counting memory outside the allocator (capacity: given (--capacity)).") in fits
    failed = body(build_path_report(SCENARIOS / "oom_fragmentation.pickle", samples=4, capacity=40 << 30))
    assert "Headroom: the highest reserved, 38.48 GiB, left 1.52 GiB of headroom on the 40.00 GiB device" in failed
    unknown = body(build_path_report(SCENARIOS / "kv_weights_baseline.pickle", samples=4))
    assert "of headroom" not in unknown


# The tags plotly's label renderer honours that our figures use; every other tag in a label would be
# interpreted (plotly draws `<a href>` as a link) and must arrive escaped.
PLOTLY_TAGS = {"br", "b", "i", "em", "sup", "sub", "span", "extra"}


def test_no_untrusted_tag_reaches_a_figure_label(tmp_path: Path) -> None:
    """Frame files and names, metadata and annotations that carry HTML reach plotly escaped: the figures'
    strings hold only the formatting tags we write, so no stranger's link or markup is drawn."""
    link = '<a href="https://evil.example/x">x</a><svg onload=1>'
    b = SnapshotBuilder()
    frames = [{"filename": f"/srv/{link}/model.py", "line": 7, "name": link},
              {"filename": "/srv/app.py", "line": 1, "name": f"step{link}"}]
    b.segment(0x7F00_0000_0000, [(4 << 20, 4 << 20, "inactive")])
    b.alloc(0x7F00_0000_0000, 1 << 20, frames=frames, user_metadata=link)
    b.alloc(0x7F00_0010_0000, 2 << 20, frames=frames, user_metadata=link)
    b.free(0x7F00_0010_0000, 2 << 20, frames=frames)
    b.event("oom", None, 8 << 20, device_free=1 << 20, frames=frames)
    page = build_report(load(write_pickle(tmp_path / "links.pickle", b.build())))
    blocks = re.findall(r'<script type="application/json" id="(fig-[^"]*)-data">(.*?)</script>', page, re.S)
    assert len(blocks) >= 3
    tags: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            tags.update(t.lower() for t in re.findall(r"</?\s*([a-zA-Z][\w-]*)", value))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for _, text in blocks:
        walk(json.loads(text))
    assert tags <= PLOTLY_TAGS, tags - PLOTLY_TAGS
    assert any("evil.example" in t for _, t in blocks)        # the names are there, as text


@pytest.mark.parametrize("run", ["tp2_vision_encoder", "oom_other_process"])
def test_a_report_attributes_each_instant_once(monkeypatch: pytest.MonkeyPatch, run: str) -> None:
    """One attribution cache per snapshot: the peaks, the categories over time, the phases' peaks and the OOM
    entries of a report share it, so no (snapshot, device, instant) is attributed twice (the run comparison's
    per-rank peaks are asked for by name, "peak", in its own pass)."""
    from collections import Counter

    import snapanalyze.analyze.attribute as attribution
    from snapanalyze.analyze import oom, over_time, phases, ranks
    from snapanalyze.report.html import build_path_report

    calls: Counter[tuple[int, str, Any]] = Counter()
    original = attribution.attribute

    def counted(snapshot: Any, at: Any = "peak", *args: Any, **kwargs: Any) -> Any:
        calls[(id(snapshot), str(at), kwargs.get("device"))] += 1
        return original(snapshot, at, *args, **kwargs)

    for module in (oom, over_time, phases, ranks):
        monkeypatch.setattr(module, "attribute", counted)
    build_path_report(Path(__file__).resolve().parents[2] / "fixtures" / "runs" / run)
    assert calls and max(calls.values()) == 1, [k for k, n in calls.items() if n > 1]
