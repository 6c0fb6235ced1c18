"""The caching-allocator simulator: each rule of the algorithm on a state computed by hand, replay agreement
on every shipped trace, the what-if answers of the fragmentation fixture, and the `whatif` command.

The rules follow c10/cuda/CUDACachingAllocator.cpp (2.2 @eb42ad6e, 2.5 @001074d2 and the late-2025 file) and
c10/core/AllocatorConfig.cpp; each expected value below is worked out in its comment, not read from the code.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, read_builtins

from snapanalyze import load, replay
from snapanalyze.allocator.settings import AllocatorSettings, MiB, of_snapshot, with_changes
from snapanalyze.allocator.state import Allocator, Driver, SegmentEvent
from snapanalyze.analyze.trace_replay import replay_device
from snapanalyze.analyze.whatif import whatif
from snapanalyze.errors import UsageError

FIXTURES = ROOT / "fixtures"
TRACES = sorted([*(FIXTURES / "scenarios").glob("*.pickle"), *(FIXTURES / "real").glob("*.pickle"),
                 *(FIXTURES / "runs").glob("*/rank=*/*.pickle"), *(FIXTURES / "whatif").glob("*.pickle")])
GiB = 1 << 30


class Device(Driver):
    """A device where PyTorch may reserve `capacity` bytes, handing out addresses from 0x1000_0000_0000."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.total = capacity
        self.next = 0x1000_0000_0000

    def reserve(self, n: int, reserved: int) -> int | None:
        if self.capacity is not None and reserved + n > self.capacity:
            return None
        return self.address_range(n)

    def map(self, n: int, reserved: int) -> bool:
        return self.capacity is None or reserved + n <= self.capacity

    def address_range(self, n: int) -> int:
        addr = self.next
        self.next += n + 2 * MiB
        return addr


def sim(capacity: int | None = None, **settings: object) -> Allocator:
    return Allocator(AllocatorSettings(**settings), Device(capacity))  # type: ignore[arg-type]


# -- rounding ---------------------------------------------------------------------------------------------------

def test_round_size_default_is_512_multiples() -> None:
    s = AllocatorSettings()
    assert s.round_size(1) == 512                       # below kMinBlockSize: 512
    assert s.round_size(512) == 512
    assert s.round_size(513) == 1024
    assert s.round_size(MiB + 1) == MiB + 512


def test_round_size_with_one_division_value() -> None:
    s = with_changes(AllocatorSettings(), ["roundup_power2_divisions:4"])
    assert s.roundup_power2_divisions == (4,) * 16
    # 1.2e9 B: floor power of two 2^30, step 2^30/4 = 256 MiB, 1.2e9 / 256 MiB = 4.47 → 5 steps = 1,342,177,280
    assert s.round_size(1_200_000_000) == 5 * 256 * MiB
    assert s.round_size(1 << 30) == 1 << 30             # a power of two is kept
    assert s.round_size(1500) == 1536                   # not above 512 × 4: plain 512 rounding


def test_round_size_with_the_list_syntax() -> None:
    s = with_changes(AllocatorSettings(), ["roundup_power2_divisions:[256:1,512:2,>:8]"])
    # 256 MB is interval 8: the first entry also fills 0…7 with 1; 512 is interval 9 → 2; ">" fills 10…15 with 8
    assert s.roundup_power2_divisions == (1,) * 9 + (2,) + (8,) * 6
    # 1.2e9 B is in interval 30 − 20 = 10 (8 divisions): step 2^30/8 = 128 MiB, 1.2e9 / 128 MiB = 8.94 → 9 steps
    assert s.round_size(1_200_000_000) == 9 * 128 * MiB
    # 600 MB is in interval 9 (2 divisions): step 2^29/2 = 256 MiB, 600,000,000 / 256 MiB = 2.24 → 3 steps
    assert s.round_size(600_000_000) == 3 * 256 * MiB


