"""Compare two snapshots (or runs): aligned peaks, and what changed at the peak by category and by stack.

Contract: `diff(a, b)` attributes both snapshots at the same kind of instant — the global peak of each
device both share, or, with `phase=NAME`, the peak inside that phase span of each — and compares them.
Peaks are aligned globally and, for every phase both snapshots have, per phase; with `phase=NAME` only that
phase's peaks are listed. Phases are `phases.phase_table`'s spans (record_function annotations,
user_metadata values and, given each side's `markers`, the collector's phases and requests), named by their
label as `snapanalyze phases` prints it (a name used n times becomes `name#1` … `name#n`).
Per category and per stack it gives the bytes live at the instant in A and B, split into baseline (allocated
before the window — the trace, or the phase — began) and transient (allocated inside it). A stack's identity
across two files is the tuple of its frames' (filename, function) — line numbers are ignored, so an edit
that only moves code changes nothing — never the stack id. Rows whose bytes are equal are "same"; `Diff`
exposes only changed rows in `changes()`, so a snapshot diffed with itself has none.

Phases: `phases.phase_table` labels the spans so both sides line up (`phases.find_phase` resolves `phase`);
windows are measured with `phases.window_peak`.

DataFrame columns:
- `Diff.peaks`: device, scope ("global" | "phase"), phase, event_index_a/_b, active_bytes_a/_b,
  baseline_bytes_a/_b, transient_bytes_a/_b, reserved_bytes_a/_b, delta_active_bytes, delta_baseline_bytes,
  delta_transient_bytes, delta_reserved_bytes.
- `Diff.categories`: device, category, bytes_a, bytes_b, delta_bytes, baseline_bytes_a/_b,
  transient_bytes_a/_b, blocks_a, blocks_b.
- `Diff.stacks`: device, stack (12 hex digits of the frames' hash), status (new | vanished | grew |
  shrank | same), category_a, category_b, site (deciding frame of the largest block, from B when present),
  frames (Python frames "file:function", innermost first, up to 8), bytes_a, bytes_b, delta_bytes,
  transient_bytes_a/_b, blocks_a, blocks_b, matched ("stack": the same frames, files and functions; "site": a
  stack new in B paired with one vanished from A that share their site and category — the program's script
  moved — a fuzzy match said as such); then what `site` and `frames` show, as values a renderer labels
  (`REF_COLUMNS`): site_ref (a `sites.Site`, None: no frames) and frame_refs (a tuple of Sites, or of the one
  text "(no Python frames)" / "(no frames)").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..model import Snapshot
from ..replay import DeviceTimeline, Timeline, replay
from ..sites import NO_FRAMES, Site, site_codes, site_text, words_text
from ..stacks import is_python_frame
from .attribute import Attribution, attribute
from .peaks import global_peak_index
from .phases import WindowPeak, find_phase, phase_table, window_peak
from .rules import RuleSet, shipped_rules

PEAK_COLUMNS = ["device", "scope", "phase", "event_index_a", "event_index_b", "active_bytes_a", "active_bytes_b",
                "baseline_bytes_a", "baseline_bytes_b", "transient_bytes_a", "transient_bytes_b",
                "reserved_bytes_a", "reserved_bytes_b", "delta_active_bytes", "delta_baseline_bytes",
                "delta_transient_bytes", "delta_reserved_bytes"]
CATEGORY_COLUMNS = ["device", "category", "bytes_a", "bytes_b", "delta_bytes", "baseline_bytes_a", "baseline_bytes_b",
                    "transient_bytes_a", "transient_bytes_b", "blocks_a", "blocks_b", "inferred_bytes_a",
                    "inferred_bytes_b"]
STACK_COLUMNS = ["device", "stack", "status", "category_a", "category_b", "site", "frames", "bytes_a", "bytes_b",
                 "delta_bytes", "transient_bytes_a", "transient_bytes_b", "blocks_a", "blocks_b", "matched"]
REF_COLUMNS = ["site_ref", "frame_refs"]
MAX_FRAMES = 8


# ---------------------------------------------------------------------------------------------------------
# Phases and windows
# ---------------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------------
# The diff
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Diff:
    """Two attributions at aligned instants and their differences (see the module docstring)."""

    a: Attribution
    b: Attribution
    instant: str
    peaks: pd.DataFrame
    categories: pd.DataFrame
    stacks: pd.DataFrame
    notes: tuple[str, ...] = ()

    def changes(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(categories, stacks) rows whose bytes differ between A and B."""
        return (self.categories[self.categories["delta_bytes"] != 0].reset_index(drop=True),
                self.stacks[self.stacks["status"] != "same"].reset_index(drop=True))

    @property
    def identical(self) -> bool:
        """No category or stack changed and every aligned peak has the same active and reserved bytes."""
        cats, stacks = self.changes()
        p = self.peaks
        return (len(cats) == 0 and len(stacks) == 0 and bool((p["delta_active_bytes"] == 0).all())
                and bool((p["delta_reserved_bytes"] == 0).all()))


