"""The words of an OOM verdict: why an allocation failed, what would have helped, why nothing failed.

Contract: `why(v)` and `advice(v, engine, path)` turn an `analyze.oom.OomVerdict` into the sentence that
states its arithmetic and the list of things that would have helped (`path` shows a site's file: the report
redacts it, `sites.Site.label`); `kept_words(k, at, path)` words forward-pass tensors kept across training steps
(`analyze.kept.KeptAcrossStep`), at a failure or at a peak; an allocator setting newer than the torch that
wrote the file says so (`needs_torch`); `no_oom_message(n)` words an
`analyze.oom.NoOom`. `category_advice(category, engine)` is what would shrink one category, and
`peak_advice(category, engine, live)` what would lower a peak that `category` made (plus the advice an
engine gives for its state whenever it is live, e.g. optimizer state in training). The advice is data
(`advice.toml`), in the words of the engine (`analyze.engine`: "vllm", "sglang", "transformers",
"training"; "pytorch", the default, for plain PyTorch, which also answers what an engine leaves out), so
a vLLM knob is only ever named for a vLLM program. Bytes are in binary units; an unknown number is
"unknown". Nothing here computes a number the verdict does not carry.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from .. import tomldata
from ..analyze.kept import KeptAcrossStep
from ..analyze.oom import Advice, NoOom, OomVerdict, StateOnly
from ..errors import RulesError
from ..sites import PathText, site_text
from ..stacks import short_path
from ..units import fmt_bytes as _fmt
from ..units import fmt_count, fmt_share

MiB = 1 << 20


def fmt_bytes(n: int | None) -> str:
    return _fmt(n, none="unknown")


@functools.cache
def _advice_table() -> dict[str, Any]:
    return check_advice(tomldata.read_shipped("snapanalyze.report", "advice.toml"), "advice.toml")


def check_advice(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """An advice document, checked: `activations` (category names) and a table per engine of `chunk`,
    `isolate` (texts), `also` (category names) and `categories` (category → text); `pytorch`, which answers
    whatever an engine leaves out, gives `chunk`, `isolate` and `categories`."""
    tomldata.texts(doc.get("activations"), f"{where}: activations")
    for name, entry in doc.items():
        if name == "activations":
            continue
        at = f"{where}: [{name}]"
        tomldata.keys(tomldata.table(entry, at), ["chunk", "isolate", "also", "categories"], at)
        for key in ("chunk", "isolate"):
            if key in entry or name == "pytorch":
                tomldata.text(entry.get(key), f"{at}: {key}")
        tomldata.texts(entry.get("also", []), f"{at}: also")
        for category, advice in tomldata.table(entry.get("categories", {}), f"{at}: categories").items():
            tomldata.text(advice, f"{at}: categories: {category}")
    if "pytorch" not in doc:
        raise RulesError(f"{where}: needs a [pytorch] table")
    return doc


def why(v: OomVerdict) -> str:
    """The verdict's arithmetic in words."""
    request, gives = v.request_bytes, v.reserved_free_bytes + (v.device_free_bytes or 0)
    if v.verdict == "unexplained":
        return (f"a free block of {fmt_bytes(v.largest_free_block_bytes)} on stream {v.stream} could have served the "
                f"{fmt_bytes(request)} request; the state at the failure differs from what the file shows "
                f"({v.state_source})")
    if v.verdict == "fragmentation":
        alone = request <= v.reserved_free_bytes
        return (f"allocation failure from fragmentation: the {fmt_bytes(request)} request did not fit in any single "
                f"free block (largest usable: {fmt_bytes(v.largest_free_block_bytes)} in the {v.segment_type} pool "
                f"of stream {v.stream}) although "
                + (f"{fmt_bytes(v.reserved_free_bytes)} was reserved but free, more than the request by itself"
                   if alone else
                   f"reserved-but-free ({fmt_bytes(v.reserved_free_bytes)}) + device free "
                   f"({fmt_bytes(v.device_free_bytes or 0)}) = {fmt_bytes(gives)} would have covered it")
                + "; the holes sit in segments that also hold live blocks, so the allocator could not release them")
    base = (f"the device could not give the {fmt_bytes(request)} request: reserved-but-free "
            f"({fmt_bytes(v.reserved_free_bytes)}) + device free ({fmt_bytes(v.device_free_bytes or 0)}) = "
            f"{fmt_bytes(gives)}, {fmt_bytes(v.shortfall_bytes)} short")
    if v.verdict == "outside_pressure":
        held = (f"other processes held {fmt_bytes(v.pressure_bytes)} on the device" if v.pressure == "other_processes"
                else f"memory outside the allocator had grown by {fmt_bytes(v.pressure_bytes)} since the lowest NVML "
                     "sample")
        near = "" if v.sample_gap_us is None else (
            f" (NVML sample {abs(v.sample_gap_us) / 1000:.1f} ms {'before' if v.sample_gap_us >= 0 else 'after'} "
            "the failure)")
        return (f"pressure from outside the allocator: {base}; {held} at the failure{near}, at least the "
                f"{fmt_bytes(v.shortfall_bytes)} that was missing")
    return (f"live memory exhaustion: {base}; live bytes ({fmt_bytes(v.active_bytes)} requested, "
            f"{fmt_bytes(v.allocated_bytes)} in blocks) + the request exceed what the device can give"
            + (f" ({fmt_bytes(v.capacity_bytes)} capacity, {fmt_bytes(v.outside_bytes)} of it outside the allocator)"
               if v.capacity_bytes is not None and v.outside_bytes is not None else ""))