@pytest.mark.parametrize("change, message", [
    ("roundup_power2_divisions:3", "power of 2"),
    ("max_split_size_mb:10", "at least 20"),
    ("garbage_collection_threshold:1.0", "between 0 and 1"),
    ("expandable_segments:yes", "True or False"),
    ("no_such_setting:1", "unknown setting"),
])
def test_a_bad_setting_is_refused_by_name(change: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        with_changes(AllocatorSettings(), [change])


def test_settings_read_from_a_snapshot_and_written_back() -> None:
    recorded = {"max_split_size": 512 * MiB, "expandable_segments": False, "garbage_collection_threshold": 0.0,
                "roundup_power2_divisions": {"1": 0, "256": 4}}
    s = of_snapshot(recorded)
    assert s.max_split_size == 512 * MiB
    assert s.roundup_power2_divisions[8] == 4
    assert "max_split_size_mb:512" in s.conf()
    assert of_snapshot({"max_split_size": -1}).conf() == ""      # -1: unset


# -- pools, segments, splitting -----------------------------------------------------------------------------------

@pytest.mark.parametrize("request_size, pool_small, segment", [
    (MiB, True, 2 * MiB),                 # ≤ 1 MiB: the small pool, a 2 MiB segment
    (MiB + 1, False, 20 * MiB),           # rounded 1 MiB + 512: the large pool; below 10 MiB: a 20 MiB segment
    (10 * MiB - 512, False, 20 * MiB),
    (10 * MiB, False, 10 * MiB),          # ≥ 10 MiB: rounded up to 2 MiB
    (11 * MiB + 1, False, 12 * MiB),
])
def test_small_and_large_pool_boundary_and_segment_sizes(request_size: int, pool_small: bool, segment: int) -> None:
    a = sim()
    b = a.malloc(request_size, 0)
    assert b is not None and b.segment.small is pool_small
    assert [e.size for e in a.events] == [segment]


def test_a_cached_tail_serves_before_a_new_segment() -> None:
    a = sim()
    a.malloc(MiB + 1, 0)                               # a 20 MiB segment; its 18.99 MiB tail is cached
    b = a.malloc(10 * MiB, 0)                          # best fit: that tail, no new segment
    assert b is not None and len(a.events) == 1


def test_large_pool_splits_only_above_one_mib_remainder() -> None:
    a = sim()
    first = a.malloc(9 * MiB, 0)                       # a 20 MiB segment: remainder 11 MiB > 1 MiB, split
    assert first is not None and first.size == 9 * MiB
    assert first.next is not None and first.next.size == 11 * MiB and not first.next.allocated
    second = a.malloc(10 * MiB, 0)                     # takes the 11 MiB tail: remainder 1 MiB is not > 1 MiB
    assert second is not None and second.size == 11 * MiB and second.next is None
    assert len(a.events) == 1


def test_small_pool_splits_any_remainder_of_512() -> None:
    a = sim()
    first = a.malloc(MiB, 0)                           # 2 MiB segment: 1 MiB remainder ≥ 512, split
    second = a.malloc(MiB - 512, 0)                    # best fit: the 1 MiB tail; 512 left, split again
    assert first is not None and second is not None
    assert second.addr == first.addr + MiB and second.size == MiB - 512
    assert second.next is not None and second.next.size == 512
    assert len(a.events) == 1


def test_best_fit_takes_the_smallest_then_the_lowest_address() -> None:
    a = sim()
    x = [a.malloc(size, 0) for size in (40 * MiB, 30 * MiB, 30 * MiB)]
    assert all(b is not None for b in x)
    for b in x:
        a.free(b.addr)                                 # type: ignore[union-attr]
    got = a.malloc(25 * MiB, 0)                        # 30 MiB blocks fit better than 40; the lower of the two
    assert got is not None and got.addr == x[1].addr   # type: ignore[union-attr]


def test_free_merges_with_free_neighbours() -> None:
    a = sim()
    blocks = [a.malloc(20 * MiB, 0) for _ in range(1)]
    big = a.malloc(60 * MiB, 0)
    assert big is not None
    a.free(big.addr)
    p1, p2, p3 = (a.malloc(20 * MiB, 0) for _ in range(3))   # 60 MiB cut into three 20 MiB (remainders > 1 MiB)
    assert p1 and p2 and p3 and p2.addr == p1.addr + 20 * MiB and p3.addr == p2.addr + 20 * MiB
    a.free(p1.addr)
    a.free(p3.addr)
    merged = a.free(p2.addr)                           # the middle one joins both: one 60 MiB free block again
    assert merged is not None and merged.addr == p1.addr and merged.size == 60 * MiB and merged.whole
    assert blocks[0] is not None


# -- max_split_size ------------------------------------------------------------------------------------------------

def test_oversize_blocks_with_max_split_size() -> None:
    a = sim(max_split_size=40 * MiB)
    hundred = a.malloc(100 * MiB, 0)
    assert hundred is not None
    a.free(hundred.addr)                               # a cached 100 MiB block, oversize (≥ 40 MiB)
    small_request = a.malloc(30 * MiB, 0)              # below max_split: an oversize block is refused → new segment
    assert small_request is not None and small_request.addr != hundred.addr
    near = a.malloc(90 * MiB, 0)                       # ≥ max_split and 100 < 90 + 20: taken whole, not split
    assert near is not None and near.addr == hundred.addr and near.size == 100 * MiB
    a.free(near.addr)
    far = a.malloc(60 * MiB, 0)                        # 100 ≥ 60 + 20: refused → a new 60 MiB segment
    assert far is not None and far.addr != hundred.addr
    assert [e.size for e in a.events] == [100 * MiB, 30 * MiB, 60 * MiB]


def test_release_available_cached_blocks_frees_the_smallest_oversize_block_that_holds_the_key() -> None:
    a = sim(capacity=200 * MiB, max_split_size=40 * MiB)
    fifty, hundred = a.malloc(50 * MiB, 0), a.malloc(100 * MiB, 0)
    assert fifty and hundred
    a.free(fifty.addr)
    a.free(hundred.addr)                               # reserved 150 MiB, both cached and oversize
    got = a.malloc(60 * MiB, 0)                        # 100 ≥ 60 + 20: refused; cudaMalloc 60: 210 > 200 fails;
    assert got is not None                             # key max(60, 40) = 60 → the 100 MiB block goes back
    assert a.events[2:] == [SegmentEvent("segment_free", hundred.addr, 100 * MiB),
                            SegmentEvent("segment_alloc", got.addr, 60 * MiB)]
    assert a.reserved == 110 * MiB                     # the 50 MiB block stays cached


def test_release_cached_blocks_on_failure_frees_whole_segments_large_pool_first() -> None:
    a = sim(capacity=64 * MiB)
    small = a.malloc(4096, 0)                          # 2 MiB small segment
    big = a.malloc(40 * MiB, 0)                        # 40 MiB segment
    mid = a.malloc(15 * MiB, 0)                        # ≥ 10 MiB: a 16 MiB segment
    assert small and big and mid
    a.free(small.addr)
    a.free(big.addr)
    a.free(mid.addr)                                   # reserved 58 MiB, all whole and free
    got = a.malloc(50 * MiB, 0)                        # no block holds 50 MiB; 58 + 50 > 64 → release_cached_blocks
    assert got is not None
    # large pool in (stream, size, address) order: 16 MiB, then 40 MiB; then the small pool's 2 MiB
    assert [(e.action, e.size) for e in a.events[3:]] == [
        ("segment_free", 16 * MiB), ("segment_free", 40 * MiB), ("segment_free", 2 * MiB), ("segment_alloc", 50 * MiB)]


def test_out_of_memory_when_nothing_can_be_released() -> None:
    a = sim(capacity=40 * MiB)
    live = a.malloc(30 * MiB, 0)                       # a 30 MiB segment, live
    assert live is not None
    assert a.malloc(20 * MiB, 0) is None               # 30 + 20 > 40 and nothing is free
    assert [e.action for e in a.events] == ["segment_alloc"]


# -- expandable segments ---------------------------------------------------------------------------------------

def test_expandable_segments_map_pages_at_the_lowest_free_address_and_unmap_whole_pages() -> None:
    a = sim(capacity=1 << 40, expandable_segments=True)
    first = a.malloc(30 * MiB, 0)                      # 2 pages of 20 MiB mapped at the range's start; 10 MiB tail
    assert first is not None
    base = first.addr
    assert a.events == [SegmentEvent("segment_map", base, 40 * MiB)]
    second = a.malloc(25 * MiB, 0)                     # the free 10 MiB tail + 1 more page (15 MiB short → 20 MiB)
    assert second is not None and second.addr == base + 30 * MiB
    assert a.events[1] == SegmentEvent("segment_map", base + 40 * MiB, 20 * MiB)
    assert second.next is not None and second.next.size == 5 * MiB    # 60 − 55: split (expandable: ≥ 512)
    a.free(first.addr)                                 # free [0, 30 MiB): holds one whole page [0, 20)
    a.release_cached()
    assert a.events[2:] == [SegmentEvent("segment_unmap", base, 20 * MiB)]   # [55, 60) holds no whole page
    assert a.reserved == 40 * MiB


def test_expandable_segments_reuse_an_unmapped_hole_only_where_it_has_room() -> None:
    a = sim(capacity=1 << 40, expandable_segments=True)
    x, y = a.malloc(40 * MiB, 0), a.malloc(40 * MiB, 0)   # [0, 40) and [40, 80)
    assert x and y
    a.free(x.addr)
    a.release_cached()                                 # [0, 40) unmapped: a 40 MiB hole before y
    assert a.events[-1] == SegmentEvent("segment_unmap", x.addr, 40 * MiB)
    big = a.malloc(60 * MiB, 0)                        # the hole has 40 MiB of room: mapped after y instead
    assert big is not None and big.addr == x.addr + 80 * MiB
    fits = a.malloc(20 * MiB, 0)                       # the hole has room for 20: mapped at the lowest address
    assert fits is not None and fits.addr == x.addr
    assert a.events[-1] == SegmentEvent("segment_map", x.addr, 20 * MiB)


# -- graph pools ------------------------------------------------------------------------------------------------------

def test_private_pool_blocks_stay_apart_and_survive_the_oom_path() -> None:
    a = sim(capacity=64 * MiB)
    g = a.malloc(30 * MiB, 0, pool="1,0")               # a graph's private pool: its own 30 MiB segment
    assert g is not None
    a.free(g.addr)                                      # cached in the private pool
    d = a.malloc(30 * MiB, 0)                           # the default pool cannot use it: a new segment (60 MiB)
    assert d is not None and d.addr != g.addr
    assert a.malloc(10 * MiB, 0) is None               # 60 + 10 > 64; release_cached_blocks spares the graph's pool
    assert [e.action for e in a.events] == ["segment_alloc", "segment_alloc"]
    a.release_cached(freeable=["1,0"])                  # its graph released: the pool's segment goes back
    assert a.events[-1] == SegmentEvent("segment_free", g.addr, 30 * MiB)


def test_garbage_collection_frees_whole_blocks_at_least_as_old_as_the_mean() -> None:
    # fraction 0.5 of 200 MiB: limit 100 MiB; threshold 0.5 → collect when reserved > 50 MiB. Age: large-pool
    # free-block searches since the block was cached (each malloc below is one search: c1, c2, …).
    a = Allocator(AllocatorSettings(garbage_collection_threshold=0.5, memory_fraction=0.5), Device(200 * MiB))
    x = a.malloc(20 * MiB, 0)                           # c1: a 20 MiB segment
    y = a.malloc(12 * MiB, 0)                           # c2: 12 MiB
    z = a.malloc(24 * MiB, 0)                           # c3: 24 MiB; reserved 56 MiB
    assert x and y and z
    a.free(x.addr)                                      # x cached at c3
    for _ in range(4):                                  # c4…c7: y's exact block is found again each time
        a.free(y.addr)
        y = a.malloc(12 * MiB, 0)
        assert y is not None
    a.free(z.addr)                                      # z cached at c7
    got = a.malloc(30 * MiB, 0)                         # c8: no fit → GC: reserved 56 > 50, target 6 MiB; ages
    assert got is not None                              # x 5, z 1, mean 3: x goes (20 ≥ 6 reclaimed), z stays
    freed = [e for e in a.events if e.action == "segment_free"]
    assert freed == [SegmentEvent("segment_free", x.addr, 20 * MiB)]
    assert a.reserved == 12 * MiB + 24 * MiB + 30 * MiB


def test_garbage_collection_is_inert_without_a_memory_fraction() -> None:
    a = Allocator(AllocatorSettings(garbage_collection_threshold=0.5), Device(200 * MiB))
    x = a.malloc(60 * MiB, 0)
    assert x is not None
    a.free(x.addr)
    assert a.malloc(70 * MiB, 0) is not None            # no fraction: nothing is collected, 130 MiB reserved
    assert not [e for e in a.events if e.action == "segment_free"] and a.reserved == 130 * MiB


# -- replay against recorded traces ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", TRACES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_replay_reproduces_every_segment_event_and_address(path: Path) -> None:
    snap = load(path, frames=False)
    timeline = replay(snap)
    traced = [d for d in snap.devices if len(snap.trace(d))]
    if not traced:
        pytest.skip("a state-only file: no trace to replay")
    for device in traced:
        r = replay_device(snap, timeline, device)
        assert r.first_divergence is None, r.first_divergence
        assert r.matched == r.segment_events
        assert r.addresses_matched == r.allocations
        assert r.reserved_equal


def test_replay_names_the_first_divergence_when_the_settings_were_not_what_the_file_says(tmp_path: Path) -> None:
    raw = read_builtins(FIXTURES / "scenarios" / "oom_fragmentation.pickle")
    raw["allocator_settings"]["roundup_power2_divisions"] = {str(1 << i): 8 for i in range(16)}
    path = tmp_path / "claims_divisions.pickle"
    path.write_bytes(pickle.dumps(raw))
    snap = load(path, frames=False)
    r = replay_device(snap, replay(snap), 0)
    assert r.first_divergence is not None
    assert r.first_divergence.kind in ("segment_differs", "address", "simulation_reserved", "trace_reserved")
    assert r.matched < r.segment_events or r.addresses_matched < r.allocations


def test_generated_benchmark_trace_replays_exactly(tmp_path: Path) -> None:
    out = tmp_path / "bench.pickle"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "generate.py"), "--events", "20000", "-o", str(out)],
                   check=True, capture_output=True)
    snap = load(out, frames=False)
    r = replay_device(snap, replay(snap), 0)
    assert r.segment_events > 0 and r.matched == r.segment_events and r.first_divergence is None


