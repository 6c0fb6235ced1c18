"""safe_pickle: every container reads back the same builtins; no pickle can run code; bad files get one
clear BadInputError naming the file and the problem."""

from __future__ import annotations

import builtins
import gc
import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import BASE, REAL_FILES, SnapshotBuilder, write_gzip, write_json, write_pickle, write_torch_zip

from snapanalyze.errors import BadInputError, UnsafePickleError
from snapanalyze.load import load
from snapanalyze.load.safe_pickle import Limits, read_raw

MiB = 1 << 20


def small_snapshot() -> dict:
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_allocated"), (2 * 1024 * 1024 - 1024, 0, "inactive")])
    b.alloc(BASE, 1000)
    return b.build()


# -- containers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_plain_pickle_any_protocol_round_trips(tmp_path: Path, protocol: int) -> None:
    snap = small_snapshot()
    path = write_pickle(tmp_path / "s.pickle", snap, protocol=protocol)
    raw, container, _ = read_raw(path)
    assert container == "pickle"
    # Protocol 0/1 store the pool id tuple as a tuple too; everything must come back equal.
    assert raw == snap


def test_gzip_pickle(tmp_path: Path) -> None:
    snap = small_snapshot()
    raw, container, _ = read_raw(write_gzip(tmp_path / "s.pickle.gz", pickle.dumps(snap)))
    assert container == "gzip pickle"
    assert raw == snap


def test_gzip_json(tmp_path: Path) -> None:
    snap = small_snapshot()
    raw, container, _ = read_raw(write_gzip(tmp_path / "s.json.gz", json.dumps(snap).encode()))
    assert container == "gzip json"
    assert raw["segments"][0]["address"] == BASE
    assert raw["segments"][0]["segment_pool_id"] == [0, 0]


def test_torch_save_zip(tmp_path: Path) -> None:
    snap = small_snapshot()
    path = write_torch_zip(tmp_path / "s.pt", pickle.dumps(snap, protocol=2))
    raw, container, _ = read_raw(path)
    assert container == "torch.save zip"
    assert raw == snap


def test_json_with_leading_whitespace(tmp_path: Path) -> None:
    snap = small_snapshot()
    path = tmp_path / "s.json"
    path.write_text("\n  " + json.dumps(snap))
    raw, container, _ = read_raw(path)
    assert container == "json"
    assert raw["device_traces"][0][0]["size"] == 1000


def test_addresses_beyond_2_53_stay_exact(tmp_path: Path) -> None:
    big = 2**60 + 12345  # a float would round this
    snap = {"segments": [{"device": 0, "address": big, "total_size": 512, "blocks": [
        {"address": big, "size": 512, "requested_size": 7, "state": "active_allocated"}]}],
        "device_traces": [[{"action": "alloc", "addr": big, "size": 7, "stream": 0}]]}
    for path in (write_pickle(tmp_path / "a.pickle", snap), write_json(tmp_path / "a.json", snap)):
        s = load(path)
        assert int(s.segments["address"].iloc[0]) == big
        assert int(s.blocks["address"].iloc[0]) == big
        assert int(s.trace(0).addr[0]) == big


def test_gc_is_restored_after_success_and_failure(tmp_path: Path) -> None:
    assert gc.isenabled()
    read_raw(write_pickle(tmp_path / "ok.pickle", small_snapshot()))
    assert gc.isenabled()
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(small_snapshot())[:40])
    with pytest.raises(BadInputError):
        read_raw(bad)
    assert gc.isenabled()


# -- hostile pickles ----------------------------------------------------------------------------------------

class _System:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch '{self.target}'",))


class _Exec:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        return (builtins.exec, (f"open({str(self.target)!r}, 'w').close()",))


class _Subprocess:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204
        return (subprocess.call, (["touch", str(self.target)],))


PAYLOADS: dict[str, Callable[[Path], object]] = {
    "os.system": _System,
    "builtins.exec": _Exec,
    "subprocess.call": _Subprocess,
}


