"""Segment map: every reserved byte laid out once, the OOM's numbers visible, estimated layouts said so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import load, replay
from snapanalyze.analyze.oom import explain_oom
from snapanalyze.analyze.segment_map import segment_map

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
RUNS = SCENARIOS.parent / "runs"
MiB = 1 << 20
BASE = 0x7F00_0000_0000


def assert_tiles(smap) -> None:  # type: ignore[no-untyped-def]
    """Each segment's pieces run from 0 to its size without gap or overlap."""
    sizes = smap.segments.set_index("address")["size"]
    for address, part in smap.pieces.groupby("segment_address"):
        offsets, lengths = part["offset"].to_numpy(), part["size"].to_numpy()
        assert offsets[0] == 0 and np.all(offsets[1:] == offsets[:-1] + lengths[:-1])
        assert int(lengths.sum()) == int(sizes[address])
    assert set(smap.pieces["segment_address"]) == set(smap.segments["address"])


def test_the_map_at_an_oom_shows_what_explain_oom_decided() -> None:
    for path in (SCENARIOS / "oom_fragmentation.pickle", SCENARIOS / "oom_live_exhaustion.pickle",
                 RUNS / "oom_other_process"):
        snap = load(path)
        timeline = replay(snap)
        for row in explain_oom(snap, timeline).ooms.itertuples():
            smap = segment_map(snap, timeline, int(row.device), int(row.index), int(row.request_bytes),
                               int(row.stream))
            assert smap.exact == bool(row.exact)
            assert smap.reserved_bytes == int(row.reserved_bytes)
            assert smap.free_bytes == int(row.reserved_free_bytes)
            assert smap.largest_free_any_bytes == int(row.largest_free_block_any_bytes)
            largest = smap.largest_free.size if smap.largest_free is not None else 0
            assert largest == int(row.largest_free_block_bytes)
            assert_tiles(smap)
            if row.verdict == "fragmentation":     # visible: no usable piece fits, the free pieces together would
                assert largest < smap.request_bytes <= smap.free_bytes + int(row.device_free_bytes)


def test_a_map_between_events_is_laid_out_from_the_replay_and_says_so() -> None:
    snap = load(SCENARIOS / "oom_fragmentation.pickle")
    timeline = replay(snap)
    dt = timeline[0]
    for index in (-1, 10, len(dt) // 2):
        smap = segment_map(snap, timeline, 0, index)
        assert not smap.exact and "estimated" in smap.source
        assert smap.reserved_bytes == dt.reserved_at(index)
        used = smap.segments[["active_bytes", "pending_free_bytes"]].to_numpy().sum()
        assert int(used) == dt.allocated_est_at(index)
        assert smap.unplaced_blocks == 0
        assert_tiles(smap)


def test_states_of_the_end_state_are_kept(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive"),
                     (2 * MiB, 2 * MiB, "active_pending_free"), (8 * MiB, 8 * MiB, "inactive")])
    b.segment(BASE + (1 << 32), [(2 * MiB, 2 * MiB, "inactive")], stream=7)
    snap = load(write_pickle(tmp_path / "s.pickle", b.build(n_devices=1)))
    timeline = replay(snap)
    smap = segment_map(snap, timeline, 0, -1, request=10 * MiB, stream=0)
    assert smap.exact
    first = smap.pieces[smap.pieces["segment_address"] == BASE]
    assert first["state"].astype(str).tolist() == ["active", "inactive", "pending_free", "inactive"]
    assert first["offset"].tolist() == [0, 4 * MiB, 10 * MiB, 12 * MiB]
    row = smap.segments.set_index("address").loc[BASE]
    assert (row["active_bytes"], row["pending_free_bytes"], row["inactive_bytes"]) == (4 * MiB, 2 * MiB, 14 * MiB)
    assert smap.largest_free is not None and (smap.largest_free.offset, smap.largest_free.size) == (12 * MiB, 8 * MiB)
    # a small request: stream 7's small segment is not usable on stream 0, nor the large pool; on stream 7 it is
    other = segment_map(snap, timeline, 0, -1, request=MiB // 2, stream=0)
    assert other.largest_free is None and other.largest_free_any_bytes == 8 * MiB
    seven = segment_map(snap, timeline, 0, -1, request=MiB // 2, stream=7)
    assert seven.largest_free is not None and seven.largest_free.size == 2 * MiB


def test_segments_freed_later_are_back_and_made_later_are_gone(tmp_path: Path) -> None:
    b = SnapshotBuilder(frames=False)
    b.segment(BASE, [(20 * MiB, 20 * MiB, "inactive")])          # the end state: one segment, free
    b.event("segment_alloc", BASE + (1 << 32), 40 * MiB)         # 0: a segment made …
    b.alloc(BASE + (1 << 32), 30 * MiB)                           # 1
    b.free(BASE + (1 << 32), 30 * MiB)                            # 2–3
    b.event("segment_free", BASE + (1 << 32), 40 * MiB)          # 4: … and released
    b.event("segment_alloc", BASE, 20 * MiB)                      # 5: the end state's segment is made here
    snap = load(write_pickle(tmp_path / "g.pickle", b.build(n_devices=1)))
    timeline = replay(snap)
    at = segment_map(snap, timeline, 0, 1)
    assert at.segments["address"].tolist() == [BASE + (1 << 32)]
    assert at.pieces["state"].astype(str).tolist() == ["active", "inactive"]
    assert at.pieces["size"].tolist() == [30 * MiB, 10 * MiB]
    assert segment_map(snap, timeline, 0, 5).segments["address"].tolist() == [BASE]
