"""CLI: `peaks` (table and the JSON contract, exact numbers), `summary`, and one clear line plus exit code 2
for every bad file (a traceback only with --debug)."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import (
    BASE,
    REAL_DIR,
    REAL_FILES,
    SnapshotBuilder,
    naive_replay,
    range_contains,
    real_ids,
    version_from_name,
    write_gzip,
    write_pickle,
    write_torch_zip,
)

from snapanalyze.cli import main
from snapanalyze.units import fmt_bytes, fmt_time_us

MiB = 1024 * 1024
EXACT_FILE = next(p for p in REAL_FILES if p.name == "cs336-step-user-metadata-t2.11.pickle")


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A $COLUMNS of the shell running the tests would fit the text to it: these tests read it unfitted."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


# -- peaks --------------------------------------------------------------------------------------------------

def test_peaks_report_pinned_host_memory_apart_from_the_device() -> None:
    path = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "torch214_graph_pools_host.pickle"
    expected = json.loads(path.with_name("torch214_graph_pools_host.expected.json").read_text())
    doc = json.loads(run("peaks", path, "--format", "json").stdout)
    assert doc["devices"][0]["peak"]["active_bytes"] == expected["peak"]["active_bytes"]   # no host bytes in it
    (host,) = doc["host"]
    assert host["device"] == "host"
    assert host["peak"]["active_bytes"] == expected["host"]["peak"]["active_bytes"]
    assert host["peak"]["event_index"] == expected["host"]["peak"]["event_index"]
    table = run("peaks", path).stdout
    assert "pinned host memory (not device memory): 12 events" in table
    assert json.loads(run("peaks", EXACT_FILE, "--format", "json").stdout)["host"] is None


def test_peaks_table_names_baseline_and_peaks(real_raw: dict[str, Any]) -> None:
    ref = naive_replay(real_raw[EXACT_FILE.name], 0)
    result = run("peaks", EXACT_FILE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0] == str(EXACT_FILE)
    assert f"device 0: {len(ref.active):,} events" in out
    baseline_line = next(line for line in out.splitlines() if "baseline" in line)
    assert fmt_bytes(ref.baseline_active) in baseline_line
    assert fmt_bytes(ref.baseline_reserved) in baseline_line
    header = next(line for line in out.splitlines() if line.startswith("peak"))
    for column in ("event", "time", "active", "reserved", "allocated (est.)", "transient", "held"):
        assert column in header
    peak = max(ref.active)
    first_row = out.splitlines()[out.splitlines().index(header) + 2]
    assert first_row.split()[0] == "1"
    assert f"{ref.active.index(peak):,}" in first_row
    assert fmt_bytes(peak) in first_row
    # The allocated column is labelled an estimate in the footer.
    assert "estimate" in out.splitlines()[-1]
    assert "warning" not in out


def test_peaks_json_contract_with_exact_numbers(real_raw: dict[str, Any]) -> None:
    raw = real_raw[EXACT_FILE.name]
    ref = naive_replay(raw, 0)
    result = run("peaks", "--format", "json", EXACT_FILE)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["source"] == str(EXACT_FILE)
    [dev] = doc["devices"]
    assert dev["device"] == 0
    assert dev["baseline_active_bytes"] == ref.baseline_active
    peak = max([ref.baseline_active] + ref.active)
    index = ref.active.index(peak) if peak > ref.baseline_active else -1
    assert dev["peak"]["event_index"] == index
    assert dev["peak"]["time_us"] == raw["device_traces"][0][index]["time_us"]
    assert dev["peak"]["active_bytes"] == peak
    assert dev["peak"]["reserved_bytes"] == ref.reserved[index]
    assert isinstance(dev["peaks"], list) and dev["peaks"][0] == dev["peak"]
    for p in dev["peaks"]:
        assert set(p) >= {"event_index", "time_us", "active_bytes", "reserved_bytes"}
        assert p["active_bytes"] == ref.active[p["event_index"]]
        assert p["reserved_bytes"] == ref.reserved[p["event_index"]]
    # The estimate is labelled as one.
    assert "estimate" in json.dumps(doc["notes"])


@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_peaks_json_for_every_real_file(path: Path, real_raw: dict[str, Any]) -> None:
    ref = naive_replay(real_raw[path.name], 0)
    result = run("peaks", "--format", "json", "--top", "3", path)
    assert result.exit_code == 0, result.output
    [dev] = json.loads(result.stdout)["devices"]
    assert dev["baseline_active_bytes"] == ref.baseline_active
    assert dev["peak"]["active_bytes"] == max([ref.baseline_active] + ref.active)
    assert 1 <= len(dev["peaks"]) <= 3


def test_peaks_json_when_the_window_only_frees(tmp_path: Path) -> None:
    b = SnapshotBuilder(times=False)
    b.segment(BASE, [(4096, 4000, "inactive"), (2 * MiB - 4096, 0, "inactive")])
    b.free(BASE, 4000)
    result = run("peaks", "--format", "json", write_pickle(tmp_path / "f.pickle", b.build()))
    assert result.exit_code == 0, result.output
    peak = json.loads(result.stdout)["devices"][0]["peak"]
    assert (peak["event_index"], peak["time_us"], peak["active_bytes"]) == (-1, None, 4000)
    table = run("peaks", tmp_path / "f.pickle").stdout
    assert "baseline" in table.split("----")[-1]     # the peak row names the baseline
    assert "no timestamps" in table


def test_peaks_several_devices_and_device_option(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")], device=0)
    b.segment(BASE, [(2 * MiB, 0, "inactive")], device=1)
    b.alloc(BASE, 10, device=0)
    b.event("free_completed", BASE, 10, device=0)
    b.alloc(BASE, 20, device=1)
    b.event("free_completed", BASE, 20, device=1)
    path = write_pickle(tmp_path / "two.pickle", b.build())
    doc = json.loads(run("peaks", "--format", "json", path).stdout)
    assert [(d["device"], d["peak"]["active_bytes"]) for d in doc["devices"]] == [(0, 10), (1, 20)]
    doc = json.loads(run("peaks", "--format", "json", "--device", "1", path).stdout)
    assert [d["device"] for d in doc["devices"]] == [1]
    bad = run("peaks", "--device", "7", path)
    assert bad.exit_code == 2
    assert "no device 7" in bad.stderr and "Traceback" not in bad.stderr


def test_peaks_table_warns_when_the_replay_disagrees_with_the_end_state(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.alloc(BASE, 100)                   # live at the end but not in segments
    result = run("peaks", write_pickle(tmp_path / "w.pickle", b.build()))
    assert result.exit_code == 0
    assert "warning: the replay does not match the end state" in result.stdout


# -- summary ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_summary_table_for_every_real_file(path: Path, real_raw: dict[str, Any]) -> None:
    raw = real_raw[path.name]
    result = run("summary", path)
    assert result.exit_code == 0, result.output
    out = result.stdout
    torch_line = next(line for line in out.splitlines() if line.strip().startswith("torch:"))
    assert "inferred" in torch_line
    version = version_from_name(path)
    if version is not None:
        rng = torch_line.split("torch:")[1].split("(inferred")[0].strip()
        assert range_contains(rng, version), rng
    entries = raw["device_traces"][0] if raw["device_traces"] else []
    assert f"device 0: {len(entries):,} events" in out
    for action in {e["action"] for e in entries}:
        count = sum(e["action"] == action for e in entries)
        assert f"{action} {count:,}" in out
    assert "OOM entries: none" in out
    expected_pools = "0,1, 0,2" if path.name.startswith("verl") else "none"
    assert f"private pools: {expected_pools};" in out


def test_summary_json_and_oom_lines(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")], pool=(0, 1))
    b.alloc(BASE, 100)
    b.event("oom", None, 40 * MiB, device_free=3 * MiB)
    path = write_pickle(tmp_path / "oom.pickle", b.build())
    table = run("summary", path).stdout
    assert "OOM on device 0 at event 1: request 40.00 MiB, device free 3.00 MiB" in table
    assert "private pools: 0,1;" in table
    doc = json.loads(run("summary", "--format", "json", path).stdout)
    assert doc["ooms"][0]["device_free"] == 3 * MiB
    assert doc["torch_version"]["inferred"] is True
    assert doc["devices"][0]["actions"] == {"alloc": 1, "oom": 1}


# -- bad files ----------------------------------------------------------------------------------------------

def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        path = d / name
        path.write_bytes(data)
        return path
    return make


class _Touch:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        import os
        return (os.system, (f"touch '{self.target}'",))


def _hostile(wrap: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        payload = pickle.dumps(_Touch(str(d / "pwned")))
        path = d / f"evil-{wrap}.pickle"
        if wrap == "gzip":
            return write_gzip(path, payload)
        if wrap == "zip":
            return write_torch_zip(path, payload)
        path.write_bytes(payload)
        return path
    return make


def _half_real(d: Path) -> Path:
    data = REAL_FILES[0].read_bytes()
    return _write("half.pickle", data[: len(data) // 2])(d)


BAD: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated": (_half_real, "truncated"),
    "empty": (_write("empty.pickle", b""), "empty"),
    "random bytes": (_write("random.bin", b"\xcd" + random.Random(1).randbytes(2047)), "not a snapshot file"),
    "text file": (_write("notes.txt", b"hello, this is text\n"), "not a snapshot file"),
    "pickled int": (_write("int.pickle", pickle.dumps(7)), "holds an int (7)"),
    "dict without segments": (_write("d.pickle", pickle.dumps({"device_traces": []})), "no 'segments'"),
    "list of ints": (_write("l.pickle", pickle.dumps([1, 2, 3])), "not segments"),
    "segments not a list": (_write("s.pickle", pickle.dumps({"segments": 3})), "'segments' is not a list"),
    "hostile": (_hostile("plain"), "refused"),
    "hostile gzip": (_hostile("gzip"), "refused"),
    "hostile zip": (_hostile("zip"), "refused"),
    "missing": (lambda d: d / "nope.pickle", "no such file"),
}


@pytest.mark.parametrize("command", ["peaks", "summary"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_gives_one_line_and_exit_code_2(tmp_path: Path, case: str, command: str) -> None:
    make, problem = BAD[case]
    path = make(tmp_path)
    result = run(command, path)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"snapanalyze: error: {path}: ")
    assert problem in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "pwned").exists()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def test_real_process_error_and_debug_traceback(tmp_path: Path) -> None:
    path = _half_real(tmp_path)
    plain = _cli("peaks", str(path), cwd=tmp_path)
    assert plain.returncode == 2
    assert plain.stdout == ""
    [line] = plain.stderr.strip().splitlines()
    assert line.startswith(f"snapanalyze: error: {path}: truncated pickle: the file ends before the snapshot")
    debug = _cli("--debug", "peaks", str(path), cwd=tmp_path)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "BadInputError" in debug.stderr and str(path) in debug.stderr


def test_real_process_refuses_a_hostile_pickle(tmp_path: Path) -> None:
    path = _hostile("plain")(tmp_path)
    proc = _cli("summary", str(path), cwd=tmp_path)
    assert proc.returncode == 2
    assert "refused" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "pwned").exists()


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("snapanalyze, version")
    help_text = run("--help").stdout
    assert "peaks" in help_text and "summary" in help_text


def test_attribute_with_the_programs_source(tmp_path: Path) -> None:
    """--source resolves the hand-written model's frames: its SwiGLU intermediates are mlp by their class, no
    longer inferred from the call tree, frames show Class.method, and the table says which bytes are inferred;
    a missing root is one line, exit 2."""
    stem = "cs336-step-user-metadata-t2.11"
    path = REAL_DIR / f"{stem}.pickle"
    source = REAL_DIR / "source" / stem
    plain = json.loads(run("attribute", str(path), "--format", "json").stdout)
    with_source = run("attribute", str(path), "--source", str(source), "--format", "json")
    assert with_source.exit_code == 0, with_source.output
    cats = {c["category"]: c for c in json.loads(with_source.stdout)["devices"][0]["categories"]}
    before = {c["category"]: c for c in plain["devices"][0]["categories"]}
    # without the source the call tree names the MLP, every byte inferred; with it the class decides
    assert before["mlp"]["inferred_bytes"] == before["mlp"]["bytes"] > 5 * 2**30
    assert cats["mlp"]["bytes"] > 5 * 2**30 and cats["mlp"]["inferred_bytes"] == 0
    assert any(f.endswith(":SwiGLU.forward") for f in cats["mlp"]["top_frames"])
    assert cats["weights"]["inferred_bytes"] == cats["weights"]["bytes"] > 0
    table = run("attribute", str(path), "--source", str(source)).stdout
    assert "inferred" in table.splitlines()[4] and "--explain shows the arithmetic" in table
    assert "would resolve their frames" in run("attribute", str(path)).stdout
    missing = run("attribute", str(path), "--source", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "not a directory" in missing.stderr and missing.stderr.count("\n") == 1


# -- attribute --at time: -----------------------------------------------------------------------------------

TP2 = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "tp2_vision_encoder"


def test_at_time_accepts_what_the_outputs_print_offsets_and_epoch_us() -> None:
    peak = json.loads(run("peaks", TP2, "--rank", "1", "--format", "json").stdout)["devices"][0]
    t, first = peak["peak"]["time_us"], peak["first_time_us"]
    printed = fmt_time_us(t)                                    # "2026-01-21 12:53:23.497459 UTC", as shown
    assert printed in run("peaks", TP2, "--rank", "1").stdout
    offset_ms = f"+{(t - first) / 1000:.3f}ms"
    offset_s = f"+{(t - first) / 1e6:.6f}s"
    iso = printed.replace(" UTC", "Z").replace(" ", "T")
    for spec in (printed, iso, iso[:-1], offset_ms, offset_s, f"+{t - first}us", str(t)):
        doc = json.loads(run("attribute", TP2, "--rank", "1", "--at", f"time:{spec}", "--format", "json").stdout)
        d = doc["devices"][0]
        assert (d["peak"]["event_index"], d["peak"]["time_us"]) == (peak["peak"]["event_index"], t), spec
        assert d["instant"] == f"time {printed}"
    before = json.loads(run("attribute", TP2, "--rank", "1", "--at", "time:+0us", "--format", "json").stdout)
    assert before["devices"][0]["peak"]["event_index"] == 0                 # the window's first event
    bad = run("attribute", TP2, "--rank", "1", "--at", "time:yesterday")
    assert bad.exit_code == 2 and "2026-04-18 02:34:01.223438 UTC" in bad.stderr and "+2.38ms" in bad.stderr


# -- progress: on a terminal only, on stderr ------------------------------------------------------------------

def test_progress_on_a_terminal_names_each_rank_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import snapanalyze.cli.analyze as cli_analyze
    from snapanalyze.cli.progress import Progress

    class OnTerminal(Progress):
        def __init__(self) -> None:
            super().__init__(enabled=True)

    assert run("attribute", TP2, "--format", "json").stderr == ""          # captured: not a terminal
    monkeypatch.setattr(cli_analyze, "Progress", OnTerminal)
    result = run("attribute", TP2, "--format", "json", "--jobs", "1")     # ranks here: each one's steps
    assert result.exit_code == 0, result.output
    for step in ("rank 0: loading…", "rank 0: attributing…", "rank 1: loading…", "rank 1: attributing…"):
        assert f"snapanalyze: {step}" in result.stderr
    pooled = run("attribute", TP2, "--format", "json", "--jobs", "2")     # ranks on workers: a bar counts them
    assert "snapanalyze: [####################] 2/2 ranks…" in pooled.stderr and pooled.stdout == result.stdout
    assert result.stderr.endswith("\r\033[K")
    assert json.loads(result.stdout)["ranks"]                                 # stdout stays clean JSON


@pytest.mark.slow
def test_progress_redraws_a_long_step_and_stops() -> None:
    import io
    import time

    from snapanalyze.cli.progress import TICK_S, Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    with Progress(stream=stream) as p:
        p.step("replaying")
        time.sleep(TICK_S * 2.5)
    text = stream.getvalue()
    assert text.count("snapanalyze: replaying…") >= 2 and text.endswith("\r\033[K")
    time.sleep(TICK_S * 1.5)
    assert stream.getvalue() == text                                          # nothing drawn after done()


HOSTILE = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\u202eevil\u200b\x9b"


def test_hostile_text_in_a_snapshot_stays_text_in_the_terminal_and_in_csv(tmp_path: Path) -> None:
    """Frame names and metadata are a stranger's text: no escape sequence, carriage return, bidi override or
    zero-width character reaches the terminal, and no CSV cell opens as a spreadsheet formula."""
    from conftest import BASE, SnapshotBuilder, write_pickle
    b = SnapshotBuilder()
    b.segment(BASE, [(1 << 20, 1 << 20, "active_allocated"), (1 << 20, 0, "inactive")])
    b.alloc(BASE, 1 << 20, user_metadata='=HYPERLINK("https://evil.example")',
            frames=[{"filename": f"/app/{HOSTILE}model.py", "line": 3, "name": f"run{HOSTILE}"}])
    path = write_pickle(tmp_path / "hostile.pickle", b.build())
    for args in (["attribute", str(path)], ["summary", str(path)], ["peaks", str(path)], ["phases", str(path)],
                 ["attribute", str(path), "--explain"]):
        out = run(*args)
        assert out.exit_code == 0, out.output
        assert not set(out.stdout) & set("\x1b\x07\r\u202e\u200b\x9b"), (args, out.stdout)
    shown = run("attribute", str(path)).stdout
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "\\u202eevil" in shown          # shown, not acted on
    cells = run("attribute", str(path), "--format", "csv").stdout
    assert not set(cells) & set("\x1b\x07\r\u202e") and "'=HYPERLINK" in cells and ",=" not in cells
