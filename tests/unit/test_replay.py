"""replay: exact active (requested) and reserved curves, blocks from before the window, and the end-state
check, on the real corpus, on hand-built traces of every layout, and on random traces (hypothesis)."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    BASE,
    REAL_FILES,
    SnapshotBuilder,
    end_active_blocks,
    naive_replay,
    real_ids,
    write_gzip,
    write_json,
    write_pickle,
    write_torch_zip,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapanalyze.load import load
from snapanalyze.load.columns import to_snapshot
from snapanalyze.replay import DeviceTimeline, Timeline, replay, rounded_size

MiB = 1024 * 1024


def live_set(dt: DeviceTimeline, index: int) -> Counter[tuple[int, int]]:
    live = dt.live_at(index)
    return Counter(zip(live["addr"].astype(int), live["size"].astype(int), strict=True))


def end_live_set(dt: DeviceTimeline) -> Counter[tuple[int, int]]:
    return live_set(dt, len(dt) - 1)


def assert_matches_reference(tl: Timeline, raw: Any) -> None:
    """The replay equals the naive reference, device by device, event by event."""
    for device, dt in tl.devices.items():
        ref = naive_replay(raw, device)
        assert dt.baseline_active == ref.baseline_active
        assert dt.active.tolist() == ref.active
        assert dt.baseline_reserved == ref.baseline_reserved
        assert dt.reserved.tolist() == ref.reserved
        assert end_live_set(dt) == ref.live_end


# -- the real corpus ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_real_file_replays_to_its_end_state(path: Path, real_raw: dict[str, Any]) -> None:
    raw = real_raw[path.name]
    snap = load(path)
    tl = replay(snap)
    assert tl.check_invariants() == []
    assert sorted(tl.devices) == snap.devices == [0]
    for device, dt in tl.devices.items():
        assert len(dt) == (len(raw["device_traces"][device]) if raw["device_traces"] else 0)
        # Replayed live set at the end (from the lifetimes) == active blocks in segments.
        blocks = snap.blocks
        active = blocks[(blocks["device"] == device)
                        & blocks["state"].isin(["active_allocated", "active_pending_free"])]
        expected = Counter(zip(active["address"].astype(int), active["requested_size"].astype(int),
                               strict=True))
        assert end_live_set(dt) == expected
        # … and the same set read straight from the raw file, independently of the loader.
        assert end_live_set(dt) == end_active_blocks(raw, device)
        # The curve's last value is the sum of that set.
        assert dt.active_at(len(dt) - 1) == sum(r * k for (_, r), k in expected.items())
        # Reserved ends at Σ total_size of the device's segments.
        assert dt.reserved_at(len(dt) - 1) == sum(s["total_size"] for s in raw["segments"]
                                                  if s["device"] == device)
    assert_matches_reference(tl, raw)


def test_real_file_with_pre_window_frees_counts_them_in_the_baseline(real_raw: dict[str, Any]) -> None:
    name = "cs336-step-user-metadata-t2.11.pickle"
    tl = replay(load(next(p for p in REAL_FILES if p.name == name)))
    lt = tl[0].lifetimes
    pre_freed = lt[lt["origin"] == "before window, freed in trace"]
    throughout = lt[lt["origin"] == "before window, live throughout"]
    assert len(pre_freed) > 0
    assert tl[0].baseline_active == int(pre_freed["size"].sum() + throughout["size"].sum())
    assert (pre_freed["alloc_index"] == -1).all() and (pre_freed["free_index"] >= 0).all()


def test_legacy_single_free_counts_as_pre_window_block() -> None:
    """flexgen-opt1.3b (2.0) holds one free_completed with no alloc: a block live before the window."""
    tl = replay(load(next(p for p in REAL_FILES if p.name == "flexgen-opt1.3b-t2.0.pickle")))
    dt = tl[0]
    assert len(dt) == 1
    assert dt.active_at(0) == dt.baseline_active - 8896512
    assert tl.check_invariants() == []


# -- a hand-built window with both kinds of pre-window blocks ----------------------------------------------

def mixed_window() -> tuple[dict[str, Any], dict[str, int]]:
    """Block A live throughout (no event), B freed in the window without an alloc, C allocated and still
    live, D allocated and freed, E in a 20 MiB segment created and released inside the window."""
    b = SnapshotBuilder()
    a_addr, b_addr, c_addr, d_addr, _ = b.segment(BASE, [
        (1024, 1000, "active_allocated"), (512, 300, "inactive"), (2048, 2000, "active_allocated"),
        (5120, 0, "inactive"), (2 * MiB - 8704, 0, "inactive")])
    big = BASE + 64 * MiB
    b.alloc(c_addr, 2000)                       # 0
    b.free(b_addr, 300)                         # 1, 2
    b.event("segment_alloc", big, 20 * MiB)     # 3
    b.alloc(big, 15 * MiB)                      # 4
    b.alloc(d_addr, 5000)                       # 5
    b.free(d_addr, 5000)                        # 6, 7
    b.free(big, 15 * MiB)                       # 8, 9
    b.event("segment_free", big, 20 * MiB)      # 10
    return b.build(), {"A": a_addr, "B": b_addr, "C": c_addr, "D": d_addr, "E": big}


def test_exact_curves_with_blocks_from_before_the_window() -> None:
    raw, addr = mixed_window()
    tl = replay(to_snapshot(raw, "mixed", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.baseline_active == 1000 + 300
    e = 15 * MiB
    assert dt.active.tolist() == [3300, 3300, 3000, 3000, 3000 + e, 8000 + e, 8000 + e, 3000 + e, 3000 + e,
                                  3000, 3000]
    assert dt.baseline_reserved == 2 * MiB
    assert dt.reserved.tolist() == [2 * MiB] * 3 + [22 * MiB] * 7 + [2 * MiB]
    # Lifetimes name where each block came from.
    lt = dt.lifetimes.set_index("addr")
    assert lt.loc[addr["A"], "origin"] == "before window, live throughout"
    assert (lt.loc[addr["A"], "alloc_index"], lt.loc[addr["A"], "free_index"]) == (-1, -1)
    assert lt.loc[addr["B"], "origin"] == "before window, freed in trace"
    assert (lt.loc[addr["B"], "alloc_index"], lt.loc[addr["B"], "free_index"]) == (-1, 2)
    assert lt.loc[addr["B"], "free_requested_index"] == 1
    assert lt.loc[addr["C"], "origin"] == "trace"
    assert (lt.loc[addr["C"], "alloc_index"], lt.loc[addr["C"], "free_index"]) == (0, -1)
    assert (lt.loc[addr["D"], "alloc_index"], lt.loc[addr["D"], "free_index"]) == (5, 7)
    # Live sets at the start and the end.
    assert live_set(dt, -1) == Counter({(addr["A"], 1000): 1, (addr["B"], 300): 1})
    assert end_live_set(dt) == Counter({(addr["A"], 1000): 1, (addr["C"], 2000): 1})
    assert_matches_reference(tl, raw)


def test_accessors_before_the_first_event() -> None:
    raw, _ = mixed_window()
    dt = replay(to_snapshot(raw, "mixed", "pickle"))[0]
    assert dt.active_at(-1) == dt.baseline_active
    assert dt.reserved_at(-1) == dt.baseline_reserved
    assert dt.allocated_est_at(-1) == dt.baseline_allocated_est
    assert dt.time_at(-1) is None
    assert dt.time_at(0) == raw["device_traces"][0][0]["time_us"]


def test_allocated_estimate_rounds_trace_blocks_and_uses_real_sizes_of_known_blocks() -> None:
    raw, _ = mixed_window()
    dt = replay(to_snapshot(raw, "mixed", "pickle"))[0]
    # Baseline: A's real block (1024) + B rounded from its free (300 → 512).
    assert dt.baseline_allocated_est == 1024 + 512
    # C is known from segments (2048); allocated falls at free_requested (event 1 for B).
    assert dt.allocated_est_at(0) == 1024 + 512 + 2048
    assert dt.allocated_est_at(1) == 1024 + 2048
    assert dt.allocated_est_at(5) - dt.allocated_est_at(4) == 5120
    assert dt.allocated_est_at(6) == dt.allocated_est_at(4)   # falls at free_requested
    assert rounded_size(np.array([1, 512, 513, 5000])).tolist() == [512, 512, 1024, 5120]


def test_blocks_in_segments_without_alloc_are_live_throughout() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(4096, 4000, "active_allocated"), (2 * MiB - 4096, 0, "inactive")])
    b.segment(BASE + 2 * MiB, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")])
    b.alloc(BASE + 2 * MiB, 1000)
    raw = b.build()
    dt = replay(to_snapshot(raw, "x", "pickle"))[0]
    assert dt.baseline_active == 4000
    assert dt.active.tolist() == [5000]
    assert dt.baseline_reserved == 4 * MiB


def test_pending_free_at_the_end_stays_active() -> None:
    """A free_requested whose completion had not happened at the snapshot (record_stream): the block is
    `active_pending_free` in segments and still active. Both for a block allocated in the window and one
    from before it."""
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_pending_free"), (1024, 700, "active_pending_free"),
                     (2 * MiB - 2048, 0, "inactive")])
    b.alloc(BASE, 1000)
    b.event("free_requested", BASE, 1000)
    b.event("free_requested", BASE + 1024, 700)
    raw = b.build()
    tl = replay(to_snapshot(raw, "pending", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.baseline_active == 700
    assert dt.active.tolist() == [1700, 1700, 1700]
    assert end_live_set(dt) == Counter({(BASE, 1000): 1, (BASE + 1024, 700): 1})
    # allocated_bytes falls at free_requested even though the block is still active.
    assert dt.allocated_est_at(2) < dt.allocated_est_at(0)
    assert_matches_reference(tl, raw)


def test_trace_without_any_segments_reports_instead_of_crashing() -> None:
    """An inconsistent file (a block live at the end, no segments at all) is a problem to report."""
    raw = {"segments": [], "device_traces": [[{"action": "alloc", "addr": BASE, "size": 100, "stream": 0}]]}
    tl = replay(to_snapshot(raw, "bare", "pickle"))
    assert tl[0].active.tolist() == [100]
    problems = tl.check_invariants()
    assert len(problems) == 1 and "0x7f0000000000" in problems[0]


def test_end_state_mismatch_is_reported() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 999, "active_allocated"), (2 * MiB - 1024, 0, "inactive")])
    b.alloc(BASE, 1000)                  # live at the end, but segments say 999 bytes
    b.alloc(BASE + 1024, 10)             # live at the end, but inactive in segments
    assert len(replay(to_snapshot(b.build(), "bad", "pickle")).check_invariants()) == 2


# -- skip_actions -------------------------------------------------------------------------------------------

def busy_window() -> dict[str, Any]:
    """Pre-window blocks of both kinds, address reuse, frees in every order."""
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_allocated"), (1024, 900, "inactive"),
                     (4096, 4000, "active_allocated"), (4096, 0, "inactive"),
                     (2 * MiB - 10240, 0, "inactive")])
    b.free(BASE + 1024, 900)               # pre-window block freed
    b.alloc(BASE + 2048, 3000)
    b.alloc(BASE + 6144, 4096)
    b.free(BASE + 2048, 3000)
    b.alloc(BASE + 2048, 4000)             # address reused, still live
    b.alloc(BASE + 1024, 100)
    b.free(BASE + 6144, 4096)
    b.free(BASE + 1024, 100)
    return b.build()


def thinned(raw: dict[str, Any], drop: str) -> tuple[dict[str, Any], list[int]]:
    raw = copy.deepcopy(raw)
    entries = raw["device_traces"][0]
    kept = [i for i, e in enumerate(entries) if e["action"] != drop]
    raw["device_traces"][0] = [entries[i] for i in kept]
    return raw, kept


def test_skip_free_requested_keeps_the_active_curve() -> None:
    raw = busy_window()
    full = replay(to_snapshot(raw, "full", "pickle"))[0]
    thin_raw, kept = thinned(raw, "free_requested")
    tl = replay(to_snapshot(thin_raw, "thin", "pickle"))
    thin = tl[0]
    assert tl.check_invariants() == []
    assert thin.baseline_active == full.baseline_active == 1900
    assert thin.active.tolist() == full.active[kept].tolist()
    assert int(thin.active.max()) == int(full.active.max())
    assert_matches_reference(tl, thin_raw)


def test_skip_free_completed_falls_at_free_requested() -> None:
    raw = busy_window()
    full = replay(to_snapshot(raw, "full", "pickle"))[0]
    thin_raw, kept = thinned(raw, "free_completed")
    tl = replay(to_snapshot(thin_raw, "thin", "pickle"))
    thin = tl[0]
    assert tl.check_invariants() == []
    assert thin.baseline_active == full.baseline_active == 1900
    # Each free_requested here is followed at once by its completion: the thinned curve after the request
    # equals the full curve after the completion.
    actions = [e["action"] for e in raw["device_traces"][0]]
    expected = [int(full.active[i + 1]) if actions[i] == "free_requested" else int(full.active[i])
                for i in kept]
    assert thin.active.tolist() == expected
    assert int(thin.active.max()) == int(full.active.max())
    assert end_live_set(thin) == end_live_set(full)
    assert_matches_reference(tl, thin_raw)


# -- layouts ------------------------------------------------------------------------------------------------

def test_bare_segment_list_replays_to_its_blocks(tmp_path: Path) -> None:
    raw = busy_window()
    tl = replay(load(write_pickle(tmp_path / "l.pickle", raw["segments"])))
    dt = tl[0]
    assert len(dt) == 0
    assert dt.baseline_active == 1000 + 4000
    assert dt.baseline_reserved == 2 * MiB
    assert live_set(dt, -1) == end_active_blocks(raw, 0)
    assert tl.check_invariants() == []


def test_legacy_2_0_history_blocks_replay() -> None:
    seg = {"device": 0, "address": BASE, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
           "blocks": [{"size": 1024, "state": "active_allocated",
                       "history": [{"addr": BASE, "real_size": 1000}]},
                      {"size": 512, "state": "inactive", "history": [{"addr": BASE + 1024, "real_size": 10}]},
                      {"size": 2048, "state": "active_allocated",
                       "history": [{"addr": BASE + 1536, "real_size": 2000}]},
                      {"size": 2 * MiB - 3584, "state": "inactive"}]}
    raw = {"segments": [seg], "device_traces": [[
        {"action": "alloc", "addr": BASE + 1536, "size": 2000, "stream": 0}]]}
    tl = replay(to_snapshot(raw, "legacy", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.baseline_active == 1000
    assert dt.active.tolist() == [3000]
    assert dt.time_at(0) is None
    assert end_live_set(dt) == Counter({(BASE, 1000): 1, (BASE + 1536, 2000): 1})


def test_expandable_segments_map_and_unmap_change_reserved() -> None:
    b = SnapshotBuilder()
    # At the end: one expandable segment of 4 MiB mapped (the reservation started with 2 MiB mapped).
    b.segment(BASE, [(3 * MiB, 3 * MiB, "active_allocated"), (MiB, 0, "inactive")], expandable=True,
              segment_type="large")
    b.event("segment_map", BASE + 2 * MiB, 2 * MiB)      # 2 → 4 MiB
    b.alloc(BASE, 3 * MiB)
    b.event("segment_map", BASE + 4 * MiB, 6 * MiB)      # 4 → 10 MiB
    b.event("segment_unmap", BASE + 4 * MiB, 6 * MiB)    # 10 → 4 MiB
    raw = b.build()
    tl = replay(to_snapshot(raw, "exp", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.baseline_reserved == 2 * MiB
    assert dt.reserved.tolist() == [4 * MiB, 4 * MiB, 10 * MiB, 4 * MiB]
    assert dt.active.tolist() == [0, 3 * MiB, 3 * MiB, 3 * MiB]
    assert_matches_reference(tl, raw)


def test_oom_entries_change_nothing() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")])
    b.alloc(BASE, 1000)
    b.event("oom", None, 40 * MiB, device_free=MiB)
    b.event("segment_free", BASE + 2 * MiB, 20 * MiB)     # the allocator frees cache before retrying
    raw = b.build()
    tl = replay(to_snapshot(raw, "oom", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.active.tolist() == [1000, 1000, 1000]
    assert dt.reserved.tolist() == [22 * MiB, 22 * MiB, 2 * MiB]
    assert_matches_reference(tl, raw)


def test_private_pools_count_in_active_and_reserved() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 0, "inactive")])
    b.segment(BASE + 2 * MiB, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")],
              pool=(0, 1))
    b.segment(BASE + 4 * MiB, [(20 * MiB, 20 * MiB, "active_allocated")], pool=(0, 2))
    b.alloc(BASE + 2 * MiB, 1000)
    raw = b.build()
    tl = replay(to_snapshot(raw, "pools", "pickle"))
    dt = tl[0]
    assert tl.check_invariants() == []
    assert dt.baseline_active == 20 * MiB
    assert dt.active.tolist() == [20 * MiB + 1000]
    assert dt.baseline_reserved == 24 * MiB
    pools = dt.lifetimes.merge(tl.snapshot.blocks[["pool_id"]], left_on="block_row", right_index=True)
    assert sorted(pools["pool_id"].astype(str)) == ["0,1", "0,2"]


def test_several_devices_replay_independently() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")], device=0)
    b.segment(BASE, [(2048, 2000, "active_allocated"), (2 * MiB - 2048, 0, "inactive")], device=1)
    b.segment(BASE + 2 * MiB, [(2 * MiB, 0, "inactive")], device=1)
    # The same address on both devices: must not be paired across devices.
    b.alloc(BASE, 2000, device=1)
    b.alloc(BASE + 2 * MiB, 64, device=0)
    b.event("free_completed", BASE + 2 * MiB, 64, device=0)
    b.event("free_completed", BASE + 4096, 77, device=1)   # pre-window block of device 1
    raw = b.build()
    tl = replay(to_snapshot(raw, "multi", "pickle"))
    assert tl.check_invariants() == []
    assert sorted(tl.devices) == [0, 1]
    assert tl[0].baseline_active == 1000
    assert tl[0].active.tolist() == [1064, 1000]
    assert tl[1].baseline_active == 77
    assert tl[1].active.tolist() == [2077, 2000]
    assert tl[0].baseline_reserved == 2 * MiB and tl[1].baseline_reserved == 4 * MiB
    assert_matches_reference(tl, raw)


@pytest.mark.parametrize("traces", [[], [[]]], ids=["no traces", "empty trace"])
def test_empty_trace_replays_to_the_end_state(traces: list[Any]) -> None:
    raw = busy_window()
    raw["device_traces"] = traces
    tl = replay(to_snapshot(raw, "empty", "pickle"))
    dt = tl[0]
    assert len(dt) == 0
    assert dt.baseline_active == 5000
    assert live_set(dt, -1) == end_live_set(dt) == end_active_blocks(raw, 0)
    assert tl.check_invariants() == []


def test_unknown_keys_and_actions_do_not_change_the_replay() -> None:
    raw = busy_window()
    noisy = copy.deepcopy(raw)
    noisy["future"] = 1
    for seg in noisy["segments"]:
        seg["future"] = 2
        for blk in seg["blocks"]:
            blk["future"] = 3
    for e in noisy["device_traces"][0]:
        e["internal_metadata"] = {"x": 1}
    plain = replay(to_snapshot(raw, "a", "pickle"))[0]
    other = replay(to_snapshot(noisy, "b", "pickle"))[0]
    assert other.active.tolist() == plain.active.tolist()
    assert other.reserved.tolist() == plain.reserved.tolist()
    noisy["device_traces"][0].insert(3, {"action": "annotate", "addr": 0, "size": 0, "stream": 0})
    noisy["device_traces"][0].insert(5, {"action": "from_the_future", "addr": BASE, "size": 10**9,
                                         "stream": 0})
    shifted = replay(to_snapshot(noisy, "c", "pickle"))[0]
    assert np.delete(shifted.active, [3, 5]).tolist() == plain.active.tolist()


@pytest.mark.parametrize("container", ["gzip", "zip", "json"])
def test_containers_replay_identically(tmp_path: Path, container: str) -> None:
    import json
    import pickle
    raw, _ = mixed_window()
    path = {"gzip": lambda: write_gzip(tmp_path / "g", pickle.dumps(raw)),
            "zip": lambda: write_torch_zip(tmp_path / "z", pickle.dumps(raw, 2)),
            "json": lambda: write_json(tmp_path / "j", raw)}[container]()
    assert container in load(path).format.container or container == "zip"
    dt = replay(load(path))[0]
    ref = naive_replay(json.loads(json.dumps(raw)), 0)
    assert dt.active.tolist() == ref.active
    assert dt.reserved.tolist() == ref.reserved


# -- random traces against the reference (hypothesis) ------------------------------------------------------

SLOT = 8192
N_SLOTS = 8
EXTRA_BASE = BASE + 256 * MiB
EXTRA_SIZES = (2 * MiB, 20 * MiB, 22 * MiB, 4 * MiB)


@dataclass
class Truth:
    raw: dict[str, Any]
    baseline: int
    active: list[int]
    baseline_reserved: int
    reserved: list[int]
    end_live: Counter[tuple[int, int]]


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    skip = draw(st.sampled_from([None, None, "free_requested", "free_completed"]))
    pre_states = ["free", "live"] + ([] if skip == "free_completed" else ["pending"])
    pre = draw(st.lists(st.tuples(st.sampled_from(pre_states), st.integers(1, SLOT)),
                        min_size=N_SLOTS, max_size=N_SLOTS))
    pre_extras = draw(st.lists(st.booleans(), min_size=len(EXTRA_SIZES), max_size=len(EXTRA_SIZES)))
    ops = draw(st.lists(st.one_of(
        st.tuples(st.just("slot"), st.integers(0, N_SLOTS - 1), st.integers(1, SLOT), st.booleans()),
        st.tuples(st.just("segment"), st.integers(0, len(EXTRA_SIZES) - 1), st.just(0), st.booleans()),
    ), max_size=40))
    return {"skip": skip, "pre": pre, "pre_extras": pre_extras, "ops": ops}


def simulate(plan: dict[str, Any]) -> Truth:
    """Run an allocator model, recording the true active/reserved bytes after every trace entry."""
    skip = plan["skip"]
    state = [s for s, _ in plan["pre"]]
    req = [r if s != "free" else 0 for s, r in plan["pre"]]
    extras = list(plan["pre_extras"])
    expandable = [k % 2 == 1 for k in range(len(EXTRA_SIZES))]
    slot_addr = [BASE + i * SLOT for i in range(N_SLOTS)]

    def active() -> int:
        return sum(r for s, r in zip(state, req, strict=True) if s != "free")

    def reserved() -> int:
        return N_SLOTS * SLOT + sum(size for on, size in zip(extras, EXTRA_SIZES, strict=True) if on)

    baseline, baseline_reserved = active(), reserved()
    entries: list[dict[str, Any]] = []
    truth: list[tuple[int, int]] = []
    clock = [0]

    def emit(action: str, addr: int, size: int) -> None:
        clock[0] += 1
        entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                        "time_us": 1_000_000 + clock[0]})
        truth.append((active(), reserved()))

    for kind, k, size, flag in plan["ops"]:
        if kind == "segment":
            addr = EXTRA_BASE + k * 64 * MiB
            grow, shrink = (("segment_map", "segment_unmap") if expandable[k]
                            else ("segment_alloc", "segment_free"))
            extras[k] = not extras[k]
            emit(grow if extras[k] else shrink, addr, EXTRA_SIZES[k])
            continue
        if state[k] == "free":
            state[k], req[k] = "live", size
            emit("alloc", slot_addr[k], size)
        elif state[k] == "live":
            if skip == "free_completed" and not flag:
                state[k] = "stuck"  # requested, completion never happens before the snapshot
                emit("free_requested", slot_addr[k], req[k])
                continue
            state[k] = "pending"
            emit("free_requested", slot_addr[k], req[k])
            if flag:  # completed at once (no stream uses)
                state[k] = "free"
                emit("free_completed", slot_addr[k], req[k])
        elif state[k] == "pending":
            state[k] = "free"
            emit("free_completed", slot_addr[k], req[k])
        # "stuck": nothing more happens to that block

    # Drop the skipped action; when completions are dropped, each request (followed at once by its
    # completion) carries the state after the completion.
    kept_entries, kept_truth = [], []
    for e, t in zip(entries, truth, strict=True):
        if e["action"] == skip:
            if skip == "free_completed":
                kept_truth[-1] = t
            continue
        kept_entries.append(e)
        kept_truth.append(t)

    blocks = [{"address": slot_addr[i], "size": SLOT, "requested_size": req[i] if state[i] != "free" else 0,
               "state": {"free": "inactive", "live": "active_allocated"}.get(state[i], "active_pending_free"),
               "frames": []} for i in range(N_SLOTS)]
    segments = [{"device": 0, "address": BASE, "total_size": N_SLOTS * SLOT, "stream": 0,
                 "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
                 "blocks": blocks}]
    for k, on in enumerate(extras):
        if on:
            addr = EXTRA_BASE + k * 64 * MiB
            segments.append({"device": 0, "address": addr, "total_size": EXTRA_SIZES[k], "stream": 0,
                             "segment_type": "large", "segment_pool_id": (0, 0),
                             "is_expandable": expandable[k],
                             "blocks": [{"address": addr, "size": EXTRA_SIZES[k], "requested_size": 0,
                                         "state": "inactive", "frames": []}]})
    raw = {"segments": segments, "device_traces": [kept_entries]}
    end_live = Counter((slot_addr[i], req[i]) for i in range(N_SLOTS) if state[i] != "free")
    return Truth(raw, baseline, [a for a, _ in kept_truth], baseline_reserved, [r for _, r in kept_truth],
                 end_live)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_random_traces_match_the_reference_replay(plan: dict[str, Any]) -> None:
    truth = simulate(plan)
    tl = replay(to_snapshot(truth.raw, "random", "pickle"))
    dt = tl[0]
    ref = naive_replay(truth.raw, 0)
    # The reference replay agrees with the model that generated the trace …
    assert (ref.baseline_active, ref.active) == (truth.baseline, truth.active)
    assert (ref.baseline_reserved, ref.reserved) == (truth.baseline_reserved, truth.reserved)
    # … and the package agrees with both, event by event.
    assert dt.baseline_active == ref.baseline_active
    assert dt.active.tolist() == ref.active
    assert dt.baseline_reserved == ref.baseline_reserved
    assert dt.reserved.tolist() == ref.reserved
    assert end_live_set(dt) == truth.end_live == ref.live_end
    assert tl.check_invariants() == []


def test_address_order_is_a_stable_sort_by_address_on_both_paths():
    """Block events are paired by (address, index): packed keys where they fit in 64 bits, else argsort."""
    from snapanalyze.replay import _address_order, _member

    rng = np.random.default_rng(7)
    for low, high in ((0x7F00_0000_0000, 0x7F00_0000_0000 + (1 << 20)), (0, 1 << 63)):
        addr = rng.integers(low, high, size=5000, dtype=np.uint64)
        addr[::3] = addr[1::3][: len(addr[::3])]             # repeated addresses: order must keep the index order
        idx = np.flatnonzero(rng.random(len(addr)) < 0.8)
        np.testing.assert_array_equal(_address_order(addr, idx), idx[np.argsort(addr[idx], kind="stable")])
    pool = np.array([3, 5, 5, 9], dtype=np.uint64)
    assert _member(np.array([1, 3, 5, 6, 9, 10], dtype=np.uint64), pool).tolist() == \
        [False, True, True, False, True, False]
    assert _member(np.array([1], dtype=np.uint64), pool[:0]).tolist() == [False]
