"""validate: a snapshot whose values contradict each other is a one-line error naming the field and entry;
one the analysis can live with is a warning (stderr and JSON `warnings`) with the affected numbers withheld;
a fuzz over the snapshot structure finds no negative byte count or duration and no traceback."""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import BASE, REAL_FILES, SnapshotBuilder, write_pickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapanalyze.cli import main
from snapanalyze.errors import BadInputError, InputWarning
from snapanalyze.load import load
from snapanalyze.replay import replay

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "fixtures").glob("**/*.pickle"))


def snapshot() -> dict[str, Any]:
    """Two segments, allocations and frees with times, an OOM: every part validation looks at."""
    b = SnapshotBuilder()
    b.segment(BASE, [(MiB, MiB, "active_allocated"), (MiB, 0, "inactive")])
    b.segment(BASE + 4 * MiB, [(2 * MiB, 2 * MiB - 100, "active_allocated")])
    b.event("segment_alloc", BASE + 4 * MiB, 2 * MiB)
    b.alloc(BASE + 4 * MiB, 2 * MiB - 100)
    b.alloc(BASE + MiB, MiB // 2)
    b.free(BASE + MiB, MiB // 2)
    b.alloc(BASE, MiB)
    b.event("oom", None, 8 * MiB, device_free=3 * MiB)
    return b.build()


def run(path: Path, *args: str) -> Any:
    return CliRunner().invoke(main, [args[0], str(path), *args[1:]])


def one_line_error(result: Any) -> str:
    """The refusal's one line. Warnings the input raised before it (streamed as they arise: times that run
    backwards, say) may precede it, each one line of its own; nothing else may."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("snapanalyze: error: "), result.stderr
    assert all(line.startswith("snapanalyze: warning: ") for line in lines[:-1]), result.stderr
    lines = lines[-1:]
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return lines[0]


def refused(tmp_path: Path, raw: Any) -> str:
    """The one-line CLI error for `raw`, after checking the Python API raises the same BadInputError."""
    path = write_pickle(tmp_path / "bad.pickle", raw)
    with pytest.raises(BadInputError) as caught:
        replay(load(path))
    line = one_line_error(run(path, "peaks"))
    assert caught.value.problem in line
    return line


# -- fatal: the numbers would be meaningless -------------------------------------------------------------

def test_a_negative_size_names_the_entry(tmp_path: Path) -> None:
    raw = snapshot()
    raw["device_traces"][0][2]["size"] = -5
    assert "device_traces[0][2].size is -5: expected 0 ≤ size" in refused(tmp_path, raw)


def test_an_absurd_size_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["device_traces"][0][1]["size"] = 1 << 62
    assert "device_traces[0][1].size is 4,611,686,018,427,387,904" in refused(tmp_path, raw)


def test_an_oom_with_a_negative_size_or_free_reading_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["device_traces"][0][-1]["size"] = -1
    assert "device_traces[0][6].size is -1" in refused(tmp_path, raw)
    raw = snapshot()
    raw["device_traces"][0][-1]["device_free"] = -3
    assert "device_traces[0][6].device_free is -3" in refused(tmp_path, raw)


def test_a_duplicated_segment_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"].append(copy.deepcopy(raw["segments"][0]))
    assert "segments[2] (device 0, 0x7f0000000000) repeats segments[0]" in refused(tmp_path, raw)


def test_overlapping_segments_are_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"][1]["address"] = BASE + MiB
    for block in raw["segments"][1]["blocks"]:
        block["address"] -= 3 * MiB
    assert "overlaps segments[0]" in refused(tmp_path, raw)


def test_a_device_the_traces_do_not_have_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"][1]["device"] = 1000
    assert "segments[1].device is 1000, but the snapshot traces 1 device(s)" in refused(tmp_path, raw)


def test_blocks_outside_their_segment_or_overlapping_are_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"][0]["blocks"][1]["address"] += 64 * MiB
    assert "segments[0].blocks[1]" in refused(tmp_path, raw) and "outside its segment" in refused(tmp_path, raw)
    raw = snapshot()
    raw["segments"][0]["blocks"][1]["address"] -= 512
    assert "segments[0].blocks[1] (0x7f00000ffe00) overlaps the block before it" in refused(tmp_path, raw)


def test_a_block_asking_for_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"][1]["blocks"][0]["requested_size"] = 3 * MiB
    assert "segments[1].blocks[0].requested_size is 3,145,728: expected 0 ≤ requested_size ≤ its size" \
        in refused(tmp_path, raw)


def test_a_trace_freeing_more_than_was_reserved_is_refused(tmp_path: Path) -> None:
    raw = snapshot()
    trace = raw["device_traces"][0]
    trace.insert(1, {**trace[0], "action": "segment_alloc", "size": 64 * MiB})   # never freed, not in segments
    line = refused(tmp_path, raw)
    assert "device 0's reserved bytes would be" in line and "its events free more than" in line


def test_wrong_types_name_the_field(tmp_path: Path) -> None:
    raw = snapshot()
    raw["device_traces"][0][3]["addr"] = "0x10"
    assert "device_traces[0][3].addr is the string '0x10', expected a non-negative integer" in \
        one_line_error(run(write_pickle(tmp_path / "t.pickle", raw), "summary"))
    raw = snapshot()
    raw["segments"][0]["segment_pool_id"] = [7] * 1_000_000       # a shared-reference blow-up of a pool id
    assert "segments[0].segment_pool_id is a list of 1000000 items, expected a pair of integers" in \
        one_line_error(run(write_pickle(tmp_path / "p.pickle", raw), "summary"))


# -- warnings: the analysis lives with it, and says what it withheld -------------------------------------

def test_times_that_run_backwards_withhold_windows_and_durations(tmp_path: Path) -> None:
    raw = snapshot()
    trace = raw["device_traces"][0]
    trace[3]["time_us"], trace[4]["time_us"] = trace[4]["time_us"], trace[3]["time_us"]
    path = write_pickle(tmp_path / "t.pickle", raw)
    with pytest.warns(InputWarning, match=r"device_traces\[0\]\[4\]\.time_us runs backwards"):
        assert load(path).trace(0).time_us is None
    result = run(path, "peaks", "--format", "json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["devices"][0]["window_us"] is None and doc["devices"][0]["peak"]["duration_us"] is None
    assert len(doc["warnings"]) == 1 and "device 0's times are not used" in doc["warnings"][0]
    assert result.stderr.strip().splitlines() == [f"snapanalyze: warning: {doc['warnings'][0]}"]


def test_non_finite_settings_are_withheld_and_the_json_stays_strict(tmp_path: Path) -> None:
    """A NaN or infinite allocator setting would write `NaN` into JSON (not JSON): it is withheld, named."""
    raw = snapshot()
    raw["allocator_settings"] = {"garbage_collection_threshold": float("nan"), "expandable_segments": False,
                                 "extra": {"ratio": float("-inf"), "ok": 0.5}}
    path = write_pickle(tmp_path / "nan.pickle", raw)
    for command in ("summary", "peaks", "attribute", "explain-oom", "phases"):
        result = run(path, command, "--format", "json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout, parse_constant=lambda c, command=command: pytest.fail(f"{command} wrote {c}"))
        assert any("garbage_collection_threshold is not a finite number: withheld" in w for w in doc["warnings"])
        assert any("allocator_settings.extra.ratio is not a finite number" in w for w in doc["warnings"])
    with pytest.warns(InputWarning, match="not a finite number"):
        settings = load(path).allocator_settings
    assert settings == {"expandable_segments": False, "extra": {"ok": 0.5}}


def test_a_time_past_year_9999_still_prints(tmp_path: Path) -> None:
    raw = snapshot()
    for i, event in enumerate(raw["device_traces"][0]):
        event["time_us"] = 253_402_300_800_000_000 + i       # 10000-01-01: past what datetime can show
    path = write_pickle(tmp_path / "y10k.pickle", raw)
    for command in ("summary", "peaks", "attribute", "explain-oom", "phases"):
        result = run(path, command)
        assert result.exit_code == 0 and result.exception is None, result.output
    assert "from 253,402,300,800,000,000 µs since 1970 UTC" in run(path, "peaks").stdout


def test_blocks_that_do_not_fill_their_segment_are_a_warning(tmp_path: Path) -> None:
    raw = snapshot()
    raw["segments"][0]["total_size"] += MiB
    with pytest.warns(InputWarning, match=r"segments\[0\]: its blocks hold 2,097,152 of its 3,145,728 bytes"):
        load(write_pickle(tmp_path / "s.pickle", raw))


@pytest.mark.parametrize("path", SHIPPED + REAL_FILES, ids=lambda p: p.name)
def test_every_shipped_and_real_file_is_consistent(path: Path) -> None:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        assert load(path).warnings == ()


# -- the fuzz: every input either analyses with its invariants or fails in one line ----------------------

EXAMPLES = int(os.environ.get("SNAPANALYZE_FUZZ_EXAMPLES", "120"))
OUTCOMES: Counter[str] = Counter()
COMMANDS = (("peaks", "--format", "json"), ("attribute", "--format", "json"), ("summary", "--format", "json"),
            ("explain-oom", "--format", "json"), ("attribute",), ("summary",))
# A stranger's text in any field: terminal escapes (OSC 52 clipboard, clear screen, C1 CSI), a carriage return
# and backspace that forge a line, bidi override and zero-width characters, HTML a renderer could interpret
# as a link, a spreadsheet formula, and NUL.
PAYLOADS = ("\x1b]52;c;ZXZpbA==\x07", "\x1b[2J\r", "\x9b31m", "x\bforged", "\u202eevil\u200b", "\x00",
            '<a href="https://evil.example/x">x</a>', "=HYPERLINK(1)", "\u061cAL\u2028line\u2029para",
            "\U000e0041tag\U000e007f", "\xadsoft\u2066iso\u2069")
# Unicode's control, format, line and paragraph separator characters (Cc, Cf, Zl, Zp), newline and tab aside.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
                    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")
# file names a stranger chose: bidi override, a newline, OSC 52, tag characters, a line separator
FILE_NAMES = ("fuzz.pickle", "fu\u202ezz.pickle", "a\nb.pickle", "\x1b]52;c;ZXZpbA==\x07.pickle",
              "\U000e0041tag.pickle", "\u2028x.pickle")
SIGNED = ("allocator_settings", "delta", "change", "event_index", "until_index", "index")


def _bases() -> list[Any]:
    two_devices = SnapshotBuilder()
    two_devices.segment(BASE, [(MiB, MiB, "active_allocated")], device=1)
    two_devices.alloc(BASE, MiB, device=1)
    two_devices.alloc(BASE + 8 * MiB, MiB)
    return [snapshot(), two_devices.build(n_devices=2),
            pickle.loads((ROOT / "fixtures/scenarios/oom_fragmentation.pickle").read_bytes()),
            pickle.loads((ROOT / "fixtures/real/flexgen-oom-t2.0.pickle").read_bytes()),
            pickle.loads((ROOT / "fixtures/scenarios/torch214_graph_pools_host.pickle").read_bytes())]


BASES = _bases()


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    items = obj.items() if isinstance(obj, dict) else enumerate(obj[:6]) if isinstance(obj, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


PATHS = [list(_paths(base)) for base in BASES]
ODD = st.sampled_from([-1, 0, 1, 1000, -(1 << 40), 1 << 44, 1 << 62, 1 << 64, 10**5000, -(10**400), None, "x",
                       "\ud800", 1.5, [], {}, True, [0] * 3, (1, 2), float("nan"), float("-inf"), *PAYLOADS])
MUTATION = st.tuples(st.integers(0, 10**6), st.sampled_from(["delete", "odd", "negate", "scale", "shift",
                                                              "duplicate", "swap", "reverse_times", "text"]),
                     ODD, st.integers(-(1 << 20), 1 << 20))


def _mutate(raw: Any, paths: list[tuple[Any, ...]], pick: int, kind: str, odd: Any, shift: int) -> None:
    path = paths[pick % len(paths)]
    parent = raw
    try:                                 # an earlier mutation may have changed what the path leads through
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        parent[key]
    except (KeyError, IndexError, TypeError):
        return
    if not isinstance(parent, (dict, list)):      # a string that replaced a container indexes, but is immutable
        return
    value = parent[key]
    number = isinstance(value, int) and not isinstance(value, bool)
    if kind == "delete":
        del parent[key]
    elif kind == "odd" or (kind in ("negate", "scale", "shift") and not number):
        parent[key] = odd
    elif kind == "text":             # a payload inside a string the analysis keeps (names, metadata, settings)
        parent[key] = f"{value}{PAYLOADS[shift % len(PAYLOADS)]}" if isinstance(value, str) else value
    elif kind == "negate":
        parent[key] = -value
    elif kind == "scale":
        parent[key] = value * 1000
    elif kind == "shift":
        parent[key] = value + shift
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))
    elif kind == "swap" and isinstance(parent, list) and len(parent) > 1:
        other = (key + 1) % len(parent)
        parent[key], parent[other] = parent[other], parent[key]
    elif kind == "reverse_times" and isinstance(raw, dict) and raw.get("device_traces"):
        trace = raw["device_traces"][0] if isinstance(raw["device_traces"], list) else []
        times = [e.get("time_us") for e in trace if isinstance(e, dict)]
        for entry, time in zip((e for e in trace if isinstance(e, dict)), reversed(times)):
            entry["time_us"] = time


def _negatives(doc: Any, path: str = "") -> Iterator[str]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _negatives(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _negatives(value, f"{path}[{i}]")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool) and doc < 0:
        last = path.rsplit(".", 1)[-1]
        if not any(s in path for s in SIGNED[:3]) and not last.endswith(SIGNED[3:]):
            yield f"{path} = {doc}"


def _check_text(command: str, text: str) -> None:
    unsafe = UNSAFE.findall(text)
    assert not unsafe, f"{command}: raw control, bidi or zero-width characters reach the terminal: {unsafe[:5]}"


def _check_output(command: str, doc: dict[str, Any]) -> None:
    assert not list(_negatives(doc)), f"{command}: negative numbers {list(_negatives(doc))[:3]}"
    if command == "attribute":
        for device in doc["devices"]:
            assert sum(c["bytes"] for c in device["categories"]) == device["peak"]["active_bytes"]


@pytest.fixture(scope="module", autouse=True)
def _report_outcomes() -> Iterator[None]:
    yield
    if "SNAPANALYZE_FUZZ_EXAMPLES" in os.environ:
        print(f"\nfuzz: {EXAMPLES} examples → command outcomes {dict(sorted(OUTCOMES.items()))}")


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize="SNAPANALYZE_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(base=st.integers(0, len(BASES) - 1), mutations=st.lists(MUTATION, min_size=1, max_size=3),
       name=st.sampled_from(FILE_NAMES))
def test_fuzz_every_input_analyses_with_its_invariants_or_fails_in_one_line(
        tmp_path: Path, base: int, mutations: list[tuple[int, str, Any, int]], name: str) -> None:
    raw = copy.deepcopy(BASES[base])
    for pick, kind, odd, shift in mutations:
        _mutate(raw, PATHS[base], pick, kind, odd, shift)
    path = write_pickle(tmp_path / name, raw)
    for command in COMMANDS:
        result = CliRunner().invoke(main, [command[0], str(path), *command[1:]])
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            f"{command[0]} raised {result.exception!r}"
        if result.exit_code == 2:
            one_line_error(result)
            OUTCOMES["refused (exit 2, one line)"] += 1
            continue
        assert result.exit_code == 0, (command, result.output)
        _check_text(command[0], result.stderr)
        if "json" not in command:
            _check_text(command[0], result.stdout)
            OUTCOMES["analysed, terminal text inert"] += 1
            continue
        _check_output(command[0], json.loads(
            result.stdout, parse_constant=lambda c, name=command[0]: pytest.fail(f"{name} wrote {c}: not JSON")))
        OUTCOMES["analysed, invariants hold" + (" (with warnings)" if result.stderr else "")] += 1


# Engine logs (issue 49): the start-up lines the budget reads, their figures replaced by what a hostile or damaged log
# holds — no number, several points, hundreds or thousands of digits, negative, a payload — and lines repeated to
# make a regex backtrack. Every outcome is a budget with no negative byte figure and inert text, or one line.
LOG_TEMPLATES = (
    "INFO [utils.py:328] non-default args: {{'model': 'm', 'gpu_memory_utilization': {x}}}",
    "DEBUG [gpu_worker.py:244] Memory profiling takes 3.10 seconds. Total non KV cache memory: {x}GiB; torch peak "
    "memory increase: {x}GiB; non-torch forward increase memory: {x}GiB; weights memory: {x}GiB.",
    "INFO [gpu_worker.py:245] Available KV cache memory: {x} GiB",
    "INFO [kv_cache_utils.py:716] GPU KV cache size: {x} tokens",
    "INFO Memory profiling results: total_gpu_memory={x}GiB initial_memory_usage=1GiB peak_torch_memory={x}GiB "
    "memory_usage_post_profile=1GiB non_torch_memory={x}GiB kv_cache_size={x}GiB gpu_memory_utilization={x}",
    "[TP{x}] INFO Model loading took {x} GiB and 10 seconds",
)
FIGURES = st.one_of(st.sampled_from([".", ",,,", "1.2.3", "-0", "0", "-4.50", "1" * 400, "5" * 5000, "nan", "1e9",
                                     "0.95", "79.19"]),
                    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: f"{v:.2f}"), st.sampled_from(PAYLOADS))


@pytest.mark.slow
@settings(max_examples=max(EXAMPLES // 4, 30), deadline=None, derandomize="SNAPANALYZE_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(st.integers(0, len(LOG_TEMPLATES) - 1), FIGURES, st.integers(1, 40)), min_size=1,
                      max_size=4))
def test_fuzz_engine_logs_give_a_budget_or_one_line(tmp_path: Path, lines: list[tuple[int, str, int]]) -> None:
    text = "\n".join((LOG_TEMPLATES[t].format(x=x) + " ") * (repeat if t == 4 else 1) for t, x, repeat in lines)
    log = tmp_path / "engine.log"
    log.write_text(text + "\n", encoding="utf-8", errors="surrogateescape")
    snapshot = Path(__file__).resolve().parents[2] / "fixtures" / "sweeps" / "vllm_budget" / "run-01.pickle"
    result = CliRunner().invoke(main, ["budget", str(snapshot), "--shape-from", "none", "--engine-log", str(log),
                                       "--total", "80GiB", "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), f"budget raised {result.exception!r}"
    if result.exit_code == 2:
        one_line_error(result)
        OUTCOMES["engine log refused (exit 2, one line)"] += 1
        return
    assert result.exit_code in (0, 1), result.output
    _check_text("budget", result.stderr)
    doc = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"budget wrote {c}: not JSON"))
    negative = [n for n in _negatives(doc) if "_bytes" in n and not n.split(" = ")[0].endswith(
        ("over_budget_bytes", "over_device_bytes", "margin_bytes", "headroom_bytes"))]
    assert not negative, f"budget: negative byte figures {negative[:3]}"
    OUTCOMES["engine log budgeted"] += 1