def _hostile_bytes(kind: str, target: Path, protocol: int = pickle.DEFAULT_PROTOCOL,
                   nested: bool = False) -> bytes:
    obj = PAYLOADS[kind](target)
    if nested:  # hidden inside an otherwise valid snapshot, where a frame would be
        snap = small_snapshot()
        snap["device_traces"][0][0]["frames"] = [obj]
        obj = snap
    return pickle.dumps(obj, protocol=protocol)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_payloads_really_are_hostile(tmp_path: Path, kind: str) -> None:
    """Control: plain pickle.loads of the same payload does create the file, so the refusals below mean
    something."""
    control = tmp_path / "control"
    pickle.loads(_hostile_bytes(kind, control))
    assert control.exists()


WRAPPERS: dict[str, Callable[[Path, bytes], Path]] = {
    "plain": lambda p, b: (p.write_bytes(b), p)[1],
    "gzip": write_gzip,
    "zip": write_torch_zip,
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_hostile_pickle_is_refused_and_never_runs(tmp_path: Path, kind: str, wrapper: str) -> None:
    target = tmp_path / "pwned"
    path = WRAPPERS[wrapper](tmp_path / "evil.pickle", _hostile_bytes(kind, target))
    with pytest.raises(UnsafePickleError) as info:
        load(path)
    assert not target.exists()
    assert info.value.path == str(path)
    assert str(info.value).startswith(str(path))
    assert "refused" in info.value.problem
    assert isinstance(info.value, BadInputError)  # the CLI maps it to exit code 2


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_hostile_object_nested_in_a_valid_snapshot_is_refused(tmp_path: Path, protocol: int) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(_hostile_bytes("os.system", target, protocol=protocol, nested=True))
    with pytest.raises(UnsafePickleError, match="system"):
        load(path)
    assert not target.exists()


def test_persistent_ids_are_refused(tmp_path: Path) -> None:
    import io

    class P(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return "storage-0" if obj == "tensor" else None

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"segments": [], "x": "tensor"})
    path = tmp_path / "pid.pickle"
    path.write_bytes(buf.getvalue())
    with pytest.raises(UnsafePickleError, match="persistent"):
        read_raw(path)


def test_copyreg_extension_codes_are_refused(tmp_path: Path) -> None:
    """EXT1 looks a global up through the extension registry; it must still go through find_class."""
    import copyreg

    target = tmp_path / "pwned"
    code = 0xF1
    copyreg.add_extension("posix", "system", code)
    try:
        payload = pickle.dumps(_System(target), protocol=2)
        assert b"\x82" in payload  # EXT1 opcode: the registry was used
        path = tmp_path / "ext.pickle"
        path.write_bytes(payload)
        with pytest.raises(UnsafePickleError):
            read_raw(path)
    finally:
        copyreg.remove_extension("posix", "system", code)
    assert not target.exists()


# -- broken and wrong files ---------------------------------------------------------------------------------

