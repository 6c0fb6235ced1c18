"""What the attribution says about its own evidence, per snapshot: the program's files and whether their source
was read, copies that differ from the code that ran (`source_notes`), and installed model-library files whose
unread source leaves many live bytes other or inferred (`installed_notes`). No paths: reports redact paths,
and notes are free text (a frame is named by its file's name alone: a brief `sites.Site`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...sites import Site
from ...units import fmt_count
from .frames import Decider

_PACKAGE = re.compile(r"(^|/)(?:site|dist)-packages/(([^/]+)/.+)$")     # a package's file: its relative path, name


def source_notes(decider: Decider, stack_ids: list[int]) -> list[str]:
    """What source resolution did, or would do: the program's own files among the live blocks' frames
    (Python files outside installed packages and the standard library)."""
    rules = decider.rules
    files = {f: found for sid in stack_ids for f, found in decider.program_files(int(sid))}
    if not files:
        return []
    # No paths in the notes: reports redact paths, and notes are free text.
    if rules.source is None:
        return [f"{fmt_count(len(files), 'file')} of the program's own code "
                f"{'appears' if len(files) == 1 else 'appear'} in the live stacks; --source DIR (the "
                "program's checkout) would resolve their frames to Class.method and the code at each line, which "
                "tells an MLP's Linear from an attention one"]
    notes = []
    skipped = {f: rules.source.skipped[f] for f, found in files.items() if not found and f in rules.source.skipped}
    missing = sum(1 for f, found in files.items() if not found and f not in skipped)
    if missing:
        notes.append(f"{missing} of {len(files)} file(s) of the program's own code in the live stacks were not "
                     "found under --source: their frames decide by file and function name only")
    if skipped:
        shown = "; ".join(f"{f.rsplit('/', 1)[-1]}: {why}" for f, why in sorted(skipped.items())[:5])
        notes.append(f"{fmt_count(len(skipped), 'file')} of the program's own code found under --source "
                     f"{'was' if len(skipped) == 1 else 'were'} skipped ({shown}"
                     f"{f'; and {len(skipped) - 5} more' if len(skipped) > 5 else ''}): "
                     "their frames decide by file and function name only")
    frames = decider.interner.frames
    for _, fids in sorted(decider.untrusted.items()):
        named = frames[fids[0]][0]
        installed = _PACKAGE.search(named)
        one = len(fids) == 1
        shown = ", ".join(Site(*frames[f], brief=True).label() for f in fids[:3]) \
            + (f" and {len(fids) - 3} more" if len(fids) > 3 else "")
        where = installed.group(2) if installed else named.rsplit("/", 1)[-1]
        fix = (f"install the {installed.group(3)} that ran (--env-source reads this environment's), or pass its "
               "site-packages with --source" if installed else "pass the checkout of the code that ran with --source")
        notes.append(f"{fmt_count(len(fids), 'frame')} the trace records in {where} {'lies' if one else 'lie'} "
                     f"outside {'its function' if one else 'their functions'} in the copy found ({shown}): it "
                     f"differs from the code that ran, so nothing from that file decides; {fix}")
    return notes


INSTALLED_NOTE_SHARE = 0.10     # an installed file holding less of a device's live bytes is not worth a note


def installed_notes(decider: Decider, blocks: pd.DataFrame) -> list[str]:
    """Per device, each installed package's file (a model library: transformers, timm, …) whose source was
    not read and that made — as the owner of their allocation — at least a tenth of the live bytes in
    `other` or an inferred category: reading that file could decide them. Named package-relative (no paths
    in notes), with what to pass."""
    if not len(blocks):
        return []
    frames = decider.interner.frames
    files: dict[int, str] = {}
    for sid in blocks["stack_id"].unique().tolist():
        fid = decider.owner_frame(int(sid)) if sid >= 0 else -1
        # a copy that was found but differs from the run has its own note (`source_notes`)
        if fid >= 0 and decider.rules.facts(frames[fid]).source is None \
                and (hit := _PACKAGE.search(frames[fid][0])):
            files[int(sid)] = hit.group(2)
    if not files:
        return []
    unsure = (blocks["category"] == "other").to_numpy() | blocks["inferred"].to_numpy(dtype=bool)
    table = pd.DataFrame({"device": blocks["device"], "file": blocks["stack_id"].map(files),
                          "size": blocks["size"], "unsure": np.where(unsure, blocks["size"], 0)})
    totals = table.groupby("device")["size"].sum()
    source = decider.rules.source
    notes = []
    for (device, name), part in table.dropna(subset=["file"]).groupby(["device", "file"], sort=True):
        share = int(part["unsure"].sum()) / max(int(totals[device]), 1)
        if share < INSTALLED_NOTE_SHARE:
            continue
        package = str(name).split("/", 1)[0]
        how = (f"this environment has no copy of it: install the {package} that ran"
               if source is not None and source.environment else
               f"--env-source reads it from this environment when it has the {package} that ran")
        notes.append(f"device {device}: {share:.0%} of live bytes, made in {name}, are other or inferred, and its "
                     f"source is not read here; {how}, or pass that site-packages with --source")
    return notes
