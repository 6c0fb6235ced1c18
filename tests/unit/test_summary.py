"""summary: facts read off the file — an inferred torch version range that contains the real version,
events, actions, OOM entries, private pools — all JSON-ready."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE, REAL_FILES, SnapshotBuilder, range_contains, real_ids, version_from_name

from snapanalyze.analyze.summary import summarize
from snapanalyze.load import load
from snapanalyze.load.columns import to_snapshot

MiB = 1024 * 1024

# Files whose name carries no version: what PROVENANCE.md says about them.
PROVENANCE_VERSIONS = {
    "verl-vllm-graph-pools-state-only.pickle": [(2, 5), (2, 6), (2, 7)],
    "docubox-state-only.pickle": [(2, 5)],
}


def test_range_parser() -> None:
    assert range_contains("2.10–2.11", (2, 10)) and range_contains("2.10–2.11", (2, 11))
    assert not range_contains("2.10–2.11", (2, 9)) and not range_contains("2.5–2.7", (2, 10))
    assert range_contains("≥ 2.5", (2, 14)) and not range_contains("≥ 2.5", (2, 4))
    assert range_contains("2.0", (2, 0)) and not range_contains("2.0", (2, 1))
    assert not range_contains("unknown (contradictory fingerprint)", (2, 0))


# -- the real corpus ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", REAL_FILES, ids=real_ids(REAL_FILES))
def test_real_file_summary(path: Path, real_raw: dict[str, Any]) -> None:
    raw = real_raw[path.name]
    facts = summarize(load(path))
    json.dumps(facts.to_json())  # JSON-ready as is
    # The version range is inferred, says so, and contains the version the file was dumped with.
    v = facts.torch_version
    assert v.inferred is True
    assert v.evidence
    versions = [version_from_name(path)] if version_from_name(path) else PROVENANCE_VERSIONS[path.name]
    for version in versions:
        assert range_contains(v.range, version), (v.range, version)
    # Events and actions, counted from the raw file.
    traces = raw["device_traces"]
    [dev] = facts.devices
    assert dev.device == 0
    assert dev.events == (len(traces[0]) if traces else 0)
    assert dev.actions == dict(Counter(e["action"] for e in (traces[0] if traces else [])))
    assert dev.segments == len(raw["segments"])
    assert dev.reserved_bytes == sum(s["total_size"] for s in raw["segments"])
    assert dev.active_blocks == sum(b["state"] != "inactive" for s in raw["segments"] for b in s["blocks"])
    if traces and traces[0] and "time_us" in traces[0][0]:
        assert dev.duration_us == traces[0][-1]["time_us"] - traces[0][0]["time_us"]
    else:
        assert dev.duration_us is None
    # No OOM entries anywhere in the corpus; pools only in the verl file.
    assert facts.ooms == ()
    pools = sorted({",".join(map(str, s["segment_pool_id"])) for s in raw["segments"]
                    if s.get("segment_pool_id") not in (None, (0, 0))})
    assert list(facts.has.private_pools) == pools
    assert facts.has.legacy_block_history == (version_from_name(path) == (2, 0))
    assert facts.has.annotations == len(raw.get("external_annotations") or [])
    assert facts.unknown_actions == ()


def test_verl_private_pools() -> None:
    facts = summarize(load(next(p for p in REAL_FILES if p.name.startswith("verl"))))
    assert facts.has.private_pools == ("0,1", "0,2")
    assert facts.devices[0].ring_buffer == "no trace"


def test_stacks_all_files_have_cpp_frames() -> None:
    facts = summarize(load(next(p for p in REAL_FILES if "ctx128" in p.name)))
    assert facts.has.cpp_frames is True
    assert facts.has.frames is True


def test_legacy_files_are_state_only() -> None:
    facts = summarize(load(next(p for p in REAL_FILES if p.name == "flexgen-oom-t2.0.pickle")))
    assert facts.torch_version.range == "2.0"
    assert facts.devices[0].ring_buffer.startswith("state only")


# -- the fingerprint on built files -------------------------------------------------------------------------

def built(**kw: Any) -> SnapshotBuilder:
    b = SnapshotBuilder(**kw)
    b.segment(BASE, [(1024, 1000, "active_allocated"), (2 * MiB - 1024, 0, "inactive")])
    b.alloc(BASE, 1000)
    return b


def test_torch_2_11_shape() -> None:
    facts = summarize(to_snapshot(built().build(), "x", "pickle"))
    assert facts.torch_version.range == "2.10–2.11"


def test_pool_id_in_entries_means_2_12_or_later() -> None:
    b = built()
    for e in b.traces[0]:
        e["pool_id"] = (0, 0)
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert range_contains(facts.torch_version.range, (2, 12))
    assert not range_contains(facts.torch_version.range, (2, 11))


def test_annotate_entries_mean_2_14() -> None:
    b = built()
    b.event("annotate", 0, 0)
    for e in b.traces[0]:
        e["pool_id"] = (0, 0)   # 2.14 entries carry pool_id too
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert range_contains(facts.torch_version.range, (2, 14))
    assert not range_contains(facts.torch_version.range, (2, 13))


def test_bare_segment_list_is_pre_2_0_or_memory_snapshot() -> None:
    facts = summarize(to_snapshot(built().build()["segments"], "x", "pickle"))
    assert "1.13" in facts.torch_version.range
    assert facts.layout == "segment list"
    assert facts.has.trace is False


def test_contradictory_fingerprint_is_unknown_not_wrong() -> None:
    # No time_us (≤ 2.1) yet allocator_settings (≥ 2.3): no range is claimed.
    facts = summarize(to_snapshot(built(times=False).build(), "x", "pickle"))
    assert facts.torch_version.range.startswith("unknown")


def test_oom_entries_are_reported_with_device_free() -> None:
    b = built()
    oom = b.event("oom", None, 40 * MiB, stream=7, device_free=3 * MiB)
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert list(facts.ooms) == [{"device": 0, "index": 1, "size": 40 * MiB, "stream": 7, "device_free": 3 * MiB,
                              "time_us": oom["time_us"]}]
    assert facts.devices[0].actions == {"alloc": 1, "oom": 1}
    json.dumps(facts.to_json())


def test_oom_without_time_us_is_json_ready() -> None:
    b = built(times=False)
    b.event("oom", None, 40 * MiB, device_free=3 * MiB)
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert facts.ooms[0]["time_us"] is None
    json.dumps(facts.to_json())


def test_pools_expandable_devices_metadata_unknown_actions() -> None:
    b = built()
    b.segment(BASE + 2 * MiB, [(2 * MiB, 0, "inactive")], pool=(0, 1))
    b.segment(BASE + 4 * MiB, [(2 * MiB, 0, "inactive")], pool=(3, 0), device=1)
    b.event("segment_map", BASE + 8 * MiB, 2 * MiB, device=1)
    b.alloc(BASE + 2 * MiB, 10, user_metadata="step 3")
    b.event("brand_new_action", 0, 0)
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert facts.has.private_pools == ("0,1", "3,0")
    assert facts.has.expandable_segments is True
    assert [d.device for d in facts.devices] == [0, 1]
    assert [d.events for d in facts.devices] == [3, 1]
    assert facts.devices[1].actions == {"segment_map": 1}
    assert facts.has.user_metadata_entries == 1
    assert facts.unknown_actions == ("brand_new_action",)


def test_ring_buffer_notes() -> None:
    b = built()
    for _ in range(9999):
        b.event("snapshot", 0, 0)
    facts = summarize(to_snapshot(b.build(), "x", "pickle"))
    assert facts.devices[0].events == 10000
    assert facts.devices[0].ring_buffer.startswith("probably full")
    facts = summarize(to_snapshot(built().build(), "x", "pickle"))
    assert facts.devices[0].ring_buffer.startswith("state only")


SCENARIO_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"


def test_the_device_type_is_inferred_and_said_to_be() -> None:
    xpu = summarize(load(SCENARIO_DIR / "xpu_kv_weights.pickle")).device_type
    assert xpu.value == "xpu" and xpu.inferred and "PYTORCH_ALLOC_CONF" in xpu.evidence
    assert summarize(load(SCENARIO_DIR / "kv_weights_baseline.pickle")).device_type.value == "cuda"


def test_pinned_host_memory_is_described_apart_from_the_devices() -> None:
    facts = summarize(load(SCENARIO_DIR / "torch214_graph_pools_host.pickle"))
    assert [d.device for d in facts.devices] == [0]
    (host,) = facts.host
    assert host.device == "host" and host.segments == 4 and host.reserved_bytes == 256 * 1024 * 1024
    assert facts.torch_version.range == "≥ 2.14"
    assert summarize(load(SCENARIO_DIR / "kv_weights_baseline.pickle")).host is None


def test_the_summary_is_one_typed_result_that_every_target_renders() -> None:
    """`summarize` returns a frozen, picklable `Summary` (no dict to parse back): the JSON document is its
    `to_json()` (strict JSON, sequences as lists) and the terminal renders the object itself."""
    import dataclasses
    import pickle

    from snapanalyze.analyze.summary import Summary
    from snapanalyze.report.terminal import render_summary

    facts = summarize(load(SCENARIO_DIR / "torch214_graph_pools_host.pickle"))
    assert isinstance(facts, Summary) and pickle.loads(pickle.dumps(facts)) == facts
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.source = "elsewhere"  # type: ignore[misc]
    doc = json.loads(json.dumps(facts.to_json(), allow_nan=False))
    assert doc["devices"][0]["reserved_bytes"] == facts.devices[0].reserved_bytes
    assert doc["host"][0]["device"] == "host" and doc["torch_version"]["evidence"] == list(facts.torch_version.evidence)
    text = render_summary(facts)
    assert "pinned host memory (not device memory)" in text and f"device {facts.devices[0].device}:" in text
