"""Reliability round 4 (issue 49), one test per class of hostile input: a number no log prints, a figure of
thousands of digits, a log line built to make a regex backtrack, a shape past any machine — each is one line naming
where, in bounded time, never a traceback or an unbounded value repeated back."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from snapanalyze.batch_shape import attrs_shape, shape_from_filename
from snapanalyze.errors import BadInputError, UsageError
from snapanalyze.load.engine_log import parse_engine_log
from snapanalyze.units import fmt_untrusted_int


@pytest.mark.parametrize("figure", [".", "1.2.3", "1" * 400, "5" * 5000])
def test_a_logged_figure_that_is_no_number_is_named_with_its_line(figure: str) -> None:
    with pytest.raises(BadInputError) as caught:
        parse_engine_log(["INFO boot", f"INFO Model loading took {figure} GiB"], "vllm.log")
    text = str(caught.value)
    assert "line 2: the weights bytes figure" in text and "is not a number in range" in text
    assert len(text) < 200


def test_a_rank_tag_of_thousands_of_digits_is_no_rank() -> None:
    found = parse_engine_log(["[TP" + "7" * 5000 + "] INFO Model loading took 1.5 GiB"], "vllm.log")
    assert found.figures["weights_bytes"].value == 1.5 * (1 << 30)


def test_a_profiling_line_built_to_backtrack_is_read_in_linear_time() -> None:
    repeat = "total_gpu_memory=1.0GiB peak_torch_memory=1GiB non_torch_memory=1GiB kv_cache_size=1GiB "
    line = "INFO Memory profiling results: " + repeat * 700          # 62 KB, no utilization: never matches
    start = time.perf_counter()
    with pytest.raises(BadInputError, match="no start-up line"):
        parse_engine_log([line], "vllm.log")
    assert time.perf_counter() - start < 1.0                        # the 5th power of its length before


def test_integers_past_any_figure_are_said_by_their_length() -> None:
    assert fmt_untrusted_int(10**5000) == "an integer of about 5,001 digits"
    assert fmt_untrusted_int(-(10**40)) == "a negative integer of about 41 digits"
    assert fmt_untrusted_int(123456) == "123,456"
    with pytest.raises(UsageError, match="about 5,001 digits, out of range"):
        attrs_shape("markers.parquet row 3", {"tokens": 10**5000})
    with pytest.raises(UsageError, match="has 200 digits, out of range"):
        shape_from_filename("tokens=" + "9" * 200 + ".pickle")


def test_an_oom_entry_s_free_bytes_of_thousands_of_digits_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "oom", "addr": 0, "size": 1024, "stream": 0, "time_us": 1, "frames": [],
         "device_free": 10**5000}]]}))
    for command in ("summary", "attribute", "explain-oom"):
        done = subprocess.run([sys.executable, "-m", "snapanalyze", command, str(path)], capture_output=True,
                              text=True)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [f"snapanalyze: error: {path}: inconsistent snapshot: device_traces[0][0]"
                                            ".device_free is an integer of about 5,001 digits: expected 0 ≤ "
                                            "device_free ≤ 17,592,186,044,416"]


def test_a_manifest_lists_only_snapshots_beside_it(tmp_path: Path) -> None:
    from snapanalyze.load.shapes import read_manifest
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (tmp_path / "secret.pickle").write_bytes(b"x")
    for row in ("../secret.pickle", str(tmp_path / "secret.pickle"), "sub/../../secret.pickle"):
        (sweep / "manifest.csv").write_text(f"file,tokens\n{row},128\n")
        with pytest.raises(BadInputError, match="line 2 names .*outside the manifest's folder"):
            read_manifest(sweep / "manifest.csv")
    (sweep / "manifest.csv").write_text("file,tokens\na.pickle,128\nsub/b.pickle,256\n")
    assert list(read_manifest(sweep / "manifest.csv")["tokens"]) == [128, 256]


def test_a_manifest_that_is_a_fifo_is_refused_unopened(tmp_path: Path) -> None:
    import os

    from snapanalyze.load.shapes import read_manifest
    fifo = tmp_path / "manifest.csv"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(BadInputError, match="FIFO"):
        read_manifest(fifo)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("char", ["\u061c", "\u2028", "\u2029", "\U000e0041", "\u202e", "\x1b", "\xad", "\u2066"])
def test_control_and_format_characters_are_shown_escaped(char: str) -> None:
    from snapanalyze.report.text import csv_cell, one_line, visible
    text = f"model{char}.py"
    assert char not in visible(text) and char not in one_line(text) and char not in str(csv_cell(text))
    assert "\\" in visible(text)


def test_a_file_name_with_a_newline_cannot_forge_a_second_error_line(tmp_path: Path) -> None:
    name = tmp_path / "a\nsnapanalyze: error: forged\u202e.pickle"
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "peaks", str(name)], capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "\u202e" not in done.stderr and "\\n" in done.stderr


def test_convert_prints_file_names_escaped(tmp_path: Path) -> None:
    import shutil
    root = Path(__file__).resolve().parents[2]
    source = tmp_path / "run\x1b]52;c;aGk=\x07\u202e.pickle"
    shutil.copy(root / "fixtures" / "scenarios" / "cuda_graph_pool.pickle", source)
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "convert", str(source), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b]52" in done.stdout


def test_a_segment_type_reaches_plotly_escaped() -> None:
    import inspect

    from snapanalyze import plots
    source = inspect.getsource(plots)
    assert "{r.segment_type}" not in source          # every use goes through escape()
    assert plots.escape('<a href="x">') == '&lt;a href="x"&gt;'


def test_a_capacity_the_oom_entry_contradicts_gives_no_outside_figure() -> None:
    import json
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "explain-oom",
                           str(root / "fixtures" / "scenarios" / "oom_live_exhaustion.pickle"), "--capacity", "1MiB",
                           "--format", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    oom = json.loads(done.stdout)["snapshots"][0]["ooms"][0]
    assert oom["outside_bytes"] is None and "inconsistent with the OOM entry" in oom["capacity_source"]


def test_an_nvml_sample_using_more_than_its_total_is_damage(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from snapanalyze.load.samples import read_nvml
    from snapanalyze.schema import NVML_SCHEMA
    rank = tmp_path / "rank=0"
    rank.mkdir()
    row = {name: 0 for name in NVML_SCHEMA.names}
    row.update(time_us=1, used_bytes=90 << 30, free_bytes=0, total_bytes=80 << 30)
    pq.write_table(pa.Table.from_pylist([row], schema=NVML_SCHEMA), rank / "nvml-part-00001.parquet")
    with pytest.raises(BadInputError, match="inconsistent sample .*used 96,636,764,160 B of total 85,899,345,920 B"):
        read_nvml(rank, 0)


def test_a_parquet_dictionary_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    """A markers.parquet of a few KB whose dictionary holds one 1 MiB string that all 3,000 rows pick: 3 GB once
    expanded; refused from the dictionary's lengths, never expanded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from snapanalyze.load.samples import read_markers
    from snapanalyze.schema import MARKERS_SCHEMA
    rows = 3000
    big = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), pa.array(["x" * (1 << 20)]))
    columns = {"kind": pa.array(["phase"] * rows), "name": big, "start_time_us": pa.array(np.arange(rows)),
               "end_time_us": pa.array(np.arange(rows) + 1), "attrs": pa.array(["{}"] * rows),
               "rank": pa.array(np.zeros(rows, dtype=np.int32)), "thread_id": pa.array(np.zeros(rows, dtype=np.int64)),
               "depth": pa.array(np.zeros(rows, dtype=np.int32))}
    rank = tmp_path / "rank=0"
    rank.mkdir()
    pq.write_table(pa.table(columns), rank / "markers.parquet", compression="zstd",
                   metadata_collector=None)
    assert (rank / "markers.parquet").stat().st_size < 64 << 10
    with pytest.raises(BadInputError, match="decode to 2.93 GiB"):
        read_markers(rank, 0)
    script = ("import sys\nfrom snapanalyze.load.samples import read_markers\n"
              "try:\n    read_markers(sys.argv[1], 0)\nexcept Exception:\n    pass\n"
              "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])")
    done = subprocess.run([sys.executable, "-c", script, str(rank)], capture_output=True, text=True, check=True)
    assert int(done.stdout.split()[-1]) < 400 << 10                  # KiB: the process never held the 3 GB
    assert MARKERS_SCHEMA.names == list(columns)


