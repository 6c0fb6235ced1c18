"""stacks: interning maps equal stacks to one id however they were stored, keeps no raw object once finished,
and names frames the way the reports show them."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REAL_FILES, read_fixture_raw, real_ids

from snapanalyze import stacks as stacks_module
from snapanalyze.stacks import StackInterner, short_path


def _value(frames: Any) -> tuple[tuple[Any, Any, Any], ...]:
    """A stack by value, as a reader with no identity tricks sees it (what the ids must agree with)."""
    if not frames or not isinstance(frames, (list, tuple)):
        return ()
    return tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)


def _agrees(lists: list[Any], ids: list[int]) -> bool:
    """Whether `ids` name the same partition of `lists` as their values do (and −1 exactly the empty ones)."""
    by_value: dict[Any, int] = {}
    by_id: dict[int, Any] = {}
    for frames, sid in zip(lists, ids):
        value = _value(frames)
        if (sid == -1) != (value == ()):
            return False
        if value and (by_value.setdefault(value, sid) != sid or by_id.setdefault(sid, value) != value):
            return False
    return True


def test_equal_stacks_share_an_id_whether_they_share_objects_or_only_values() -> None:
    shared = {"filename": "/app/model.py", "line": 7, "name": "forward"}
    main = {"filename": "/app/train.py", "line": 10, "name": "main"}
    lists = [[shared, main], [shared, main], [dict(shared), dict(main)],
             [{"filename": "/app/model.py", "line": 8, "name": "forward"}, main], [], None, (shared, main)]
    interner = StackInterner()
    ids = interner.intern(lists).tolist()
    assert ids[0] == ids[1] == ids[2] == ids[6] != ids[3]
    assert ids[4] == ids[5] == -1
    assert len(interner.stacks) == 2 and len(interner.frames) == 3


def test_stacks_that_differ_in_one_frame_anywhere_stay_apart_across_batches() -> None:
    # 300 stacks of one length, each the base with one frame replaced at a random place: the lookup has to
    # learn where they differ, and must never merge two of them. Repeated and shuffled past one batch.
    rng = random.Random(7)
    pool = [{"filename": f"/app/f{k}.py", "line": k, "name": f"fn{k}"} for k in range(400)]
    base = pool[:40]
    distinct = []
    for k in range(300):
        stack = list(base)
        stack[rng.randrange(40)] = pool[40 + k % 360]
        distinct.append(stack)
    lists = [list(rng.choice(distinct)) for _ in range(3 * stacks_module._BATCH)]
    lists += [[dict(f) for f in s] for s in distinct[:20]]        # equal values, other objects
    interner = StackInterner()
    ids = interner.intern(lists).tolist()
    assert _agrees(lists, ids)
    assert len(set(ids)) == len({_value(s) for s in lists})


def test_malformed_and_deeply_nested_frames_are_interned_without_raising() -> None:
    deep: list[Any] = []
    for _ in range(100_000):                    # compared, this would recurse past any stack limit
        deep = [deep]
    other: list[Any] = []
    for _ in range(100_000):
        other = [other]
    lists = [[{"filename": deep, "line": 1, "name": "f"}], [{"filename": other, "line": 1, "name": "f"}],
             ["not a frame"], [{"filename": "/a.py", "line": "7", "name": 3}]]
    interner = StackInterner()
    ids = interner.intern(lists).tolist()
    assert ids[0] == ids[1] != -1              # both read as a malformed filename: one stack by value
    assert interner.frames[interner.stacks[ids[0]][0]] == ("<malformed filename>", 1, "f")
    assert interner.frames[interner.stacks[ids[2]][0]] == ("??", 0, "<malformed frame: a str>")
    assert interner.frames[interner.stacks[ids[3]][0]] == ("/a.py", 0, "<malformed name>")


def test_finish_drops_every_reference_to_the_raw_objects() -> None:
    frame = {"filename": "/app/model.py", "line": 7, "name": "forward"}
    frames = [frame]
    before = sys.getrefcount(frames), sys.getrefcount(frame)
    interner = StackInterner()
    sid = int(interner.intern([frames])[0])
    assert sys.getrefcount(frames) > before[0]            # one list per stack is kept while interning
    interner.finish()
    assert (sys.getrefcount(frames), sys.getrefcount(frame)) == before
    assert interner.frames[interner.stacks[sid][0]] == ("/app/model.py", 7, "forward")


@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_every_real_file_s_stacks_get_the_ids_their_values_do(path: Path) -> None:
    raw = read_fixture_raw(path)
    traces = raw.get("device_traces", []) if isinstance(raw, dict) else []
    lists = [e.get("frames") for entries in traces for e in entries]
    lists += [b.get("frames") for s in (raw["segments"] if isinstance(raw, dict) else raw) for b in s["blocks"]]
    ids = StackInterner().intern(lists).tolist()
    assert _agrees(lists, ids)


def test_paths_lose_their_install_prefix() -> None:
    assert short_path("/usr/lib/python3/dist-packages/vllm/worker.py") == "vllm/worker.py"
    assert short_path("/home/me/project/src/model.py") == "project/src/model.py"