def _truncated_real(tmp_path: Path) -> Path:
    src = REAL_FILES[0].read_bytes()
    path = tmp_path / "half.pickle"
    path.write_bytes(src[: len(src) // 2])
    return path


BROKEN: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated": (_truncated_real, "truncated"),
    "empty": (lambda d: (d / "empty.pickle", (d / "empty.pickle").write_bytes(b""))[0], "empty"),
    "random bytes": (lambda d: (d / "r.pickle", (d / "r.pickle").write_bytes(
        b"\xcd" + random.Random(0).randbytes(4095)))[0], "not a snapshot file"),
    "text": (lambda d: (d / "t.pickle", (d / "t.pickle").write_text("this is a text file\nnot a dump\n"))[0],
             "not a snapshot file"),
    "broken json": (lambda d: (d / "b.json", (d / "b.json").write_text('{"segments": ['))[0], "JSON"),
    "broken gzip": (lambda d: (d / "b.gz", (d / "b.gz").write_bytes(b"\x1f\x8b" + bytes(30)))[0], "gzip"),
    "broken zip": (lambda d: (d / "b.pt", (d / "b.pt").write_bytes(b"PK\x03\x04" + bytes(30)))[0], "zip"),
    "zip without data.pkl": (lambda d: _zip_without_data(d), "data.pkl"),
    "truncated gzip": (lambda d: (d / "tg.gz", (d / "tg.gz").write_bytes(
        gzip.compress(REAL_FILES[0].read_bytes())[:5000]))[0], "truncated"),
}


def _zip_without_data(d: Path) -> Path:
    path = d / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/version", "3\n")
    return path


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_raise_one_clear_error(tmp_path: Path, case: str) -> None:
    make, keyword = BROKEN[case]
    path = make(tmp_path)
    with pytest.raises(BadInputError) as info:
        load(path)
    err = info.value
    assert not isinstance(err, UnsafePickleError)
    assert err.path == str(path)
    assert str(err).startswith(f"{path}: ")
    assert keyword.lower() in err.problem.lower()
    assert "\n" not in str(err)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no such file"):
        load(tmp_path / "nope.pickle")
    with pytest.raises(BadInputError, match="directory"):
        load(tmp_path)


# -- bounded cost on hostile input: each finishes in seconds with one line, nothing crashes ----------------

def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own interpreter, so that a crash (a segfault) shows as its exit status."""
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess[str], keyword: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapanalyze: error: "), proc.stderr[-2000:]
    assert keyword.lower() in lines[0].lower(), lines[0]
    return lines[0]


def _planted(tmp_path: Path, opcodes: bytes, name: str = "planted.pickle") -> Path:
    """A valid snapshot whose first segment's segment_type is replaced by the raw pickle `opcodes`."""
    snap = small_snapshot()
    snap["segments"][0]["segment_type"] = "PLACEHOLDER"
    body = pickle.dumps(snap, protocol=4)
    marker = b"\x8c\x0bPLACEHOLDER"
    assert body.count(marker) == 1
    path = tmp_path / name
    path.write_bytes(body.replace(marker, opcodes))
    return path


DEEP = 1_000_000


def test_a_tuple_nested_a_million_deep_as_a_dict_key_does_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep-key.pickle"
    path.write_bytes(b"\x80\x04}" + b")" + b"\x85" * DEEP + b"K\x01s.")   # {((((…)))): 1}
    _one_line(_cli("summary", str(path)), "no 'segments' key")


def test_tuples_nested_past_the_limit_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "deeper.pickle"
    path.write_bytes(b"\x80\x04}" + b")" + b"\x85" * 7_000_000 + b"K\x01s.")
    _one_line(_cli("summary", str(path)), "nests tuples deeper than this reader allows")


def test_a_deep_tuple_as_user_metadata_is_refused_not_hashed(tmp_path: Path) -> None:
    snap = small_snapshot()
    for entry in snap["device_traces"][0]:
        entry["user_metadata"] = "PLACEHOLDER"
    body = pickle.dumps(snap, protocol=4)
    path = tmp_path / "deep-meta.pickle"
    path.write_bytes(body.replace(b"\x8c\x0bPLACEHOLDER", b")" + b"\x85" * DEEP, 1))
    _one_line(_cli("peaks", str(path)), "device_traces[0][0].user_metadata is a tuple, expected a string")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["segment_type", "allocator_settings", "frame filename", "frame"])
def test_lists_nested_a_million_deep_anywhere_are_one_line_or_harmless(tmp_path: Path, where: str) -> None:
    deep = b"]" * DEEP + b"a" * (DEEP - 1)                       # [[[[…]]]]
    snap = small_snapshot()
    if where == "segment_type":
        path = _planted(tmp_path, deep)
        _one_line(_cli("summary", str(path)), "segments[0].segment_type is a list, expected a string")
        return
    if where == "allocator_settings":
        snap["allocator_settings"] = {"a_future_setting": "PLACEHOLDER"}
    elif where == "frame filename":
        snap["segments"][0]["blocks"][0]["frames"] = [{"filename": "PLACEHOLDER", "line": 1, "name": "f"}]
    else:
        snap["segments"][0]["blocks"][0]["frames"] = ["PLACEHOLDER"]
    path = tmp_path / "deep.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4).replace(b"\x8c\x0bPLACEHOLDER", deep, 1))
    for command in ("summary", "attribute"):
        proc = _cli(command, str(path), "--format", "json")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
        if command == "summary" and where == "allocator_settings":
            assert "nested too deep" in json.dumps(doc["allocator_settings"])


