"""Attribute every live byte at an instant to one category, naming the rule and frame that decided it.

Contract: `attribute(snapshot, at="peak", rules=None)` picks an instant per device (`peak`, `peak:N`,
`event:I` or the event index I itself, `time:T` with T a UTC date-time as the outputs print it or in ISO
8601, an offset into the device's trace window such as +2.38ms, or µs since the epoch: `instant`), takes the
blocks live right after it from the replay, and labels each with a primary category plus tags (`label`).
Attribution runs as named stages, in this order; each is a module here, and a rules file's `disable`
accepts each name (`rules.STAGES`; the heuristics inside them are named in `rules.HEURISTICS`):
- `stage.source`, `stage.rules`, `stage.calltree` (`frames`): a stack's frames decide — rules by category
  precedence (seeing each frame's class, qualified name and code where the snapshot carries its source,
  `Snapshot.sources` from `load(path, source=...)`, and it fits the run), else the autograd node of a
  C++-only backward or the role of the model code in the trace's call tree, flagged inferred;
- `stage.before_window` (`lifecycle`): frame-less blocks from before the window are persistent state, state
  an optimizer step replaced, or unknown, said plainly with how to record it;
- `stage.module_spans` (`label`): a collector's module span around the allocation names the module, above
  what frames only guess from names;
- `stage.signals` (`signals`): private pools, .grad lifetimes, other requests, size relations;
- `stage.annotations` (`label`): an annotation the program made on a block naming a category decides it.
Everything not proven by a frame, pool or metadata is flagged `inferred`, with the arithmetic in `reason`.
Only the stacks of live blocks (and the frees of pre-window ones) are resolved, each distinct frame once;
every decision is made once per distinct combination of what it reads and broadcast to the blocks that share
it. The bytes of the per-block table sum exactly to the instant's active bytes. `notes` says what the
evidence lacked (source not read, copies that differ from the run). Columns: `result`.
"""

from __future__ import annotations

import pandas as pd

from ...errors import UsageError
from ...model import Snapshot
from ...replay import Timeline, replay
from ...units import fmt_count
from ..engine import SERVING_ENGINES, detect_engine
from ..requests import RequestIndex
from ..rules import RuleSet, shipped_rules
from .frames import Decider
from .instant import choose_instant, time_us_of
from .label import STAGES, label
from .notes import installed_notes, source_notes
from .result import (
    BLOCK_COLUMNS,
    ID_COLUMNS,
    SUMMARY_COLUMNS,
    SUMMARY_TOP,
    Attribution,
    CategoryShare,
    Decision,
    Instant,
    category_shares,
    summarize_blocks,
    top_sites,
)
from .stack import StackView, explain_stack

__all__ = ["BLOCK_COLUMNS", "ID_COLUMNS", "STAGES", "SUMMARY_COLUMNS", "SUMMARY_TOP", "Attribution", "CategoryShare",
           "Decision", "Instant", "StackView", "attribute", "category_shares", "explain_stack", "label_lifetimes",
           "summarize_blocks", "time_us_of", "top_sites"]


