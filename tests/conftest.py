"""Shared test helpers: a builder for snapshot dicts in torch 2.11 shape, file writers for every container,
a trusted reader for the real corpus, and a naive dict-based reference replay to check the package against.

Import the helpers with `from conftest import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
import sys
import zipfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from support import read_builtins  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REAL_DIR = ROOT / "fixtures" / "real"
REAL_FILES = sorted(REAL_DIR.glob("*.pickle"))
ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")

BASE = 0x7F00_0000_0000          # a typical CUDA VA, above 2**46
SMALL_SEGMENT = 2 * 1024 * 1024  # 2 MiB


def real_ids(paths: Iterable[Path]) -> list[str]:
    return [p.name for p in paths]


def version_from_name(path: Path) -> tuple[int, int] | None:
    """The torch version a corpus file was dumped with, from its name (…-t2.11.pickle → (2, 11))."""
    m = re.search(r"-t(\d+)\.(\d+)\.pickle$", path.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def range_contains(rng: str, version: tuple[int, int]) -> bool:
    """Whether a summary range ('2.10–2.11', '≥ 2.5', '2.0') contains `version`."""
    rng = rng.strip()
    if m := re.fullmatch(r"≥ (\d+\.\d+)", rng):
        return version >= parse_version(m.group(1))
    if m := re.fullmatch(r"(\d+\.\d+)–(\d+\.\d+)", rng):
        return parse_version(m.group(1)) <= version <= parse_version(m.group(2))
    if re.fullmatch(r"\d+\.\d+", rng):
        return version == parse_version(rng)
    return False


# -- reading the trusted corpus independently of the package ---------------------------------------------

def read_fixture_raw(path: Path) -> Any:
    """The raw builtins of a corpus file, read with the standard library only (no snapanalyze code)."""
    return read_builtins(path)


# -- building snapshots -----------------------------------------------------------------------------------

def frames_for(name: str, line: int = 1) -> list[dict[str, Any]]:
    """A short Python stack, innermost first."""
    return [{"filename": "/app/model.py", "line": line, "name": name},
            {"filename": "/app/train.py", "line": 10, "name": "main"}]


@dataclass
class SnapshotBuilder:
    """Makes snapshot dicts shaped like torch 2.11's `_snapshot()`.

    `segment(...)` lays out blocks that tile the segment exactly (addresses by running sum) and returns
    their addresses; `event(...)` appends a trace entry to a device's trace. `build()` returns the dict.
    """

    times: bool = True
    frames: bool = True
    t0: int = 1_770_000_000_000_000
    segments: list[dict[str, Any]] = field(default_factory=list)
    traces: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    allocator_settings: dict[str, Any] | None = field(default_factory=lambda: {
        "PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1, "expandable_segments": False,
        "garbage_collection_threshold": 0.0, "roundup_power2_divisions": {"1": 0, "2": 0}})
    _clock: int = 0

    def segment(self, address: int, blocks: list[tuple[int, int, str]], device: int = 0,
                pool: tuple[int, int] = (0, 0), expandable: bool = False, stream: int = 0,
                segment_type: str | None = None) -> list[int]:
        """blocks: (size, requested_size, state) in address order. Returns the block addresses."""
        out, rows, offset = [], [], address
        for size, requested, state in blocks:
            active = state in ACTIVE_STATES
            rows.append({"address": offset, "size": size, "requested_size": requested, "state": state,
                         "frames": frames_for("alloc_site") if (active and self.frames) else []})
            out.append(offset)
            offset += size
        total = offset - address
        allocated = sum(b["size"] for b in rows if b["state"] == "active_allocated")
        self.segments.append({
            "device": device, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": sum(b["size"] for b in rows if b["state"] in ACTIVE_STATES),
            "requested_size": sum(b["requested_size"] for b in rows if b["state"] in ACTIVE_STATES),
            "stream": stream,
            "segment_type": segment_type or ("small" if total <= SMALL_SEGMENT else "large"),
            "segment_pool_id": pool, "is_expandable": expandable, "frames": [], "blocks": rows,
        })
        return out

    def event(self, action: str, addr: int | None, size: int, device: int = 0, stream: int = 0,
              **extra: Any) -> dict[str, Any]:
        self._clock += 1
        e: dict[str, Any] = {"action": action}
        if addr is not None:
            e["addr"] = addr
        e.update(size=size, stream=stream)
        if self.times:
            e["time_us"] = self.t0 + 1000 * self._clock
        e.update(compile_context="N/A", user_metadata="")
        if self.frames:
            e["frames"] = frames_for(action, self._clock)
        e.update(extra)
        self.traces.setdefault(device, []).append(e)
        return e

    def alloc(self, addr: int, size: int, **kw: Any) -> None:
        self.event("alloc", addr, size, **kw)

    def free(self, addr: int, size: int, **kw: Any) -> None:
        """free_requested then free_completed, as torch writes them for a block without stream uses."""
        self.event("free_requested", addr, size, **kw)
        self.event("free_completed", addr, size, **kw)

    def build(self, n_devices: int | None = None) -> dict[str, Any]:
        devices = set(self.traces) | {s["device"] for s in self.segments}
        n = n_devices if n_devices is not None else (max(devices) + 1 if devices else 0)
        snap: dict[str, Any] = {
            "segments": self.segments,
            "device_traces": [list(self.traces.get(d, [])) for d in range(n)],
            "allocator_settings": self.allocator_settings,
            "external_annotations": [],
        }
        if self.allocator_settings is None:
            del snap["allocator_settings"]
        return snap


# -- writing files in every container ---------------------------------------------------------------------

def write_pickle(path: Path, obj: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def write_gzip(path: Path, payload: bytes) -> Path:
    path.write_bytes(gzip.compress(payload))
    return path


def write_torch_zip(path: Path, payload: bytes) -> Path:
    """The layout `torch.save` writes: archive/data.pkl, archive/version (and byteorder)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    path.write_bytes(buf.getvalue())
    return path


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