def stack_identity(snapshot: Snapshot, stack_id: int) -> tuple[tuple[str, str], ...]:
    """A stack as (filename, function) pairs, innermost first: comparable across files, lines ignored, an installed
    package's files by their path inside site-packages (two environments install torch in different places)."""
    return tuple((_package_path(filename), name) for filename, _, name in snapshot.stack(stack_id))


def _package_path(filename: str) -> str:
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename


def stack_key(identity: tuple[tuple[str, str], ...]) -> str:
    text = "\n".join(f"{f}\t{n}" for f, n in identity)
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _python_frames(identity: tuple[tuple[str, str], ...], rules: RuleSet) -> tuple[Site | str, ...]:
    """A stack's Python frames without their lines, innermost first, plumbing left out (at most MAX_FRAMES);
    else what it has instead."""
    out = [Site(f, None, n) for f, n in identity if is_python_frame(f) and not rules.is_plumbing(f, n)]
    return tuple(out[:MAX_FRAMES]) if out else ("(no Python frames)" if identity else NO_FRAMES,)


def _phase_first(timeline: Timeline, snapshot: Snapshot, device: int, phase: str | None,
                 table: pd.DataFrame) -> tuple[int, int]:
    """(instant event index, first event of its window) for the global peak or a phase's peak (the highest of
    its occurrences when `phase` names several)."""
    dt = timeline[device]
    if phase is None:
        return global_peak_index(dt), 0
    peak = _window(dt, find_phase(table, phase, snapshot.source))
    return peak.event_index, peak.first_index


def _side(att: Attribution, device: int, first: int) -> pd.DataFrame:
    """Live blocks of one side with their stack identity and whether they were allocated in the window."""
    b = att.blocks[att.blocks["device"] == device]
    snap = att.snapshot
    ident = {int(s): stack_identity(snap, int(s)) for s in b["stack_id"].unique()}
    codes, sites = site_codes(b["frame_id"].to_numpy(), att.site)
    shown = np.empty(len(sites), dtype=object)
    shown[:] = sites
    out = b[["category", "size", "stack_id", "alloc_index"]].copy()
    out["site"] = shown[codes]
    out["identity"] = [ident[int(s)] for s in out["stack_id"]]
    out["transient"] = np.where(out["alloc_index"].to_numpy() >= first, out["size"].to_numpy(), 0)
    out["inferred"] = np.where(b["inferred"].to_numpy(dtype=bool), out["size"].to_numpy(), 0)
    return out


def _category_table(device: int, a: pd.DataFrame, b: pd.DataFrame) -> list[dict[str, Any]]:
    def agg(side: pd.DataFrame) -> pd.DataFrame:
        return side.groupby("category").agg(bytes=("size", "sum"), transient=("transient", "sum"),
                                             blocks=("size", "size"), inferred=("inferred", "sum"))

    ga, gb = agg(a), agg(b)
    rows = []
    for cat in sorted(set(ga.index) | set(gb.index)):
        ra = ga.loc[cat] if cat in ga.index else None
        rb = gb.loc[cat] if cat in gb.index else None
        ba, bb = (int(r["bytes"]) if r is not None else 0 for r in (ra, rb))
        ta, tb = (int(r["transient"]) if r is not None else 0 for r in (ra, rb))
        rows.append({"device": device, "category": cat, "bytes_a": ba, "bytes_b": bb, "delta_bytes": bb - ba,
                     "baseline_bytes_a": ba - ta, "baseline_bytes_b": bb - tb, "transient_bytes_a": ta,
                     "transient_bytes_b": tb, "blocks_a": int(ra["blocks"]) if ra is not None else 0,
                     "blocks_b": int(rb["blocks"]) if rb is not None else 0,
                     "inferred_bytes_a": int(ra["inferred"]) if ra is not None else 0,
                     "inferred_bytes_b": int(rb["inferred"]) if rb is not None else 0})
    return rows