def attribute(snapshot: Snapshot, at: str | int = "peak", rules: RuleSet | None = None,
              device: int | None = None, timeline: Timeline | None = None,
              markers: pd.DataFrame | None = None) -> Attribution:
    """Attribute the live bytes at `at` on each device (or one); see the module docstring. `markers` (a
    run's, `load.samples.markers_for`) lets request marker spans name requests the metadata does not; the
    source the snapshot carries (`load(path, source=...)`) resolves frames to their classes."""
    rules = rules or shipped_rules()
    timeline = timeline or replay(snapshot)
    devices = [device] if device is not None else sorted(timeline.devices)
    for d in devices:
        if d not in timeline.devices:
            raise UsageError(f"{snapshot.source}: no device {d} (devices: {sorted(timeline.devices)})")
    decider = Decider.for_snapshot(snapshot, rules)
    has_markers = len(RequestIndex.of(markers)) > 0
    said = _said(decider, markers)
    parts, instants, notes = [], {}, []
    anonymous: list[int] = []                          # devices whose requests nothing names
    for d in devices:
        dt = timeline[d]
        index, name = choose_instant(timeline, d, at)
        blocks, request, ambiguous = _labelled(decider, snapshot, d, index, markers, said, timeline)
        parts.append(blocks)
        instants[d] = Instant(d, index, name, dt.time_at(index), dt.active_at(index), dt.reserved_at(index),
                              dt.baseline_active, request)
        if int(blocks["size"].sum()) != dt.active_at(index):  # pragma: no cover - a replay bug
            raise AssertionError("attributed bytes differ from the replayed active bytes")
        t = snapshot.trace(d)
        if (t.user_metadata is None or not any(t.user_metadata_names)) and not has_markers:
            anonymous.append(d)
        if ambiguous:
            notes.append(f"device {d}: {fmt_count(ambiguous, 'live block')} {'was' if ambiguous == 1 else 'were'} "
                         "allocated while requests of different "
                         "threads were running; the trace does not say which thread allocated them, so they "
                         "keep their frame categories")
    if anonymous and parts and detect_engine(snapshot, pd.concat(parts, ignore_index=True)).name in SERVING_ENGINES:
        where = f"device {anonymous[0]}" if len(anonymous) == 1 else f"devices {', '.join(map(str, anonymous))}"
        notes.insert(0, f"{where}: no request identity recorded (user_metadata empty, no request markers), so bytes "
                        "of other requests batched into the same forward cannot be told apart")
    if not devices:
        notes.append("the file holds no allocator state and no trace (no segments, no trace entries): there are no "
                     "live bytes to attribute")
    blocks = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*BLOCK_COLUMNS, *ID_COLUMNS])
    notes.extend(source_notes(decider, blocks["stack_id"].unique().tolist()))
    notes.extend(installed_notes(decider, blocks))
    return Attribution(snapshot=snapshot, timeline=timeline, instants=instants, blocks=blocks, rules=rules,
                       decider=decider, notes=tuple(notes))


# Labelled instants kept per snapshot and rule set (on its `Decider`), the least recently asked dropped once
# they hold more blocks than this: the analyses of one report ask for the same instants (a rank's peak, a
# phase's), and a replay of one snapshot is the same whichever analysis made it.
KEPT_BLOCKS = 1 << 21


def _labelled(decider: Decider, snapshot: Snapshot, device: int, index: int, markers: pd.DataFrame | None,
              said: tuple[int, int] | None, timeline: Timeline) -> tuple[pd.DataFrame, str | None, int]:
    """`label` of the blocks live at one instant, kept on the decider by device, instant and what the markers
    say (`said`: their `markers_key`): each distinct instant of a snapshot is labelled once."""
    key = (device, index, said)
    kept = decider.labelled
    hit = kept.pop(key, None)
    if hit is None:
        dt = timeline[device]
        hit = label(snapshot, device, dt.live_at(index), decider, markers, dt.time_at(index), index, by_size=True,
                    window=dt.lifetimes)
    kept[key] = hit                                      # the most recently asked last
    while len(kept) > 1 and sum(len(v[0]) for v in kept.values()) > KEPT_BLOCKS:
        del kept[next(iter(kept))]
    return hit


def _said(decider: Decider, markers: pd.DataFrame | None) -> tuple[int, int] | None:
    """`markers_key` of the markers, kept on the decider for the last table asked about (the analyses of one
    snapshot pass one table many times)."""
    last = decider.last_markers
    if last is None or last[0] is not markers:
        last = decider.last_markers = (markers, markers_key(markers))
    return last[1]


def markers_key(markers: pd.DataFrame | None) -> tuple[int, int] | None:
    """What a markers table says, as a key: its rows and a hash of every column (attributes as text)."""
    if markers is None or not len(markers):
        return None
    plain = markers.drop(columns=["attrs"], errors="ignore")
    hashed = int(pd.util.hash_pandas_object(plain, index=False).sum())
    if "attrs" in markers:
        hashed ^= int(pd.util.hash_pandas_object(markers["attrs"].map(repr), index=False).sum())
    return len(markers), hashed


def label_lifetimes(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame,
                    rules: RuleSet | None = None, markers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Label any set of block lifetimes of `device` (rows of `DeviceTimeline.lifetimes`, e.g. every block
    of a window) with the same rules, signals and heuristics as `attribute`, one row each in their order
    (columns as `Attribution.blocks`). Context signals (the main request, size hints) are taken over the
    given set together, so a label can differ from `attribute` at one instant in rare cases."""
    return label(snapshot, device, lifetimes, Decider.for_snapshot(snapshot, rules or shipped_rules()), markers,
                 window=lifetimes)[0]
