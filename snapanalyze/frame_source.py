"""What the program's source says about its frames, as data: the map the rules read.

Contract: `FrameSource` is what one frame's source says (qualified name, class and bases, the statement at
the line, its only call, the file it was read from, whether the line lies outside the frame's function
there). `FrameSources` maps every frame of one snapshot — `(filename, line, function)` as the interner
holds it — to its `FrameSource`, or to nothing where no file was found; the loader makes it
(`load(..., source=...)`, `load.source.SourceIndex.frames`) and the snapshot carries it, so the analyses
read source as data and open no file. `environment` says whether installed packages were looked up in
the analysing Python's site-packages; `skipped` names each frame file that was found but not read or
parsed (a device, over the size cap, nesting Python cannot parse) with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Frame = tuple[str, int, str]


@dataclass(frozen=True)
class FrameSource:
    """What the source says about one frame (see the module docstring)."""

    qualname: str
    cls: str
    bases: tuple[str, ...]
    code: str
    call: str
    path: str
    drifted: bool = False              # the line is outside the frame's function here: code and call unknown


@dataclass(frozen=True, eq=False)
class FrameSources:
    """Frames resolved to their source: those found (the rest have none)."""

    found: Mapping[Frame, FrameSource] = field(repr=False)
    environment: bool = False          # installed packages were read from the analysing environment
    skipped: Mapping[str, str] = field(default_factory=dict, repr=False)   # frame file -> why it was not read

    def resolve(self, filename: str, line: int, function: str) -> FrameSource | None:
        return self.found.get((filename, line, function))

    def __len__(self) -> int:
        return len(self.found)