def _stack_table(device: int, a: pd.DataFrame, b: pd.DataFrame, rules: RuleSet) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    def agg(side: pd.DataFrame) -> dict[Any, dict[str, Any]]:
        out: dict[Any, dict[str, Any]] = {}
        for ident, part in side.groupby("identity", sort=False):
            largest = part.sort_values("size", ascending=False, kind="stable").iloc[0]
            out[ident] = {"bytes": int(part["size"].sum()), "transient": int(part["transient"].sum()),
                          "blocks": len(part), "category": str(largest["category"]), "site": largest["site"]}
        return out

    ga, gb = agg(a), agg(b)
    for ident in set(ga) | set(gb):
        ra, rb = ga.get(ident), gb.get(ident)
        ba, bb = (r["bytes"] if r else 0 for r in (ra, rb))
        status = ("new" if ra is None else "vanished" if rb is None else
                  "grew" if bb > ba else "shrank" if bb < ba else "same")
        site = (rb or ra or {}).get("site")
        frames = _python_frames(ident, rules)
        rows.append({"device": device, "stack": stack_key(ident), "status": status,
                     "category_a": ra["category"] if ra else None, "category_b": rb["category"] if rb else None,
                     "site": site_text(site) or NO_FRAMES, "frames": [words_text((f,)) for f in frames],
                     "bytes_a": ba, "bytes_b": bb, "delta_bytes": bb - ba,
                     "transient_bytes_a": ra["transient"] if ra else 0,
                     "transient_bytes_b": rb["transient"] if rb else 0,
                     "blocks_a": ra["blocks"] if ra else 0, "blocks_b": rb["blocks"] if rb else 0,
                     "site_ref": site, "frame_refs": frames})
    rows = _paired_by_site(rows)
    rows.sort(key=lambda r: (-abs(r["delta_bytes"]), -max(r["bytes_a"], r["bytes_b"]), r["stack"]))
    return rows