# -- the naive reference replay ---------------------------------------------------------------------------

@dataclass
class Reference:
    baseline_active: int
    active: list[int]              # after each event
    baseline_reserved: int
    reserved: list[int]
    live_end: Counter[tuple[int, int]]   # (addr, requested size) live after the last event


def end_active_blocks(raw: Any, device: int) -> Counter[tuple[int, int]]:
    """(address, requested size) of every active block of `device` in a raw snapshot's segments."""
    segments = raw["segments"] if isinstance(raw, dict) else raw
    out: Counter[tuple[int, int]] = Counter()
    for seg in segments:
        if int(seg.get("device", 0)) != device:
            continue
        offset = int(seg["address"])
        for b in seg["blocks"]:
            addr = int(b["address"]) if "address" in b else offset
            offset += int(b["size"])
            if b["state"] in ACTIVE_STATES:
                req = b.get("requested_size")
                if req is None:
                    req = b["history"][-1]["real_size"]
                out[(addr, int(req))] += 1
    return out


def end_pending_addrs(raw: Any, device: int) -> set[int]:
    """Addresses of blocks whose free was requested but not completed when the snapshot was taken."""
    segments = raw["segments"] if isinstance(raw, dict) else raw
    out = set()
    for seg in segments:
        offset = int(seg["address"])
        for b in seg["blocks"]:
            addr = int(b["address"]) if "address" in b else offset
            offset += int(b["size"])
            if int(seg.get("device", 0)) == device and b["state"] in ACTIVE_STATES[1:]:
                out.add(addr)
    return out


def naive_replay(raw: Any, device: int) -> Reference:
    """Replay one device with plain dicts, the way the format notes describe a correct replay.

    Active bytes fall at free_completed, or at free_requested in a trace without any free_completed
    (skip_actions). A free at an address with no live alloc is a block from before the window.
    """
    segments = raw["segments"] if isinstance(raw, dict) else raw
    traces = (raw.get("device_traces") or []) if isinstance(raw, dict) else []
    trace = traces[device] if device < len(traces) else []
    falls = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    end_blocks = end_active_blocks(raw, device)
    # Without any free_completed, a free_requested that is the last word on a block still pending in the
    # end state did not end it: its completion had not happened yet.
    last_at: dict[int, int] = {e["addr"]: i for i, e in enumerate(trace) if "addr" in e}
    pending = end_pending_addrs(raw, device)
    still_pending = {i for a, i in last_at.items()
                     if a in pending and falls == "free_requested" and trace[i]["action"] == falls}
    trace = [e if i not in still_pending else {**e, "action": "free_requested (pending)"}
             for i, e in enumerate(trace)]

    # Pass 1: blocks freed in the window without an alloc in it, and allocations still live at the end.
    live: dict[int, int] = {}
    pre_freed = 0
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == falls:
            if e["addr"] in live:
                del live[e["addr"]]
            else:
                pre_freed += e["size"]
    live_throughout = sum(r for (a, r), k in end_blocks.items() for _ in range(k) if a not in live)
    baseline = pre_freed + live_throughout

    # Pass 2: the curve, event by event.
    cur, curve, live = baseline, [], {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif e["action"] == falls:
            cur -= live.pop(e["addr"], e["size"])
        curve.append(cur)

    end_live: Counter[tuple[int, int]] = Counter(
        {(a, r): k for (a, r), k in end_blocks.items() if a not in live})
    end_live.update((a, s) for a, s in live.items())

    grow = ("segment_alloc", "segment_map")
    shrink = ("segment_free", "segment_unmap")
    net = sum(e["size"] if e["action"] in grow else -e["size"] if e["action"] in shrink else 0 for e in trace)
    end_reserved = sum(int(s["total_size"]) for s in segments if int(s.get("device", 0)) == device)
    res, reserved = end_reserved - net, []
    baseline_reserved = res
    for e in trace:
        if e["action"] in grow:
            res += e["size"]
        elif e["action"] in shrink:
            res -= e["size"]
        reserved.append(res)
    return Reference(baseline, curve, baseline_reserved, reserved, end_live)


# -- fixtures ---------------------------------------------------------------------------------------------

@pytest.fixture
def builder() -> SnapshotBuilder:
    return SnapshotBuilder()


@pytest.fixture(scope="session")
def real_raw() -> dict[str, Any]:
    """Raw builtins of every corpus file, read once per session (keyed by file name)."""
    return {p.name: read_fixture_raw(p) for p in REAL_FILES}


# -- options ----------------------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite the golden files under tests/integration/golden/ from the current output instead of "
                          "comparing against them.")