def _entry(engine: str, key: str) -> Any:
    """`key` of the engine's advice table, else plain PyTorch's."""
    table = _advice_table()
    mine = table.get(engine, {})
    return mine[key] if key in mine else table["pytorch"][key]


def category_advice(category: str, engine: str = "pytorch") -> str:
    """What would shrink `category` in a program run by `engine`: the engine's advice for it, else (for an
    activation) its chunk advice, else plain PyTorch's advice for it, else the engine's chunk advice."""
    table = _advice_table()
    own = table.get(engine, {}).get("categories", {})
    if category in own:
        return str(own[category])
    if category in table["activations"]:
        return str(_entry(engine, "chunk"))
    return str(table["pytorch"]["categories"].get(category, _entry(engine, "chunk")))


ADVICE_SHARE = 0.05     # advice about a category holding less of the peak than this is left out


def peak_advice(category: str | None, engine: str = "pytorch", live: Mapping[str, int] | Sequence[str] = (),
                total: int = 0) -> list[str]:
    """What would lower a peak that `category` made (None: no category rose), then the advice for the
    categories the engine always advises on (`also`) among `live` (category → its bytes at the peak), ranked by
    the bytes each could save and left out below ADVICE_SHARE of the peak (`total` bytes), each with its bytes."""
    sizes = dict(live) if isinstance(live, Mapping) else {c: 0 for c in live}
    names = [category] if category else []
    names += sorted((c for c in _entry(engine, "also") if c in sizes and c not in names),
                    key=lambda c: -sizes[c])
    if total > 0:
        names = [n for n in names if sizes.get(n, 0) >= ADVICE_SHARE * total]
    return [f"for {name}" + (f" ({fmt_bytes(sizes[name])}, {fmt_share(sizes[name] / total)} of the peak)"
                             if total > 0 and sizes.get(name) else "")
            + f", {category_advice(name, engine)}" for name in names]


def _one(a: Advice, engine: str, request: int = 0, path: PathText = short_path) -> str:
    x = a.values
    if a.kind == "expandable_segments":
        return (f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — {fmt_bytes(x['reserved_free_bytes'])} is "
                f"reserved but free in holes of at most {fmt_bytes(x['largest_free_bytes'])}; expandable segments "
                "grow one mapping instead of leaving holes between live blocks" + _needs(x) + _simulated(x, request))
    if a.kind == "max_split":
        return (f"max_split_size_mb:{x['split_mb']} — {fmt_count(x['segments'], 'large cached segment')} "
                f"{'was' if x['segments'] == 1 else 'were'} split, leaving "
                f"{fmt_bytes(x['free_bytes'])} free beside live blocks; blocks of at least that size are then never "
                "split, so they can be released whole" + _needs(x) + _simulated(x, request))
    if a.kind == "isolate":
        return str(_entry(engine, "isolate"))
    if a.kind == "category":
        name = x["category"]
        text = category_advice(name, engine)
        where = "allocated in the trace window and live at the failure" if x["in_window"] else "live at the failure"
        return f"{text} — {name} holds {fmt_bytes(x['bytes'])} {where}{_covers(x['bytes'], x.get('shortfall'))}"
    if a.kind == "kept":
        return kept_words(x["kept"], "at the failure", path) + _covers(x["kept"].bytes, x.get("shortfall"))
    if a.kind == "free_live":
        return f"free at least {fmt_bytes(x['bytes'])} of live memory before this allocation"
    raise ValueError(f"unknown advice kind {a.kind!r}")


def kept_words(k: KeptAcrossStep, at: str, path: PathText = short_path) -> str:
    """What to change when forward-pass tensors outlived training steps (`analyze.kept.KeptAcrossStep`), live
    `at` ("at the failure", "at the peak"); `path` shows the site's file."""
    made = ", ".join(f"{name} {fmt_bytes(n)}" for name, n in k.categories)
    by = site_text(k.site, path)
    site = f"; most by {by}" if by else ""
    return ("keep no forward-pass tensors across training steps (keep .item() or .detach() of what you log) — "
            f"{fmt_bytes(k.bytes)} made by forward passes before the training step at event "
            f"{k.step_index:,} ({made}{site}) are still live {at} although that code has run again since "
            f"(the oldest outlived {fmt_count(k.steps, 'step')}): a loss or output summed or stored without "
            ".item() / .detach(), backward(retain_graph=True), or a variable still holding the previous "
            "iteration's tensor (del it once used) keeps them or their graph")


