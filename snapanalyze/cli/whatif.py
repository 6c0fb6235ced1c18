"""`snapanalyze whatif`: replay a trace through the allocator simulator, and predict other settings."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import click

from . import main
from .common import SIZE, device_option, format_option, input_argument
from .parallel import parallel_options
from .per_rank import Job, Step, each, emit, plan
from .progress import Progress

if TYPE_CHECKING:
    from ..analyze.whatif import WhatIf


def _whatif(job: Job, step: Step, changes: tuple[str, ...], capacity: int | None, total: int | None,
            device: int | None) -> WhatIf:
    from ..analyze.whatif import whatif
    from ..errors import UsageError
    from ..replay import replay
    from ..session.inputs import open_input

    t = job.target
    step("loading")
    snapshot = open_input(t.path, t.rank, t.tag, frames=False).snapshot   # the simulator never reads a stack
    step("replaying")
    timeline = replay(snapshot)
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{snapshot.source}: no device {device} (devices: {sorted(timeline.devices)})")
    step("simulating")
    return whatif(snapshot, timeline, changes, capacity=capacity, total=total, device=device)


@main.command()
@input_argument
@click.option("--set", "changes", multiple=True, metavar="KEY:VALUE",
              help="An allocator setting as PYTORCH_ALLOC_CONF writes it (repeatable): expandable_segments:True, "
                   "max_split_size_mb:512, max_non_split_rounding_mb:N, roundup_power2_divisions:4 or "
                   "[256:1,512:2,>:8], garbage_collection_threshold:0.6 (with per_process_memory_fraction:F).")
@click.option("--capacity", type=SIZE, default=None,
              help="Bytes PyTorch could reserve on the device (its memory less what lives outside PyTorch); "
                   "default: what the first OOM proves (reserved + the driver's free bytes), else unbounded.")
@click.option("--total", type=SIZE, default=None,
              help="The device's memory, for per_process_memory_fraction (default: the capacity).")
@device_option()
@format_option()
@parallel_options
def whatif(file: str, rank: int | None, tag: str | None, changes: tuple[str, ...], capacity: int | None,
           total: int | None, device: int | None, fmt: str) -> None:
    """Replay the trace through a caching-allocator simulator: how far it reproduces the recorded segments,
    and (--set) what other allocator settings would have reserved, and whether each OOM would have been served."""
    from ..allocator.settings import AllocatorSettings, with_changes
    from ..report.whatif_terminal import render_whatif

    with_changes(AllocatorSettings(), changes)              # a bad --set fails before any load
    p = plan(file, rank, tag)
    work = functools.partial(_whatif, changes=changes, capacity=capacity, total=total, device=device)
    with Progress() as progress:
        p, results = each(p, work, progress)
    emit(p, results, fmt, render_whatif)