@pytest.mark.slow
def test_a_lone_surrogate_in_a_frame_prints_escaped(tmp_path: Path) -> None:
    snap = small_snapshot()
    snap["segments"][0]["blocks"][0]["frames"] = [{"filename": "/m/model\ud800.py", "line": 3, "name": "fwd\udfff"}]
    snap["device_traces"][0][0]["frames"] = snap["segments"][0]["blocks"][0]["frames"]
    path = write_pickle(tmp_path / "surrogate.pickle", snap)
    proc = _cli("attribute", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model\\ud800.py:3:fwd\\udfff" in proc.stdout
    report = tmp_path / "r.html"
    proc = _cli("report", str(path), "-o", str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model\\ud800.py" in report.read_text(encoding="utf-8")


def _stream_gzip(path: Path, head: bytes, chunk: bytes, repeat: int, tail: bytes = b"") -> Path:
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(head)
        for _ in range(repeat):
            out.write(chunk)
        out.write(tail)
    return path


@pytest.mark.slow
def test_a_gzip_bomb_of_pickle_is_refused_early(tmp_path: Path) -> None:
    path = _stream_gzip(tmp_path / "bomb.pickle.gz", b"\x80\x04](", b"K\x00" * (1 << 19), 256, b"e.")  # 256 MiB
    assert path.stat().st_size < 2 * MiB
    _one_line(_cli("summary", str(path), timeout=30), "a compression bomb")


def test_a_gzip_bomb_of_json_is_refused_early(tmp_path: Path) -> None:
    path = _stream_gzip(tmp_path / "bomb.json.gz", b"[", b"0," * (1 << 19), 256, b"0]")
    _one_line(_cli("summary", str(path), timeout=30), "compression bomb")


@pytest.mark.slow
def test_a_zip_bomb_is_refused_early(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("archive/data.pkl", "w", force_zip64=True) as member:
            member.write(b"\x80\x02](")
            for _ in range(256):
                member.write(b"K\x00" * (1 << 19))
            member.write(b"e.")
    _one_line(_cli("summary", str(path), timeout=30), "compression bomb")


def test_a_pickle_that_explodes_into_objects_is_refused_early(tmp_path: Path) -> None:
    path = tmp_path / "lists.pickle"
    path.write_bytes(b"\x80\x04](" + b"]" * 30_000_000 + b"e.")     # 30 MB → 30 M lists, about 2 GB
    _one_line(_cli("summary", str(path), timeout=30), "took more than 0.25 GiB of memory")
    _one_line(_cli("--max-memory", "64MiB", "summary", str(path), timeout=30), "took more than 0.06 GiB")


def test_a_known_stream_size_lets_a_segment_heavy_head_grow_but_never_past_the_bound_at_its_end() -> None:
    # 250k segment dicts take ~12x their pickled bytes over the first ~40 MiB of a 270 MiB snapshot: the floor
    # of 3x the whole stream lets them; no point of the read may allow more than the end of the stream does.
    limits, whole = Limits(), 270 * MiB
    assert limits.growth_cap(25 * MiB) == 300 * MiB                 # size not known: 12x what was read
    assert limits.growth_cap(25 * MiB, whole) == 3 * whole
    assert all(limits.growth_cap(read, whole) <= limits.growth_cap(whole) for read in range(0, whole, 7 * MiB))
    assert limits.growth_cap(MiB, 30 * MiB) == 256 * MiB             # small files keep the 256 MiB floor
    assert Limits(max_memory_bytes=64 * MiB).growth_cap(25 * MiB, whole) == 64 * MiB


def test_shared_references_repeated_are_refused(tmp_path: Path) -> None:
    b = SnapshotBuilder(frames=False)
    b.segment(BASE, [(512, 512, "active_allocated")] * 2000)
    snap = b.build()
    snap["segments"] = snap["segments"] * 200_000                  # one dict, 200,000 references to it
    path = write_pickle(tmp_path / "shared.pickle", snap)
    assert path.stat().st_size < 2 * MiB
    _one_line(_cli("summary", str(path), timeout=30), "shared references repeated")


def _patched_zip(tmp_path: Path, method: int | None = None, flags: int | None = None) -> Path:
    path = write_torch_zip(tmp_path / "z.pt", pickle.dumps(small_snapshot(), protocol=2))
    data = bytearray(path.read_bytes())
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        start = 0
        while (at := data.find(signature, start)) >= 0:
            if method is not None:
                data[at + method_at:at + method_at + 2] = method.to_bytes(2, "little")
            if flags is not None:
                data[at + flag_at:at + flag_at + 2] = flags.to_bytes(2, "little")
            start = at + 4
    path.write_bytes(bytes(data))
    return path


CONTAINERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "deflate64 zip member": (lambda d: _patched_zip(d, method=9), "compression method 9"),
    "encrypted zip member": (lambda d: _patched_zip(d, flags=1), "encrypted"),
    "gzip with a wrong CRC": (lambda d: _wrong_crc(d), "damaged gzip"),
    "corrupt deflate block": (lambda d: _corrupt_deflate(d), "gzip"),
    "symlink loop": (lambda d: _symlink_loop(d), "cannot be read"),
    "300-character name": (lambda d: d / ("x" * 300 + ".pickle"), "cannot be read"),
    "/proc/self/mem": (lambda d: Path("/proc/self/mem"), "empty"),
    "FIFO": (lambda d: (d / "fifo", os.mkfifo(d / "fifo"))[0], "is a FIFO, not a regular file"),
    "/dev/urandom": (lambda d: Path("/dev/urandom"), "is a character device"),
}


def _wrong_crc(d: Path) -> Path:
    data = bytearray(gzip.compress(pickle.dumps(small_snapshot())))
    data[-8] ^= 0xFF
    return write_gzip_bytes(d / "crc.pickle.gz", bytes(data))


def _corrupt_deflate(d: Path) -> Path:
    data = bytearray(gzip.compress(REAL_FILES[0].read_bytes()))
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0x5A
    return write_gzip_bytes(d / "corrupt.pickle.gz", bytes(data))


def write_gzip_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _symlink_loop(d: Path) -> Path:
    (d / "a.pickle").symlink_to(d / "b.pickle")
    (d / "b.pickle").symlink_to(d / "a.pickle")
    return d / "a.pickle"


@pytest.mark.parametrize("case", sorted(CONTAINERS))
def test_damaged_containers_and_odd_paths_are_one_line(tmp_path: Path, case: str) -> None:
    make, keyword = CONTAINERS[case]
    path = make(tmp_path)
    with pytest.raises(BadInputError) as info:
        load(path)
    assert keyword.lower() in info.value.problem.lower(), info.value.problem
    _one_line(_cli("summary", str(path), timeout=20), keyword)


def test_a_length_no_snapshot_holds_is_one_line(tmp_path: Path) -> None:
    """A 24-byte pickle whose BYTEARRAY8 claims 7.3 EB (the round-2 reproducer's shape): one line naming the file
    and what the pickle asks for, no interpreter line (`SystemError: … exported buffers`) before it."""
    import struct
    import subprocess
    import sys
    path = tmp_path / "claims.pickle"
    path.write_bytes(b"\x80\x04}\x94\x96" + struct.pack("<Q", 7308604914258054280) + b"x" * 10 + b".")
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "peaks", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"snapanalyze: error: {path}: refused to load: after 24 bytes of pickle, an "
                                        "opcode asks for more memory than reading it may take (a length or a "
                                        "repetition no snapshot holds; --max-memory sets the bound): a pickle built "
                                        "to exhaust memory, not a snapshot"]