def _needs(x: Mapping[str, Any]) -> str:
    """That the advised setting needs a newer torch than the one that may have written the file ("" if not)."""
    n = x.get("needs_torch")
    if not n:
        return ""
    return (f" (needs torch ≥ {n['since']}; this file was written by torch {n['file_torch']}, inferred from its keys"
            + ("" if n["certain"] else ", which may be older") + ")")


def _covers(saved: int, shortfall: int | None) -> str:
    """How much of what the failed request missed `saved` bytes would have covered ("" when nothing was)."""
    short = int(shortfall or 0)
    if not short:
        return ""
    if saved >= short:
        return f", enough by itself to cover the {fmt_bytes(short)} that was missing"
    return f", {saved / short:.0%} of the {fmt_bytes(short)} that was missing"


def _simulated(x: Mapping[str, Any], request: int) -> str:
    """What the allocator simulator found for an advised setting (`analyze.oom._simulated`), "" if not tried."""
    sim = x.get("simulated")
    if not sim:
        return ""
    unsure = "" if sim["replay_agrees"] else " (the replay under the recorded settings diverged before this OOM: " \
                                               "less sure)"
    if not sim["reached"]:
        return (f". Simulated with {sim['setting']}: the program would have failed earlier, at event "
                f"{sim['stopped_at']:,}{unsure}")
    if sim["served"]:
        return (f". Simulated with {sim['setting']}: this {fmt_bytes(request)} request fits — reserved "
                f"{fmt_bytes(sim['reserved_recorded'])} → {fmt_bytes(sim['reserved'])}{unsure}")
    return (f". Simulated with {sim['setting']}: this {fmt_bytes(request)} request still fails — largest free "
            f"block {fmt_bytes(sim['largest_free'])}, reserved {fmt_bytes(sim['reserved'])}{unsure}")


def advice(v: OomVerdict, engine: str = "pytorch", path: PathText = short_path) -> list[str]:
    """What would have helped, in the verdict's order, in the words of `engine`; `path` shows a site's file
    (the report redacts it)."""
    return [_one(a, engine, v.request_bytes, path) for a in v.advice]


def no_oom_message(n: NoOom) -> str:
    """That no allocation failed, who was refused instead (a serving engine's admission limit, where requests
    can be refused), and how far the peak stayed below capacity."""
    message = "no allocation failure was recorded in the trace window"
    if n.admission:
        rejected = n.rejected_requests
        if rejected:
            names = ", ".join(f"{r['name']}" + (f" ({r['reason']})" if r["reason"] else "") for r in rejected)
            many = len(rejected) > 1
            who = f"the rejected request{'s' if many else ''} {names} {'were' if many else 'was'}"
        else:
            who = "any rejected request was"
        message = f"no allocation failure was recorded; {who} refused by an admission limit, not by the allocator"
    held = n.nvml_used_bytes if n.nvml_used_bytes is not None else n.reserved_bytes
    if n.contradiction_bytes is not None:
        return message + (f"; yet the peak ({fmt_bytes(held)}: {n.peak_basis}) exceeds the capacity "
                          f"({fmt_bytes(n.capacity_bytes)}, {n.capacity_source}) by "
                          f"{fmt_bytes(n.contradiction_bytes)}: the figures contradict each other (is the capacity "
                          "that of this device?), so no headroom is given")
    if n.headroom_bytes is not None:
        return message + (f"; the peak stayed {fmt_bytes(n.headroom_bytes)} below capacity "
                          f"({fmt_bytes(n.capacity_bytes)}, {n.capacity_source}; peak {fmt_bytes(held)}: "
                          f"{n.peak_basis})")
    return message + (f"; the peak reached {fmt_bytes(held)} ({n.peak_basis}) but the device capacity is unknown "
                      "(no NVML samples or meta.json), so its distance to capacity cannot be said")


def state_only_message(s: StateOnly) -> str:
    """What a state without a trace can and cannot say about an allocation failure."""
    where = f" on stream {s.largest_free_stream}" if s.largest_free_stream is not None else ""
    one = s.larger_live_blocks == 1
    larger = (f"; {fmt_count(s.larger_live_blocks, 'live block')} of {s.live_blocks:,} {'is' if one else 'are'} "
              f"larger than that, so a request of {'its' if one else 'their'} size could reuse no free block and "
              "needs a new segment" if s.larger_live_blocks else "")
    return ("the file holds the allocator's state but no trace, so an allocation failure cannot be seen in it "
            "(record the history before the failure: torch.cuda.memory._record_memory_history, or "
            "snapanalyze.collect); the state proves: "
            f"{fmt_bytes(s.reserved_bytes)} reserved, {fmt_bytes(s.allocated_bytes)} in blocks, "
            f"{fmt_bytes(s.reserved_free_bytes)} reserved but free in {fmt_count(s.free_blocks, 'free block')}, "
            f"the largest {fmt_bytes(s.largest_free_block_bytes)}{where}{larger}")
