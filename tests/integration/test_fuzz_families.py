"""Fuzz families beyond single snapshots (issue 49): run directories (many ranks, many OOM entries, Parquet
dictionary bombs, bidi and format characters in folder, file, marker and meta.json text), the MCP server's
paths and links (driven with the SDK's own client), and tiny pickles of memo opcodes under --max-memory.

Every outcome is an answer whose invariants hold (JSON with no negative byte figure, text with no raw control,
bidi or format character, inside the time bound) or a one-line refusal; the MCP server never reads a file that
is, or links, outside its root. `make fuzz` runs them at length (SNAPANALYZE_FUZZ_EXAMPLES); the default is a
short derandomised pass."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from test_validate import PAYLOADS, UNSAFE, _negatives, one_line_error

from snapanalyze.cli import main

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "runs" / "oom_other_process" / "rank=0"
SCENARIO = ROOT / "fixtures" / "scenarios" / "oom_fragmentation.pickle"
EXAMPLES = int(os.environ.get("SNAPANALYZE_FUZZ_EXAMPLES", "40"))
LONG = "SNAPANALYZE_FUZZ_EXAMPLES" in os.environ
OUTCOMES: Counter[str] = Counter()
SECONDS = 60                                            # the hang bound: no command takes longer
# text for names: the payloads a file system can hold (no NUL, no '/')
NAMES = tuple(p.replace("\x00", "").replace("/", "") for p in PAYLOADS) + ("plain", "a\nb", "\u202e.elif")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _report_outcomes() -> Iterator[None]:
    yield
    if LONG:
        print(f"\nfuzz families: {EXAMPLES} examples → outcomes {dict(sorted(OUTCOMES.items()))}")


def _inert(where: str, text: str) -> None:
    unsafe = UNSAFE.findall(text)
    assert not unsafe, f"{where}: raw control, bidi or format characters reach the reader: {unsafe[:5]}"


def _settings(examples: int) -> Any:
    # no shrinking: each example runs commands for seconds, and the failing one is printed as it is
    return settings(max_examples=examples, deadline=None, derandomize=not LONG,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


# -- run directories ------------------------------------------------------------------------------------------

def _snapshot_with_ooms(count: int) -> bytes:
    """The run's OOM snapshot with its failure entry repeated `count` times (an engine that retries)."""
    raw = pickle.loads((RUN / "snapshot-oom-1.pickle").read_bytes())
    trace = raw["device_traces"][0]
    ooms = [e for e in trace if e.get("action") == "oom"]
    if ooms and count != 1:
        at = trace.index(ooms[0])
        trace[at:at + 1] = [dict(ooms[0], time_us=ooms[0].get("time_us", 0) + k) for k in range(count)]
    return pickle.dumps(raw)