def _paired_by_site(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stack new in B and one vanished from A that a reader sees as one site — the same deciding frame (file
    and function, lines aside) and category — are one stack whose callers changed (the program's script moved its
    lines or functions): paired, largest with largest, as grew / shrank / same, marked `matched: "site"` (a match
    that needed fuzziness says so); exact matches are `matched: "stack"`."""
    def key(r: dict[str, Any]) -> tuple[Any, ...] | None:
        site = r["site_ref"]
        if site is None:
            return None
        return (_package_path(site.filename), site.name, r["category_a"] or r["category_b"])
    for r in rows:
        r["matched"] = "stack"
    new = [r for r in rows if r["status"] == "new" and key(r) is not None]
    gone = [r for r in rows if r["status"] == "vanished" and key(r) is not None]
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for k in {key(r) for r in new} & {key(r) for r in gone}:
        bs = sorted((r for r in new if key(r) == k), key=lambda r: -r["bytes_b"])
        as_ = sorted((r for r in gone if key(r) == k), key=lambda r: -r["bytes_a"])
        pairs += list(zip(as_, bs))
    paired = {id(r) for pair in pairs for r in pair}
    out = [r for r in rows if id(r) not in paired]
    for ra, rb in pairs:
        ba, bb = ra["bytes_a"], rb["bytes_b"]
        out.append({**rb, "status": "grew" if bb > ba else "shrank" if bb < ba else "same",
                    "category_a": ra["category_a"], "bytes_a": ba, "delta_bytes": bb - ba,
                    "transient_bytes_a": ra["transient_bytes_a"], "blocks_a": ra["blocks_a"], "matched": "site"})
    return out


def _peak_row(device: int, scope: str, phase: str | None, pa: WindowPeak, pb: WindowPeak) -> dict[str, Any]:
    row: dict[str, Any] = {"device": device, "scope": scope, "phase": phase}
    for side, p in (("a", pa), ("b", pb)):
        row[f"event_index_{side}"] = p.event_index
        row[f"active_bytes_{side}"] = p.active_bytes
        row[f"baseline_bytes_{side}"] = p.baseline_active_bytes
        row[f"transient_bytes_{side}"] = p.transient_bytes
        row[f"reserved_bytes_{side}"] = p.reserved_bytes
    for what in ("active", "baseline", "transient", "reserved"):
        row[f"delta_{what}_bytes"] = row[f"{what}_bytes_b"] - row[f"{what}_bytes_a"]
    return row


def diff(a: Snapshot, b: Snapshot, phase: str | None = None, device: int | None = None,
         rules: RuleSet | None = None,
         markers: tuple[pd.DataFrame | None, pd.DataFrame | None] = (None, None)) -> Diff:
    """Compare `b` against `a` at the global peak (or the peak of `phase`) of each shared device (each
    snapshot's frames resolved with the source it carries: see `attribute`); `markers`: each side's run
    markers (their phases and requests)."""
    rules = rules or shipped_rules()
    ta, tb = replay(a), replay(b)
    shared = sorted(set(ta.devices) & set(tb.devices))
    if device is not None:
        if device not in shared:
            raise UsageError(f"device {device} is not in both snapshots (A: {sorted(ta.devices)}, "
                             f"B: {sorted(tb.devices)})")
        shared = [device]
    if not shared:
        raise UsageError(f"{a.source} and {b.source} share no device (A: {sorted(ta.devices)}, "
                         f"B: {sorted(tb.devices)})")
    notes: list[str] = []
    peak_rows, cat_rows, stack_rows = [], [], []
    instants_a, instants_b = {}, {}
    for d in shared:
        sa, sb = (phase_table(s, t, m, rules=rules, categories=False, device=d)
                  for s, t, m in ((a, ta, markers[0]), (b, tb, markers[1])))
        ia, fa = _phase_first(ta, a, d, phase, sa)
        ib, fb = _phase_first(tb, b, d, phase, sb)
        instants_a[d], instants_b[d] = (ia, fa), (ib, fb)
        names_a, names_b = list(dict.fromkeys(sa["label"])), list(dict.fromkeys(sb["label"]))
        if phase is None:
            whole_a, whole_b = window_peak(ta[d], 0, len(ta[d]) - 1), window_peak(tb[d], 0, len(tb[d]) - 1)
            peak_rows.append(_peak_row(d, "global", None, whole_a, whole_b))
            common = [p for p in names_a if p in set(names_b)]
            if names_a != names_b and (names_a or names_b):
                only_a = [p for p in names_a if p not in set(names_b)]
                only_b = [p for p in names_b if p not in set(names_a)]
                notes.append(f"device {d}: the phases differ (only in A: {', '.join(only_a) or '–'}; only in B: "
                             f"{', '.join(only_b) or '–'}); aligned the {len(common)} both have")
            for p in common:
                peak_rows.append(_peak_row(d, "phase", p, _window(ta[d], sa[sa["label"] == p]),
                                           _window(tb[d], sb[sb["label"] == p])))
        else:                                   # only the phase asked for, at the instants compared
            peak_rows.append(_peak_row(d, "phase", phase, _window(ta[d], find_phase(sa, phase)),
                                       _window(tb[d], find_phase(sb, phase))))
    att_a = _attribute_at(a, ta, instants_a, rules)
    att_b = _attribute_at(b, tb, instants_b, rules)
    for d in shared:
        side_a = _side(att_a, d, instants_a[d][1])
        side_b = _side(att_b, d, instants_b[d][1])
        cat_rows += _category_table(d, side_a, side_b)
        stack_rows += _stack_table(d, side_a, side_b, rules)
    label = "global peak" if phase is None else f"peak of phase {phase}"
    return Diff(a=att_a, b=att_b, instant=label, peaks=pd.DataFrame(peak_rows, columns=PEAK_COLUMNS),
                categories=pd.DataFrame(cat_rows, columns=CATEGORY_COLUMNS),
                stacks=pd.DataFrame(stack_rows, columns=[*STACK_COLUMNS, *REF_COLUMNS]), notes=tuple(notes))


def _window(dt: DeviceTimeline, rows: pd.DataFrame) -> WindowPeak:
    """The peak inside the span of `rows` (phase table rows) whose peak is highest."""
    row = rows.loc[rows["peak_bytes"].idxmax()]
    return window_peak(dt, int(row["start_index"]), int(row["end_index"]))


def _attribute_at(snapshot: Snapshot, timeline: Timeline, instants: dict[int, tuple[int, int]],
                  rules: RuleSet) -> Attribution:
    """One attribution per device at its own event index, merged into one Attribution."""
    parts = [attribute(snapshot, at=int(index), rules=rules, device=d, timeline=timeline)
             for d, (index, _) in sorted(instants.items())]
    if len(parts) == 1:
        return parts[0]
    blocks = pd.concat([p.blocks for p in parts], ignore_index=True)
    return Attribution(snapshot=snapshot, timeline=timeline,
                       instants={d: i for p in parts for d, i in p.instants.items()}, blocks=blocks,
                       rules=rules, decider=parts[0].decider, notes=tuple(n for p in parts for n in p.notes))