# -- what-if: the fragmentation fixture --------------------------------------------------------------------------------

EXPECTED = json.loads((FIXTURES / "whatif" / "fragmentation.expected.json").read_text())


def _fragmentation(changes: list[str]):  # type: ignore[no-untyped-def]
    return whatif(load(FIXTURES / "whatif" / "fragmentation.pickle"), changes=changes).devices[0].whatif


def test_fragmentation_fixture_fails_under_its_recorded_settings() -> None:
    w = _fragmentation(["max_split_size_mb:200"])
    assert w.capacity == EXPECTED["capacity"] and w.capacity_source == "oom"
    (oom,) = w.baseline.ooms
    exp = EXPECTED["recorded"]
    assert oom.index == EXPECTED["oom_index"] and oom.request == EXPECTED["request"]
    assert (oom.served, oom.reserved, oom.largest_free) == (exp["served"], exp["reserved"], exp["largest_free"])


def test_fragmentation_fixture_expandable_segments_serve_the_request() -> None:
    w = _fragmentation(["expandable_segments:True"])
    exp = EXPECTED["whatif"]["expandable_segments:True"]
    (oom,) = w.changed.ooms
    assert oom.served is exp["served"] and oom.reserved == exp["reserved"]
    assert w.changed.stop is not None and w.changed.stop.kind == "oom_served"
    assert w.changed.stop.index == EXPECTED["oom_index"]