def _markers(path: Path, bomb: bool, text: str) -> None:
    """The run's markers with `text` in their names; a bomb: 3,000 rows whose names pick one 1 MiB string of the
    Parquet dictionary (a few KB on disk, 3 GB expanded)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(RUN / "markers.parquet")
    if bomb:
        rows = 3000
        first = {name: table.column(name)[0].as_py() for name in table.column_names}
        columns = {name: pa.array([first[name]] * rows, type=table.schema.field(name).type)
                   for name in table.column_names}
        columns["name"] = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)),
                                                         pa.array(["x" * (1 << 20) + text]))
        table = pa.table(columns)
    else:
        names = [f"{n}{text}" for n in table.column("name").to_pylist()]
        table = table.set_column(table.column_names.index("name"), "name", pa.array(names, type=pa.string()))
    pq.write_table(table, path, compression="zstd")


def _run_dir(base: Path, ranks: int, ooms: int, bomb: bool, text: str, in_file_name: bool) -> Path:
    run = base / f"run{text}" if in_file_name else base / "run"
    snapshot = _snapshot_with_ooms(ooms)
    meta = json.loads((RUN / "meta.json").read_text())
    for rank in range(ranks):
        folder = run / f"rank={rank}"
        folder.mkdir(parents=True)
        name = f"snapshot-oom-{text}1.pickle" if in_file_name else "snapshot-oom-1.pickle"
        (folder / name).write_bytes(snapshot)
        (folder / "meta.json").write_text(json.dumps(dict(meta, rank=rank, world_size=ranks, host=f"node{text}",
                                                          devices=[dict(meta["devices"][0],
                                                                        name=f"GPU{text}")])))
        os.link(RUN / "nvml-part-00001.parquet", folder / "nvml-part-00001.parquet")
        if rank == 0:
            _markers(folder / "markers.parquet", bomb, text)
        else:
            os.link(run / "rank=0" / "markers.parquet", folder / "markers.parquet")
    return run


RUN_COMMANDS = (("ranks", "--format", "json"), ("explain-oom", "--format", "json"), ("phases",), ("ranks",))


@_settings(max(EXAMPLES // 100, 8))
@given(ranks=st.sampled_from([1, 2, 7, 60, 300]), ooms=st.sampled_from([0, 1, 40, 500, 2000]), bomb=st.booleans(),
       text=st.sampled_from(NAMES), in_file_name=st.booleans())
def test_fuzz_run_directories_answer_or_refuse_in_one_line(tmp_path_factory: pytest.TempPathFactory, ranks: int,
                                                             ooms: int, bomb: bool, text: str,
                                                             in_file_name: bool) -> None:
    # explain-oom costs about 3.6 ms per entry, linearly (a few ms more per rank): 10,000 entries in a run fit the
    # hang bound with one of the 2 cores busy elsewhere (14,000 took 68 s so); grouping retries is not built
    assume(ranks * max(ooms, 1) <= 10_000)
    run = _run_dir(tmp_path_factory.mktemp("run"), ranks, ooms, bomb, text, in_file_name)
    for command in RUN_COMMANDS:
        started = time.monotonic()
        result = CliRunner().invoke(main, [command[0], str(run), *command[1:]])
        took = time.monotonic() - started
        assert took < SECONDS, f"{command} took {took:.0f} s on {ranks} ranks, {ooms} OOM entries"
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            f"{command[0]} raised {result.exception!r}"
        if result.exit_code == 2:
            _inert(command[0], one_line_error(result))
            OUTCOMES["run refused (exit 2, one line)"] += 1
            continue
        assert result.exit_code in (0, 1), (command, result.output[-2000:])
        _inert(command[0], result.stderr)
        if "json" in command:
            doc = json.loads(result.stdout, parse_constant=lambda c, n=command[0]: pytest.fail(f"{n} wrote {c}"))
            assert not list(_negatives(doc)), f"{command[0]}: negative numbers {list(_negatives(doc))[:3]}"
        else:
            _inert(command[0], result.stdout)
        OUTCOMES["run analysed"] += 1


# -- the MCP server's paths and links -------------------------------------------------------------------------

SECRET = "TOPSECRET_frame_text"


def _secret_snapshot() -> bytes:
    """A snapshot whose every frame names SECRET: if any answer shows it, a file outside the root was read."""
    raw = pickle.loads(SCENARIO.read_bytes())

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key in ("filename", "name") and isinstance(value, str):
                    obj[key] = SECRET
                else:
                    walk(value)
        elif isinstance(obj, list):
            for value in obj:
                walk(value)
    walk(raw)
    return pickle.dumps(raw)


TOOLS = ("peaks", "summary", "attribute", "explain_oom", "ranks")
SHAPES = ("inside", "outside_abs", "dotdot", "link_out", "link_chain", "dir_link_out", "run_rank_link_out",
          "run_inside", "payload_name", "nul", "long", "empty", "fifo", "link_in")


def _mcp_case(root: Path, outside: Path, shape: str, k: int, text: str) -> tuple[str, bool]:
    """(the path to ask about, whether reading it would reach outside the root)."""
    secret = outside / "secret.pickle"
    if shape == "inside":
        return str(root / "mine.pickle"), False
    if shape == "outside_abs":
        return str(secret), True
    if shape == "dotdot":
        return str(root / "sub" / ".." / ".." / outside.name / "secret.pickle"), True
    if shape == "link_out":
        (root / f"l{k}.pickle").symlink_to(secret)
        return str(root / f"l{k}.pickle"), True
    if shape == "link_chain":
        (root / f"m{k}.pickle").symlink_to(secret)
        (root / f"c{k}.pickle").symlink_to(root / f"m{k}.pickle")
        return str(root / f"c{k}.pickle"), True
    if shape == "dir_link_out":
        (root / f"d{k}").symlink_to(outside, target_is_directory=True)
        return str(root / f"d{k}" / "secret.pickle"), True
    if shape in ("run_rank_link_out", "run_inside"):
        run = root / f"run{k}"
        for rank in range(2):
            (run / f"rank={rank}").mkdir(parents=True)
        if shape == "run_inside":
            for rank in range(2):
                os.link(root / "mine.pickle", run / f"rank={rank}" / "snapshot-final.pickle")
            return str(run), False
        os.link(root / "mine.pickle", run / "rank=0" / "snapshot-final.pickle")
        (run / "rank=1" / "snapshot-final.pickle").symlink_to(secret)
        return str(run), True
    if shape == "payload_name":
        named = root / f"p{k}{text}.pickle"
        os.link(root / "mine.pickle", named)
        return str(named), False
    if shape == "nul":
        return str(root / "mine\x00.pickle"), False
    if shape == "long":
        return str(root / ("x" * 5000)), False
    if shape == "empty":
        return "", False
    if shape == "fifo":
        os.mkfifo(root / f"f{k}.pickle")
        return str(root / f"f{k}.pickle"), False
    (root / f"i{k}.pickle").symlink_to(root / "mine.pickle")        # a link that stays inside: may be read
    return str(root / f"i{k}.pickle"), False


def _talk(root: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def talk() -> list[Any]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "snapanalyze", "mcp", "--root", str(root),
                                                                     "--max-chars", "3000", "--timeout", "60"])
        async with Client(server) as client:
            return [await client.call_tool(name, args) for name, args in calls]
    return anyio.run(talk)


@_settings(max(EXAMPLES // 250, 3))
@given(cases=st.lists(st.tuples(st.sampled_from(SHAPES), st.sampled_from(TOOLS), st.sampled_from(NAMES)),
                      min_size=4, max_size=10))
def test_fuzz_mcp_paths_never_read_outside_the_root(tmp_path_factory: pytest.TempPathFactory,
                                                     cases: list[tuple[str, str, str]]) -> None:
    pytest.importorskip("mcp", reason="mcp is a dev dependency: pip install -e '.[dev]'")
    base = tmp_path_factory.mktemp("mcp")
    root, outside = base / "root", base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.pickle").write_bytes(_secret_snapshot())
    (root / "mine.pickle").write_bytes(SCENARIO.read_bytes())
    asked = [(_mcp_case(root, outside, shape, k, text), tool) for k, (shape, tool, text) in enumerate(cases)]
    answers = _talk(root, [(tool, {"path": path}) for (path, _), tool in asked])
    for (shape, tool, _), ((_, escapes), _), answer in zip(cases, asked, answers):
        said = "".join(c.text for c in answer.content if getattr(c, "type", "") == "text")
        assert SECRET not in said, f"{tool} on {shape}: a file outside the root was read"
        _inert(f"{tool} on {shape}", said)
        assert len(said) <= 3000 + 200, f"{tool} on {shape}: {len(said):,} characters past --max-chars 3000"
        if escapes:          # refused, or (ranks: one rank of a run) named as a problem while the rest answer
            assert "outside the directories this server reads" in said, f"{tool} on {shape}: {said[:300]}"
            OUTCOMES["mcp: outside refused" + ("" if answer.is_error else " (a rank's problem)")] += 1
        elif answer.is_error:
            assert said.strip() and "\n" not in said.strip(), f"{tool} on {shape}: not one line: {said[:300]}"
            OUTCOMES["mcp: refused in one line"] += 1
        else:
            OUTCOMES["mcp: answered"] += 1


# -- memo opcodes: tiny pickles that ask for memory ------------------------------------------------------------

MEMO = st.lists(st.sampled_from([
    b"\x8c\x00\x94",                            # SHORT_BINUNICODE '' + MEMOIZE
    b"\x8c\x04aaaa\x94",
    b"h\x00", b"h\xff",                         # BINGET 0 / 255
    b"j\xff\xff\xff\x7f", b"j\x00\x00\x00\x00",  # LONG_BINGET of a huge / the first index
    b"q\x00", b"r\xff\xff\xff\x7f",             # BINPUT 0 / LONG_BINPUT huge
    b"\x94", b"(", b"]", b"e", b"t", b"\x85", b"\x86", b"a", b"0", b"2",   # MEMOIZE, MARK, lists, tuples, POP, DUP
    b"\x8d\xff\xff\xff\xff\xff\xff\xff\x7f",    # BINUNICODE8 with a length past any file
    b"\x8e\x00\x00\x00\x00\x00\x00\x01\x00",    # BINBYTES8 of 2^48 bytes
    b"J\xff\xff\xff\x7f", b"K\x05",
]), min_size=1, max_size=40)


@_settings(max(EXAMPLES // 25, 8))
@given(body=MEMO, repeat=st.sampled_from([1, 2, 1000, 20_000]))
def test_fuzz_memo_pickles_stay_within_max_memory(tmp_path_factory: pytest.TempPathFactory, body: list[bytes],
                                                   repeat: int) -> None:
    path = tmp_path_factory.mktemp("memo") / "memo.pickle"
    path.write_bytes(b"\x80\x04" + b"".join(body) * repeat + b".")
    # a wrapper runs the command as its only child and says that child's peak resident set
    wrapper = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:])\n"
               "sys.stderr.write(f'\\nMAXRSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
               "sys.exit(done.returncode)\n")
    try:
        done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "snapanalyze", "--max-memory",
                               "256MiB", "summary", str(path)], capture_output=True, text=True, timeout=SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"summary hung on a {path.stat().st_size:,}-byte pickle")
    err, _, rss = done.stderr.rpartition("\nMAXRSS ")
    peak = int(rss) * 1024
    assert done.returncode in (0, 2), (done.returncode, err[-500:])
    if done.returncode == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("snapanalyze: error: "), err
    _inert("summary", done.stdout + err)
    # 256 MiB for the data, and the interpreter, numpy and pandas around it (300 MB)
    assert peak < (256 << 20) + 300_000_000, f"peak RSS {peak / (1 << 20):.0f} MiB under --max-memory 256MiB"
    OUTCOMES["memo pickle: " + ("refused" if done.returncode else "read")] += 1
