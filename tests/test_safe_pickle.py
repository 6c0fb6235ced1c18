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
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import BASE, REAL_FILES, SnapshotBuilder, write_gzip, write_json, write_pickle, write_torch_zip

from snapanalyze.errors import BadInputError, UnsafePickleError
from snapanalyze.load import load
from snapanalyze.load.safe_pickle import read_raw


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
    raw, container = read_raw(path)
    assert container == "pickle"
    # Protocol 0/1 store the pool id tuple as a tuple too; everything must come back equal.
    assert raw == snap


def test_gzip_pickle(tmp_path: Path) -> None:
    snap = small_snapshot()
    raw, container = read_raw(write_gzip(tmp_path / "s.pickle.gz", pickle.dumps(snap)))
    assert container == "gzip pickle"
    assert raw == snap


def test_gzip_json(tmp_path: Path) -> None:
    snap = small_snapshot()
    raw, container = read_raw(write_gzip(tmp_path / "s.json.gz", json.dumps(snap).encode()))
    assert container == "gzip json"
    assert raw["segments"][0]["address"] == BASE
    assert raw["segments"][0]["segment_pool_id"] == [0, 0]


def test_torch_save_zip(tmp_path: Path) -> None:
    snap = small_snapshot()
    path = write_torch_zip(tmp_path / "s.pt", pickle.dumps(snap, protocol=2))
    raw, container = read_raw(path)
    assert container == "torch.save zip"
    assert raw == snap


def test_json_with_leading_whitespace(tmp_path: Path) -> None:
    snap = small_snapshot()
    path = tmp_path / "s.json"
    path.write_text("\n  " + json.dumps(snap))
    raw, container = read_raw(path)
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