def test_fragmentation_fixture_max_split_size_does_not() -> None:
    w = _fragmentation(["max_split_size_mb:200"])
    exp = EXPECTED["whatif"]["max_split_size_mb:200"]
    (oom,) = w.changed.ooms
    assert (oom.served, oom.reserved, oom.largest_free) == (exp["served"], exp["reserved"], exp["largest_free"])
    assert w.changed.stop is None


def test_capacity_given_overrides_the_oom_and_unbounded_serves_everything() -> None:
    snap = load(FIXTURES / "whatif" / "fragmentation.pickle")
    w = whatif(snap, changes=["max_split_size_mb:200"], capacity=GiB).devices[0].whatif
    assert w is not None and w.capacity_source == "given" and w.baseline.ooms[0].served


# -- the command -----------------------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True, cwd=ROOT)


def test_the_starting_state_joins_a_large_blocks_unsplit_remainder_and_nothing_else() -> None:
    """The state at the window's start, cut into blocks: a free gap of at most 1 MiB right after a live block of
    a large-pool segment is that block's unsplit remainder (a free large-pool block is never that small), so it
    joins the block; a small pool's gap stays a free block (it splits any remainder ≥ 512 B), and so does a
    gap in front of a segment or one larger than 1 MiB."""
    from conftest import BASE, SnapshotBuilder

    from snapanalyze.analyze.trace_replay import start_state
    from snapanalyze.load.columns import to_snapshot

    b = SnapshotBuilder()
    b.segment(BASE, [(10 * MiB, 10 * MiB, "active_allocated"), (MiB // 2, 0, "inactive"),
                     (5 * MiB, 5 * MiB, "active_allocated"), (9 * MiB // 2, 0, "inactive")])
    b.segment(BASE + 64 * MiB, [(MiB, MiB, "active_allocated"), (MiB, MiB, "active_allocated")])
    b.segment(BASE + 128 * MiB, [(MiB // 2, 0, "inactive"), (39 * MiB // 2, 39 * MiB // 2, "active_allocated")])
    b.alloc(BASE + 64 * MiB + MiB, MiB)             # allocated in the window: free at its start
    snap = to_snapshot(b.build(), "start.pickle", "pickle")
    start = start_state(snap, replay(snap), 0)
    blocks = {seg[0]: list(zip(*(col[start.first[j]:start.first[j + 1]] for col in start.blocks)))
              for j, seg in enumerate(start.segments)}
    assert blocks[BASE] == [(0, 21 * MiB // 2, 10 * MiB), (21 * MiB // 2, 5 * MiB, 5 * MiB),
                            (31 * MiB // 2, 9 * MiB // 2, 0)]
    assert blocks[BASE + 64 * MiB] == [(0, MiB, MiB), (MiB, MiB, 0)]
    assert blocks[BASE + 128 * MiB] == [(0, MiB // 2, 0), (MiB // 2, 39 * MiB // 2, 39 * MiB // 2)]
    assert [(seg[4], seg[5]) for seg in start.segments] == [(False, False), (True, False), (False, False)]


def test_whatif_command_json_carries_replay_and_prediction() -> None:
    r = _cli("whatif", "fixtures/whatif/fragmentation.pickle", "--set", "expandable_segments:True", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    dev = doc["devices"][0]
    assert dev["replay"]["segment_events"] == 5 and dev["replay"]["matched"] == 5
    assert dev["replay"]["first_divergence"] is None
    assert dev["whatif"]["changed"]["ooms"][0]["served"] is True
    assert dev["whatif"]["recorded"]["ooms"][0]["served"] is False
    assert doc["settings"] == "expandable_segments:True"


def test_whatif_command_says_a_state_only_file_has_nothing_to_simulate() -> None:
    r = _cli("whatif", "fixtures/real/docubox-state-only.pickle")
    assert r.returncode == 0, r.stderr
    assert "no trace" in r.stdout and "nothing" not in r.stderr


def test_whatif_command_refuses_a_bad_setting_in_one_line() -> None:
    r = _cli("whatif", "fixtures/whatif/fragmentation.pickle", "--set", "max_split_size_mb:abc")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("snapanalyze: error:") and "max_split_size_mb" in r.stderr
    assert "Traceback" not in r.stderr


def test_sorted_keys_agree_with_a_sorted_list_under_random_inserts_and_removals() -> None:
    import random

    from snapanalyze.allocator.state import SortedKeys

    rng = random.Random(7)
    keys, ref = SortedKeys(), []
    for step in range(20_000):
        if ref and rng.random() < 0.45:
            k = ref.pop(rng.randrange(len(ref)))
            keys.discard(k)
        else:
            k = (rng.randrange(3), rng.randrange(5000), step)
            ref.append(k)
            keys.add(k)
        if step % 997 == 0:
            ref.sort()
            assert list(keys) == ref and len(keys) == len(ref)
            probe = (1, rng.randrange(5000), -1)
            pos = keys.ceiling(probe)
            first = next((r for r in ref if r >= probe), None)
            assert (keys.at(pos) if pos is not None else None) == first


def test_the_terminal_renders_the_typed_result_the_json_serialises() -> None:
    """`whatif` returns one frozen, picklable `WhatIf`; the terminal renders that object and the JSON is its
    `to_json()`: the same figures in both, with no document parsed back."""
    from snapanalyze.report.whatif_terminal import render_whatif
    from snapanalyze.units import fmt_bytes

    result = whatif(load(FIXTURES / "scenarios" / "oom_fragmentation.pickle"), changes=["expandable_segments:True"])
    assert pickle.loads(pickle.dumps(result)) == result
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    text = render_whatif(result)
    (device,) = result.devices
    assert device.whatif is not None
    changed = device.whatif.changed
    assert doc["devices"][0]["whatif"]["changed"]["reserved_peak"] == changed.reserved_peak
    assert f"what if {changed.settings}:" in text and fmt_bytes(changed.reserved_peak) in text
    assert f"{device.replay.matched:,} of {device.replay.segment_events:,}" in text


def test_settings_newer_than_the_files_torch_are_named() -> None:
    """expandable segments and the list syntax of roundup_power2_divisions came in torch 2.1,
    max_non_split_rounding_mb in 2.5; a what-if of a file an older torch wrote says so, certain where every
    version its keys allow is older, and stays silent for settings that torch already had."""
    from snapanalyze.allocator.settings import requirements
    from snapanalyze.report.whatif_terminal import render_whatif

    base = AllocatorSettings()
    assert requirements(base, with_changes(base, ["max_split_size_mb:512"])) == ()
    assert requirements(base, with_changes(base, ["roundup_power2_divisions:4"])) == ()
    assert requirements(base, with_changes(base, ["expandable_segments:True,max_non_split_rounding_mb:64"])) == (
        ("expandable_segments:True", (2, 1)), ("max_non_split_rounding_mb:64", (2, 5)))
    assert requirements(base, with_changes(base, ["roundup_power2_divisions:[256:1,>:4]"]))[0][1] == (2, 1)

    old = load(FIXTURES / "real" / "flexgen-oom-t2.0.pickle")          # legacy block history: torch <= 2.0
    result = whatif(old, changes=["expandable_segments:True"])
    (need,) = result.requires
    assert (need.setting, need.since, need.file_torch, need.certain) == ("expandable_segments:True", "2.1", "2.0",
                                                                         True)
    assert json.loads(json.dumps(result.to_json()))["requires"][0]["since"] == "2.1"
    assert ("note: expandable_segments:True needs torch ≥ 2.1; this file was written by torch 2.0 (inferred from "
            "its keys): what follows is this program on torch ≥ 2.1") in render_whatif(result)
    assert whatif(old, changes=["max_split_size_mb:512"]).requires == ()
    new = load(FIXTURES / "real" / "cs336-step-user-metadata-t2.11.pickle")
    assert whatif(new, changes=["expandable_segments:True"]).requires == ()


def test_oom_advice_says_when_its_setting_needs_a_newer_torch() -> None:
    """A fragmentation OOM in a file shaped as torch 2.0–2.1 wrote them (no time stamps, allocator settings,
    annotations, compile context or user metadata): the expandable-segments advice says it needs 2.1, which the
    file's torch may predate."""
    from conftest import BASE, SnapshotBuilder

    from snapanalyze.analyze.oom import explain_oom
    from snapanalyze.load.columns import to_snapshot
    from snapanalyze.report import oom_text

    builder = SnapshotBuilder(times=False, allocator_settings=None)
    builder.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive"),
                           (4 * MiB, 4 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive")])
    builder.event("oom", None, 10 * MiB, device_free=1 * MiB)
    raw = builder.build()
    del raw["external_annotations"]
    for entry in raw["device_traces"][0]:
        del entry["compile_context"], entry["user_metadata"]
    explanation = explain_oom(to_snapshot(raw, "old.pickle", "pickle"))
    (verdict,) = explanation.verdicts
    assert verdict.verdict == "fragmentation"
    (words,) = [w for w in oom_text.advice(verdict) if w.startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments")]
    assert ("(needs torch ≥ 2.1; this file was written by torch 2.0–2.1, inferred from its keys, which may be "
            "older)") in words