def test_a_memo_index_bomb_is_refused_before_it_allocates(tmp_path: Path) -> None:
    """A 9-byte pickle whose LONG_BINPUT asks for a memo of 134 million slots (1 GiB): refused under
    --max-memory 256MiB without the process growing (it reached 2.1 GB and exited 0)."""
    import struct
    path = tmp_path / "memo.pickle"
    path.write_bytes(b"\x80\x04]r" + struct.pack("<I", 0x07FFFFFF) + b".")
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large test process reports its size
    script = ("import sys\n"
              "from snapanalyze.cli import main\n"
              "try:\n    main(sys.argv[1:])\n"
              "except SystemExit as exc:\n"
              "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
              "    print('maxrss', hwm.split()[1], file=sys.stderr)\n"
              "    raise\n")
    done = subprocess.run([sys.executable, "-c", script, "--max-memory", "256MiB", "peaks", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "a pickle built to exhaust memory" in done.stderr
    rss = int(next(line for line in done.stderr.splitlines() if line.startswith("maxrss")).split()[-1])
    assert rss < 300 * 1024                                          # KiB


def test_retried_oom_entries_are_explained_once_per_situation(tmp_path: Path) -> None:
    """An engine that retries records hundreds of oom entries with nothing allocated or freed between them: one
    attribution (and one look at the end state's split segments) serves them all (44 ms each before: 2,000 entries
    took 90 s), with the same answer per entry."""
    from unittest import mock

    import snapanalyze as sa
    from snapanalyze.analyze import oom as oom_module
    root = Path(__file__).resolve().parents[2]
    snap = pickle.loads((root / "fixtures" / "scenarios" / "oom_fragmentation.pickle").read_bytes())
    trace = snap["device_traces"][0]
    first = next(e for e in trace if e["action"] == "oom")
    trace.extend(dict(first, time_us=first["time_us"] + i + 1) for i in range(300))
    path = tmp_path / "retries.pickle"
    path.write_bytes(pickle.dumps(snap))
    loaded = sa.load(path)
    with mock.patch.object(oom_module, "_categories", wraps=oom_module._categories) as attributed, \
            mock.patch.object(oom_module, "_split_segments", wraps=oom_module._split_segments) as split:
        explained = oom_module.explain_oom(loaded)
    assert len(explained.verdicts) == 301
    assert attributed.call_count == 1 and split.call_count == 1      # nothing changed memory between them
    assert len({(v.verdict, v.active_bytes, v.reserved_bytes) for v in explained.verdicts}) == 1


def test_a_large_source_file_full_of_syntax_errors_is_parsed_a_bounded_number_of_times() -> None:
    """--source: eight 1 MiB files with a syntax error on every line took over a minute (each parsed 32 times);
    the retries are bounded by what they parse, about 3 MiB per file."""
    import ast
    from unittest import mock

    from snapanalyze.load import source
    text = "x = 1\n" * 175_000                                       # about 1 MiB
    calls = []

    def failing(code: str, *args: object, **kwargs: object) -> ast.Module:
        calls.append(len(code))
        raise SyntaxError("invalid syntax", ("f.py", len(calls), 1, ""))
    with mock.patch.object(source.ast, "parse", failing):
        assert source._tree(text).startswith("not parsed")
    assert len(calls) == source.PARSE_BUDGET // len(text) == 2
    calls.clear()
    with mock.patch.object(source.ast, "parse", failing):
        source._tree("x = 1\n" * 1000)                               # a small file keeps its 32 retries
    assert len(calls) == 32


def test_an_instant_below_the_window_start_has_no_negative_transient() -> None:
    """Memory freed since the window began (a MoE prefill's 512 MiB expert buffer) is below the baseline there:
    the answer says so, never 'transient -512.00 MiB' nor a negative byte figure in JSON."""
    import json

    from click.testing import CliRunner

    from snapanalyze.cli import main
    path = str(Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "moe_long_prefill.pickle")
    text = CliRunner().invoke(main, ["attribute", path, "--at", "event:229"]).output
    assert "active 57.32 GiB, 512.00 MiB below the 57.82 GiB at the window start (freed since)" in text
    assert "transient -" not in text and "at the event" not in text
    doc = json.loads(CliRunner().invoke(main, ["attribute", path, "--at", "event:229", "--format", "json"]).output)
    device = doc["devices"][0]
    assert device["transient_bytes"] == 0 and device["below_baseline_bytes"] == 512 << 20
    assert device["peak"]["active_bytes"] + device["below_baseline_bytes"] == device["baseline_active_bytes"]
