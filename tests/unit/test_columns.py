"""columns: every layout PyTorch writes becomes the same columnar Snapshot; unknown keys are ignored."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import (
    BASE,
    REAL_FILES,
    SnapshotBuilder,
    end_active_blocks,
    frames_for,
    real_ids,
    write_gzip,
    write_json,
    write_pickle,
    write_torch_zip,
)

from snapanalyze.analyze.attribute import BLOCK_COLUMNS
from snapanalyze.errors import BadInputError
from snapanalyze.load import load
from snapanalyze.load.columns import to_snapshot
from snapanalyze.model import ALLOC, ANNOTATE, FREE_COMPLETED, HOST_DEVICE, OOM, Snapshot

MiB = 1024 * 1024


def two_block_snapshot(**builder_kw: Any) -> dict[str, Any]:
    b = SnapshotBuilder(**builder_kw)
    b.segment(BASE, [(1024, 1000, "active_allocated"), (512, 100, "inactive"),
                     (2 * MiB - 1536, 0, "inactive")])
    b.alloc(BASE, 1000)
    b.alloc(BASE + 1024, 100)
    b.free(BASE + 1024, 100)
    return b.build()


def facts(s: Snapshot) -> dict[str, Any]:
    """Everything a replay or summary reads, in comparable form (stacks aside)."""
    return {
        "segments": s.segments.astype({"segment_type": str, "pool_id": str}).to_dict("records"),
        "blocks": s.blocks.drop(columns="stack_id").astype({"segment_type": str, "pool_id": str, "state": str})
        .to_dict("records"),
        "traces": {d: (t.action_names[:10], t.action.tolist(), t.addr.tolist(), t.size.tolist(),
                       t.stream.tolist(), None if t.time_us is None else t.time_us.tolist(), t.device_free)
                   for d, t in s.traces.items()},
        "devices": s.devices,
    }


# -- the real corpus ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_every_real_file_loads_with_its_parts(path: Path, real_raw: dict[str, Any]) -> None:
    raw = real_raw[path.name]
    s = load(path)
    assert s.source == str(path)
    assert s.format.container == "pickle"
    assert s.format.layout == "dict"
    # Segments and blocks: one row each, addresses exact.
    assert len(s.segments) == len(raw["segments"])
    assert len(s.blocks) == sum(len(seg["blocks"]) for seg in raw["segments"])
    assert s.segments["address"].dtype == np.uint64
    assert [int(a) for a in s.segments["address"]] == [seg["address"] for seg in raw["segments"]]
    assert int(s.segments["total_size"].sum()) == sum(seg["total_size"] for seg in raw["segments"])
    # Blocks tile their segment: each segment's blocks start at its address and sum to its size.
    for (_, seg_addr), grp in s.blocks.groupby(["device", "segment_address"], observed=True):
        addrs = grp["address"].to_numpy().astype(np.int64)
        sizes = grp["size"].to_numpy()
        assert addrs[0] == int(seg_addr)
        assert (np.diff(addrs) == sizes[:-1]).all()
    # The trace, column by column.
    for d, entries in enumerate(raw["device_traces"]):
        t = s.trace(d)
        assert len(t) == len(entries)
        assert [t.action_names[c] for c in t.action] == [e["action"] for e in entries]
        assert t.addr.tolist() == [e.get("addr", 0) for e in entries]
        assert t.size.tolist() == [e["size"] for e in entries]
        if entries and "time_us" in entries[0]:
            assert t.time_us is not None and t.time_us.tolist() == [e["time_us"] for e in entries]
        else:
            assert t.time_us is None
    # The active blocks are the ones the file says (address, requested size).
    active = s.blocks[s.blocks["state"].isin(["active_allocated", "active_pending_free"])]
    got = sorted(zip(active["address"].astype(int), active["requested_size"].astype(int), strict=True))
    assert got == sorted(end_active_blocks(raw, 0).elements())


def test_legacy_real_files_are_recognised() -> None:
    s = load(next(p for p in REAL_FILES if p.name == "flexgen-oom-t2.0.pickle"))
    assert s.format.legacy_block_history
    assert s.format.block_keys == ("size", "requested_size", "state", "history")
    assert s.trace(0).time_us is None


# -- layouts ------------------------------------------------------------------------------------------------

def test_bare_list_of_segments(tmp_path: Path) -> None:
    snap = two_block_snapshot()
    s = load(write_pickle(tmp_path / "list.pickle", snap["segments"]))
    assert s.format.layout == "segment list"
    assert not s.format.trace_included
    assert s.traces == {}
    assert s.devices == [0]
    assert len(s.trace(0)) == 0
    assert facts(s)["segments"] == facts(load(write_pickle(tmp_path / "d.pickle", snap)))["segments"]


def test_empty_list_is_an_empty_snapshot(tmp_path: Path) -> None:
    s = load(write_pickle(tmp_path / "e.pickle", []))
    assert s.devices == []
    assert len(s.segments) == 0 and len(s.blocks) == 0


def _legacy_2_0(with_requested: bool) -> dict[str, Any]:
    """torch 2.0: blocks without address; history lists instead of requested_size/frames; no pool id."""
    seg_addr = BASE
    sizes = [(2048, "active_allocated", 2000), (1024, "inactive", 1000), (4096, "active_allocated", 4000),
             (2 * MiB - 7168, "inactive", 0)]
    blocks, offset = [], seg_addr
    for size, state, real in sizes:
        block: dict[str, Any] = {"size": size, "state": state}
        if real:
            block["history"] = [{"addr": offset, "real_size": real // 2, "frames": frames_for("old")},
                                {"addr": offset, "real_size": real, "frames": frames_for("new")}]
        if with_requested:
            block["requested_size"] = real
        blocks.append(block)
        offset += size
    seg = {"device": 0, "address": seg_addr, "total_size": 2 * MiB, "allocated_size": 6144,
           "active_size": 6144, "requested_size": 6000, "stream": 0, "segment_type": "small",
           "blocks": blocks}
    return {"segments": [seg], "device_traces": [[{"action": "snapshot", "addr": 0, "size": 6000,
                                                   "stream": 0}]]}


@pytest.mark.parametrize("with_requested", [False, True])
def test_2_0_history_blocks_get_addresses_by_running_sum(tmp_path: Path, with_requested: bool) -> None:
    s = load(write_pickle(tmp_path / "legacy.pickle", _legacy_2_0(with_requested)))
    assert s.format.legacy_block_history
    assert [int(a) for a in s.blocks["address"]] == [BASE, BASE + 2048, BASE + 3072, BASE + 7168]
    active = s.blocks[s.blocks["state"] == "active_allocated"]
    assert active["requested_size"].tolist() == [2000, 4000]
    assert s.segments["pool_id"].astype(str).tolist() == ["0,0"]
    assert not bool(s.segments["is_expandable"].iloc[0])
    # The block's stack is its latest history entry's.
    row = int(np.flatnonzero(s.blocks["requested_size"].to_numpy() == 4000)[0])
    assert s.stack(int(s.block_stack_ids(np.array([row]))[0]))[0][2] == "new"


def test_trace_without_time_us(tmp_path: Path) -> None:
    s = load(write_pickle(tmp_path / "t.pickle", two_block_snapshot(times=False)))
    assert s.trace(0).time_us is None
    assert s.events["time_us"].isna().all()
    assert len(s.trace(0)) == 4


def test_entries_without_frames_key(tmp_path: Path) -> None:
    snap = two_block_snapshot(frames=False)
    assert all("frames" not in e for e in snap["device_traces"][0])
    s = load(write_pickle(tmp_path / "f.pickle", snap))
    assert s.trace(0).stack_ids.tolist() == [-1] * 4
    assert (s.events["stack_id"] == -1).all()
    assert s.stack(-1) == []


def test_frames_are_interned_by_value_and_identity(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    shared = frames_for("forward", 7)
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.alloc(BASE, 10, frames=shared)
    b.event("free_completed", BASE, 10, frames=shared)
    b.alloc(BASE, 10, frames=frames_for("forward", 7))   # equal value, different objects
    b.event("free_completed", BASE, 10, frames=frames_for("backward", 9))
    s = load(write_pickle(tmp_path / "fr.pickle", b.build()))
    ids = s.events["stack_id"].tolist()
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert s.stack(ids[0]) == [("/app/model.py", 7, "forward"), ("/app/train.py", 10, "main")]
    assert len(s.frames_table()) == 3
    assert s.stacks_table()["stack_id"].nunique() == 2


def test_oom_entries_without_addr(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.alloc(BASE, 100)
    oom = b.event("oom", None, 20 * MiB, device_free=3 * MiB)
    b.event("free_completed", BASE, 100)
    assert "addr" not in oom
    s = load(write_pickle(tmp_path / "oom.pickle", b.build()))
    t = s.trace(0)
    assert t.action[1] == OOM
    assert t.device_free == {1: 3 * MiB}
    ooms = s.ooms
    assert ooms.to_dict("records") == [{"device": 0, "index": 1, "size": 20 * MiB, "stream": 0,
                                        "device_free": 3 * MiB, "time_us": oom["time_us"]}]


def test_private_pools_and_expandable(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.segment(BASE + 2 * MiB, [(512, 512, "active_allocated"), (2 * MiB - 512, 0, "inactive")], pool=(0, 1))
    b.segment(BASE + 4 * MiB, [(20 * MiB, 0, "inactive")], pool=(1, 0), expandable=True)
    s = load(write_pickle(tmp_path / "p.pickle", b.build()))
    assert s.segments["pool_id"].astype(str).tolist() == ["0,0", "0,1", "1,0"]
    assert s.segments["is_expandable"].tolist() == [False, False, True]
    assert s.blocks["pool_id"].astype(str).tolist() == ["0,0", "0,1", "0,1", "1,0"]
    # JSON turns the pool tuple into a list; the column must read the same.
    sj = load(write_json(tmp_path / "p.json", b.build()))
    assert sj.segments["pool_id"].astype(str).tolist() == ["0,0", "0,1", "1,0"]


def test_several_devices(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")], device=0)
    b.segment(BASE, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")], device=1)
    b.alloc(BASE, 64, device=0)
    b.event("free_completed", BASE, 64, device=0)
    b.alloc(BASE, 1000, device=1)
    s = load(write_pickle(tmp_path / "two.pickle", b.build()))
    assert s.devices == [0, 1]
    assert len(s.trace(0)) == 2 and len(s.trace(1)) == 1
    assert s.trace(1).action.tolist() == [ALLOC]
    assert s.segments["device"].tolist() == [0, 1]
    assert s.events.groupby("device").size().to_dict() == {0: 2, 1: 1}


def test_devices_in_segments_only_still_count() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")], device=3)
    s = to_snapshot(b.build(n_devices=0), "x", "pickle")
    assert s.devices == [3]
    assert len(s.trace(3)) == 0


@pytest.mark.parametrize("traces", [[], [[]], [[], []]], ids=["none", "one empty", "two empty"])
def test_empty_traces(tmp_path: Path, traces: list[Any]) -> None:
    snap = two_block_snapshot()
    snap["device_traces"] = traces
    s = load(write_pickle(tmp_path / "e.pickle", snap))
    assert s.format.trace_included
    assert s.traces == {}
    assert s.devices == [0]
    assert len(s.events) == 0


def _with_unknown_keys(snap: dict[str, Any]) -> dict[str, Any]:
    snap = copy.deepcopy(snap)
    snap["host_segments_v99"] = [{"weird": 1}]
    snap["some_future_top_level"] = {"nested": [1, 2, 3]}
    for seg in snap["segments"]:
        seg["future_segment_field"] = ("a", 1)
        for block in seg["blocks"]:
            block["future_block_field"] = {"x": None}
            for fr in block.get("frames") or []:
                fr["column"] = 3
    for entries in snap["device_traces"]:
        for e in entries:
            e["forward_frames"] = [{"filename": "f.py", "line": 1, "name": "g"}]
            e["internal_metadata"] = {"k": "v"}
            for fr in e.get("frames") or []:
                fr["extra"] = True
    return snap


def test_unknown_keys_at_every_level_are_ignored(tmp_path: Path) -> None:
    plain = two_block_snapshot()
    s0 = load(write_pickle(tmp_path / "plain.pickle", plain))
    s1 = load(write_pickle(tmp_path / "extra.pickle", _with_unknown_keys(plain)))
    assert facts(s1) == facts(s0)
    assert s1.events["stack_id"].tolist() == s0.events["stack_id"].tolist()
    assert s1.stack(0) == s0.stack(0)
    assert "forward_frames" in s1.format.entry_keys
    assert "some_future_top_level" in s1.format.top_level_keys


def test_unknown_actions_are_kept_and_named(tmp_path: Path) -> None:
    snap = two_block_snapshot()
    snap["device_traces"][0].insert(1, {"action": "future_thing", "addr": 5, "size": 1, "stream": 0,
                                        "time_us": snap["device_traces"][0][0]["time_us"]})
    s = load(write_pickle(tmp_path / "u.pickle", snap))
    t = s.trace(0)
    assert t.action_names[t.action[1]] == "future_thing"
    assert t.action[0] == ALLOC and t.action[-1] == FREE_COMPLETED


def test_active_awaiting_free_is_active(tmp_path: Path) -> None:
    from snapanalyze.replay import replay
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_awaiting_free"), (2 * MiB - 1024, 0, "inactive")])
    tl = replay(load(write_pickle(tmp_path / "aw.pickle", b.build())))
    assert tl[0].baseline_active == 1000


@pytest.mark.parametrize("container", ["pickle", "gzip pickle", "gzip json", "torch.save zip", "json"])
def test_every_container_gives_the_same_snapshot(tmp_path: Path, container: str) -> None:
    snap = two_block_snapshot()
    snap["segments"].append({**snap["segments"][0], "address": BASE + 2 * MiB, "segment_pool_id": (0, 1),
                             "blocks": [{**blk, "address": blk["address"] + 2 * MiB}
                                        for blk in snap["segments"][0]["blocks"]]})
    reference = facts(load(write_pickle(tmp_path / "ref.pickle", snap)))
    payload = {"pickle": lambda: pickle.dumps(snap), "gzip pickle": lambda: pickle.dumps(snap),
               "gzip json": lambda: json.dumps(snap).encode(),
               "torch.save zip": lambda: pickle.dumps(snap, 2),
               "json": lambda: json.dumps(snap).encode()}[container]()
    path = tmp_path / "file"
    if container.startswith("gzip"):
        write_gzip(path, payload)
    elif container == "torch.save zip":
        write_torch_zip(path, payload)
    else:
        path.write_bytes(payload)
    s = load(path)
    assert s.format.container == container
    assert facts(s) == reference


def test_user_metadata_compile_context_annotations_settings(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.alloc(BASE, 10, user_metadata="step 1", compile_context="Torch-Compiled Region: 0/0")
    b.event("free_completed", BASE, 10)
    snap = b.build()
    snap["external_annotations"] = [{"name": "optimizer", "stage": "START", "device": 0, "time_us": 5},
                                    {"name": "optimizer", "stage": "END", "device": 0, "time_us": 9}]
    s = load(write_pickle(tmp_path / "m.pickle", snap))
    ev = s.events
    assert ev["user_metadata"].tolist() == ["step 1", ""]
    assert ev["compile_context"].tolist() == ["Torch-Compiled Region: 0/0", "N/A"]
    assert s.annotations[["name", "stage"]].values.tolist() == [["optimizer", "START"], ["optimizer", "END"]]
    assert s.annotations["time_us"].tolist() == [5, 9]
    assert s.allocator_settings is not None and s.allocator_settings["max_split_size"] == -1


# -- wrong shapes -------------------------------------------------------------------------------------------

WRONG: dict[str, Any] = {
    "an int": 42,
    "a string": "segments",
    "a dict without segments": {"device_traces": [], "allocator_settings": {}},
    "a list of ints": [1, 2, 3],
    "segments not a list": {"segments": {"address": 1}},
    "segments of ints": {"segments": [1, 2]},
    "a block without size": {"segments": [{"address": 1, "blocks": [{"state": "inactive"}]}]},
    "device_traces not a list": {"segments": [], "device_traces": 7},
    "trace of ints": {"segments": [], "device_traces": [[1, 2]]},
    "an entry without action": {"segments": [], "device_traces": [[{"addr": 1, "size": 1, "stream": 0}]]},
    "an action that is not a string": {"segments": [], "device_traces": [[{"action": 1, "addr": 1, "size": 1,
                                                                            "stream": 0}]]},
    "entry with a non-numeric size": {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1,
                                                                           "size": "big", "stream": 0}]]},
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_shapes_raise_bad_input(tmp_path: Path, case: str) -> None:
    path = write_pickle(tmp_path / "w.pickle", WRONG[case])
    with pytest.raises(BadInputError) as info:
        load(path)
    assert info.value.path == str(path)
    assert "snapshot" in info.value.problem or "trace" in info.value.problem
    assert "\n" not in str(info.value)


def test_segment_frame_of_dataframe_types() -> None:
    s = to_snapshot(two_block_snapshot(), "mem", "pickle")
    assert s.blocks["address"].dtype == np.uint64
    assert s.blocks["segment_address"].dtype == np.uint64
    assert isinstance(s.blocks["state"].dtype, pd.CategoricalDtype)
    assert s.trace(0).addr.dtype == np.uint64
    assert s.trace(0).size.dtype == np.int64


# -- the newest layouts (fixtures/generate.py builds one of each) -------------------------------------------

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"


def test_torch_2_14_fields_load_into_their_own_columns() -> None:
    s = load(SCENARIO_DIR / "torch214_graph_pools_host.pickle")
    t = s.trace(0)
    assert set(t.details.pool_id_names) == {"0,0", "1,0", "2,0"}            # pool_id on every entry (2.12+)
    assert (t.action == ANNOTATE).sum() == 1
    annotate = int(np.flatnonzero(t.action == ANNOTATE)[0])
    assert t.user_metadata_names[t.user_metadata[annotate]] == "kv_cache"
    assert "active_pending_free" in set(s.blocks["state"])
    # pinned host memory: its own Snapshot on device -1, never in the device's numbers
    assert s.host is not None and s.host.devices == [HOST_DEVICE] and s.devices == [0]
    assert int(s.host.segments["total_size"].sum()) == 4 * 64 * MiB
    assert len(s.host.trace(HOST_DEVICE)) == 12
    assert not (s.segments["device"] < 0).any()


def test_event_pool_ids_are_checked_before_they_are_hashed(tmp_path: Path) -> None:
    raw = pickle.loads((SCENARIO_DIR / "torch214_graph_pools_host.pickle").read_bytes())
    raw["device_traces"][0][5]["pool_id"] = ((((1,),),),)
    with pytest.raises(BadInputError, match=r"device_traces\[0\]\[5\]\.pool_id is .*expected a pair of integers"):
        load(write_pickle(tmp_path / "p.pickle", raw))


def test_the_xpu_layout_loads_like_cuda() -> None:
    s = load(SCENARIO_DIR / "xpu_kv_weights.pickle")
    assert s.format.entry_keys == ("action", "addr", "size", "stream", "time_us", "frames")
    assert s.allocator_settings == {"PYTORCH_ALLOC_CONF": "", "expandable_segments": False}
    assert s.trace(0).user_metadata is None and s.trace(0).details.pool_id is None and s.host is None


# -- many segments: columns are built a column at a time, and still name the first bad entry ---------------

POOLS: list[Any] = [(0, 0), [0, 1], None, "graph-7", (3, 4)]
STATES = ["active_allocated", "inactive", "active_pending_free", None]


def _many_segments(n: int = 300) -> dict[str, Any]:
    """`n` segments of 0–3 blocks each, pool ids as tuples, lists, None and strings (the layouts torch and the
    viewer write), blocks with and without frames."""
    segments = []
    for i in range(n):
        address = BASE + i * 4 * MiB
        sizes = [512 * (1 + (i + j) % 7) for j in range(i % 4)]
        blocks, offset = [], address
        for j, size in enumerate(sizes):
            blocks.append({"address": offset, "size": size, "requested_size": size - j, "state": STATES[(i + j) % 4],
                           "frames": frames_for(f"f{i % 5}") if j % 2 == 0 else []})
            offset += size
        segments.append({"device": 0, "address": address, "total_size": 4 * MiB, "allocated_size": sum(sizes),
                         "active_size": sum(sizes), "requested_size": sum(sizes) - 1, "stream": i % 3,
                         "segment_type": "small" if i % 2 else "large", "segment_pool_id": POOLS[i % 5],
                         "is_expandable": i % 7 == 0, "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": [[]]}


def test_many_segments_columns_match_their_raw_rows() -> None:
    raw = _many_segments()
    s = to_snapshot(copy.deepcopy(raw), "many", "pickle")
    segs = raw["segments"]
    pool_text = {0: "0,0", 1: "0,1", 2: "0,0", 3: "graph-7", 4: "3,4"}
    assert s.segment_columns["address"].tolist() == [g["address"] for g in segs]
    assert s.segment_columns["stream"].tolist() == [g["stream"] for g in segs]
    assert s.segment_columns["pool_id"].tolist() == [pool_text[i % 5] for i in range(len(segs))]
    assert s.segment_columns["is_expandable"].tolist() == [g["is_expandable"] for g in segs]
    rows = [(i, g, b) for i, g in enumerate(segs) for b in g["blocks"]]
    blocks = s.block_columns
    assert len(blocks["address"]) == len(rows) == len(blocks["stack_id"])
    assert blocks["address"].tolist() == [b["address"] for _, _, b in rows]
    assert blocks["requested_size"].tolist() == [b["requested_size"] for _, _, b in rows]
    assert blocks["state"].tolist() == [b["state"] or "" for _, _, b in rows]
    assert blocks["segment_address"].tolist() == [g["address"] for _, g, _ in rows]
    assert blocks["pool_id"].tolist() == [pool_text[i % 5] for i, _, _ in rows]
    assert blocks["segment_type"].tolist() == [g["segment_type"] for _, g, _ in rows]
    assert blocks["stream"].tolist() == [g["stream"] for _, g, _ in rows]
    assert blocks["is_expandable"].tolist() == [g["is_expandable"] for _, g, _ in rows]
    assert [s.stack(i) for i in blocks["stack_id"].tolist()] == \
        [[(f["filename"], f["line"], f["name"]) for f in b["frames"] or []] for _, _, b in rows]
    # Interned: one string object per distinct state and pool id, however many rows hold it.
    assert len({id(v) for v in blocks["state"]}) == len(set(blocks["state"]))
    assert len({id(v) for v in s.segment_columns["pool_id"]}) == 4


BAD_ENTRIES: dict[str, tuple[Any, str]] = {
    "block size": (lambda r: r["segments"][137]["blocks"].__setitem__(
        0, {**r["segments"][137]["blocks"][0], "size": "big"}),
        "segments[137].blocks[0].size is the string 'big', expected an integer"),
    "block requested_size": (lambda r: r["segments"][203]["blocks"][2].__setitem__("requested_size", 1.5),
                             "segments[203].blocks[2].requested_size is 1.5, expected an integer"),
    "block state": (lambda r: r["segments"][298]["blocks"][1].__setitem__("state", ["active"]),
                    "segments[298].blocks[1].state is a list, expected a string"),
    "block not a dict": (lambda r: r["segments"][42]["blocks"].__setitem__(1, 7),
                         "segments[42].blocks[1] is 7, expected a block dict"),
    "blocks not a list": (lambda r: r["segments"][41].__setitem__("blocks", "xyz"),
                          "segments[41].blocks is the string 'xyz', expected a list of blocks"),
    "segment not a dict": (lambda r: r["segments"].__setitem__(250, [1, 2]),
                           "segments[250] is a list, expected a segment dict"),
    "segment stream": (lambda r: r["segments"][77].__setitem__("stream", "7"),
                       "segments[77].stream is the string '7', expected an integer"),
    "nested pool id": (lambda r: r["segments"][150].__setitem__("segment_pool_id", ((1, 2), 3)),
                       "segments[150].segment_pool_id is a tuple of 2 items, expected a pair of integers"),
    "segment type": (lambda r: r["segments"][9].__setitem__("segment_type", 5),
                     "segments[9].segment_type is 5, expected a string"),
    "address past 64 bits": (lambda r: r["segments"][11]["blocks"][0].__setitem__("address", 1 << 70),
                             "segments hold an address or size that does not fit 64 bits"),
}


BAD_TRACE_ENTRIES: dict[str, tuple[Any, str]] = {
    "entry past the first chunk": (lambda t: t.__setitem__(9000, [1]),
                                   "device_traces[0][9000] is a list, expected a trace entry dict"),
    "the first of two": (lambda t: (t.__setitem__(12000, 5), t.__setitem__(len(t) - 1, None)),
                         "device_traces[0][12000] is 5, expected a trace entry dict"),
    "the last entry": (lambda t: t.__setitem__(len(t) - 1, "alloc"),
                       "device_traces[0][18004] is the string 'alloc', expected a trace entry dict"),
    "an action that is not a string": (lambda t: t[10000].__setitem__("action", None),
                                       "device_traces[0][10000].action is None, expected a string"),
    "one odd text among the same": (lambda t: t[8500].__setitem__("compile_context", ("a",)),
                                    "device_traces[0][8500].compile_context is a tuple, expected a string"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACE_ENTRIES))
def test_a_bad_trace_entry_among_many_is_named(tmp_path: Path, case: str) -> None:
    spoil, message = BAD_TRACE_ENTRIES[case]
    raw = _reused_addresses_snapshot(6000)
    for entry in raw["device_traces"][0]:
        entry["compile_context"] = "N/A"        # one text throughout, as torch writes it
    spoil(raw["device_traces"][0])
    with pytest.raises(BadInputError) as info:
        load(write_pickle(tmp_path / "bad.pickle", raw))
    assert message in info.value.problem


def test_a_text_column_of_one_value_reads_as_that_value_everywhere() -> None:
    raw = _reused_addresses_snapshot(6000)
    for k, entry in enumerate(raw["device_traces"][0]):
        entry["compile_context"] = "N/A"
        entry["user_metadata"] = "req-7" if k >= 9000 else ""   # the same in every chunk but one
    t = to_snapshot(raw, "x", "pickle").trace(0)
    assert set(np.array(t.compile_context_names)[t.compile_context].tolist()) == {"N/A"}
    metadata = np.array(t.user_metadata_names)[t.user_metadata]
    assert (metadata[:9000] == "").all() and (metadata[9000:] == "req-7").all()


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_a_bad_value_among_many_segments_is_named(tmp_path: Path, case: str) -> None:
    spoil, message = BAD_ENTRIES[case]
    raw = _many_segments()
    spoil(raw)
    with pytest.raises(BadInputError) as info:
        load(write_pickle(tmp_path / "bad.pickle", raw))
    assert message in info.value.problem


def test_integral_floats_and_bools_still_count_as_integers() -> None:
    raw = _many_segments(20)
    raw["segments"][3]["total_size"] = float(4 * MiB)
    raw["segments"][5]["blocks"][0]["size"] = 1024.0
    raw["segments"][6]["device"] = False
    s = to_snapshot(raw, "floats", "pickle")
    assert int(s.segment_columns["total_size"][3]) == 4 * MiB and s.segment_columns["device"].dtype == np.int64
    assert 1024 in s.block_columns["size"].tolist()


def test_legacy_blocks_mixed_with_addressed_ones_take_the_running_sum() -> None:
    raw = _many_segments(12)
    seg = raw["segments"][7]                     # three blocks: drop the address of the last two
    for b in seg["blocks"][1:]:
        del b["address"]
    s = to_snapshot(copy.deepcopy(raw), "legacy", "pickle")
    assert s.format.legacy_block_history
    rows = [b for g in raw["segments"] for b in g["blocks"]]
    at = sum(len(g["blocks"]) for g in raw["segments"][:7])
    sizes = [b["size"] for b in seg["blocks"]]
    assert s.block_columns["address"][at:at + 3].tolist() == [seg["address"], seg["address"] + sizes[0],
                                                             seg["address"] + sizes[0] + sizes[1]]
    assert len(s.block_columns["address"]) == len(rows)


def test_consume_empties_the_raw_lists_and_changes_nothing_else(tmp_path: Path) -> None:
    raw = two_block_snapshot()
    kept = to_snapshot(copy.deepcopy(raw), "x", "pickle")
    used = to_snapshot(raw, "x", "pickle", consume=True)
    assert facts(used) == facts(kept)
    assert raw["segments"] == [] and raw["device_traces"] == [[]]
    assert used.format == kept.format


def test_without_frames_every_event_and_block_is_frameless_and_the_rest_is_the_same() -> None:
    raw = _many_segments(40)
    raw["device_traces"] = two_block_snapshot()["device_traces"]
    full = to_snapshot(copy.deepcopy(raw), "x", "pickle")
    bare = to_snapshot(raw, "x", "pickle", frames=False)
    assert facts(bare) == facts(full)
    assert (full.trace(0).stack_ids >= 0).any() and bare.trace(0).stack_ids is None
    assert (full.block_columns["stack_id"] >= 0).any() and (bare.block_columns["stack_id"] == -1).all()
    everything = np.arange(len(full.trace(0)))
    assert (bare.event_stack_ids(0, everything) == -1).all() and len(bare.events) == len(full.events)


# -- which stacks are kept -----------------------------------------------------------------------------------

def _reused_addresses_snapshot(rounds: int) -> dict[str, Any]:
    """A block from before the trace freed at once and its address reused, then `rounds` alloc/free pairs
    over a few addresses (past one CHUNK of entries), a second pre-window block freed last, and an OOM."""
    b = SnapshotBuilder()
    b.segment(BASE, [(MiB, MiB, "active_allocated"), (MiB, 0, "inactive")])
    b.segment(BASE + 64 * MiB, [(MiB, MiB, "active_allocated"), (MiB, 0, "inactive")])
    b.free(BASE, MiB)                           # allocated before the trace: its free decides it
    for k in range(rounds):
        addr = BASE + (k % 3) * 4 * MiB
        b.alloc(addr, MiB)
        b.free(addr, MiB)
    b.event("oom", None, 20 * MiB, device_free=MiB)
    b.free(BASE + 64 * MiB, MiB)                # a second pre-window block, freed in a later chunk
    return b.build()


def test_allocations_keeps_the_stacks_an_analysis_of_live_bytes_reads() -> None:
    raw = _reused_addresses_snapshot(6000)
    full = to_snapshot(copy.deepcopy(raw), "x", "pickle")
    part = to_snapshot(raw, "x", "pickle", consume=True, frames="allocations")
    assert facts(part) == facts(full)
    t = full.trace(0)
    everything = np.arange(len(t))
    kept = np.array([s != [] for s in (part.stack(i) for i in part.event_stack_ids(0, everything))])
    names = np.array(t.action_names)[t.action]
    assert kept[(names == "alloc") | (names == "oom")].all()
    frees = np.flatnonzero(names == "free_completed")
    assert frees[kept[frees]].tolist() == [frees[0], frees[-1]]     # only the pre-window blocks' frees
    same = [full.stack(a) == part.stack(b) for a, b in
            zip(full.event_stack_ids(0, everything[kept]), part.event_stack_ids(0, everything[kept]))]
    assert all(same)
    rows = np.arange(len(full.block_columns["state"]))
    active = full.block_columns["state"] != "inactive"
    assert [full.stack(i) for i in full.block_stack_ids(rows[active])] == \
        [part.stack(i) for i in part.block_stack_ids(rows[active])]
    assert (part.block_stack_ids(rows[~active]) == -1).all()
    assert raw["device_traces"] == [[]]         # consumed


def test_an_unknown_frames_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="frames='some'"):
        to_snapshot(two_block_snapshot(), "x", "pickle", frames="some")


@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_every_real_file_attributes_the_same_from_its_allocations_stacks(path: Path) -> None:
    from snapanalyze.analyze.attribute import attribute
    full, part = load(path), load(path, frames="allocations")
    a, b = attribute(full), attribute(part)
    shown = [c for c in BLOCK_COLUMNS if c != "stack_id"]        # ids differ between two loadings' tables
    assert a.blocks[shown].equals(b.blocks[shown])
    assert [full.stack(s) for s in a.blocks["stack_id"]] == [part.stack(s) for s in b.blocks["stack_id"]]
