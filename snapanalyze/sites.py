"""What outputs call a frame, carried as a value until a renderer labels it: a `Site` (the frame's file, line,
function and the qualified name its source gives), and `Words`, a sentence that names frames (a decision's
reason: its text and the Sites it names, in order).

Contract: results hold Sites and Words, never labels; a renderer makes each label with `Site.label(path)`
(`words_text` for Words), the one place a frame becomes text: the terminal, JSON and DataFrames show the file
without its install prefix (`stacks.short_path`), and a redacting renderer (`report --redact-paths`) passes
its own `path`, so every frame a report shows is redacted the same way, whichever snapshot it came from. A
native frame's Site is its symbol alone (its file and line name nothing a reader is shown), so two frames
that read the same are one site. Sites are small and picklable: a worker's result carries them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .stacks import Frame, is_python_frame, short_path

if TYPE_CHECKING:
    import numpy as np

PathText = Callable[[str], str]     # a file path as a target shows it
NO_FRAMES = "(no frames)"           # what a table shows for a block whose allocation carries no frames


@dataclass(frozen=True, order=True)
class Site:
    """A frame as outputs name it: `filename` as the trace records it ("" for a native frame), `line` (None
    where lines are left out: a stack's identity across files), `name` (a native frame's symbol without its
    argument list), `qualname` ("" where no source named the function) and `brief` (the file's name alone, the
    same in every target: a redacted path keeps its file's name)."""

    filename: str
    line: int | None
    name: str
    qualname: str = ""
    brief: bool = False     # only the file's name is shown (evidence: "model.py:120:forward"), whatever `path`

    @classmethod
    def of(cls, frame: Frame, qualname: str = "", lines: bool = True) -> Site:
        filename, line, name = frame
        if not is_python_frame(filename):
            return cls("", None, name.split("(", 1)[0] or name)
        return cls(filename, line if lines else None, name, qualname)

    def label(self, path: PathText = short_path) -> str:
        """"file:line:function" for a Python frame (the file as `path` shows it; the function as its qualified
        name where the source named it), "file:function" where lines are left out, the symbol for a native one."""
        if not self.filename:
            return self.name
        function = self.qualname or self.name
        shown = path(self.filename).rsplit("/", 1)[-1] if self.brief else path(self.filename)
        if self.line is None:
            return f"{shown}:{function}"
        return f"{shown}:{self.line}:{function}"


def site_of(frame: Frame | None, qualname: str = "") -> Site | None:
    """The Site of a frame (None for none)."""
    return Site.of(frame, qualname) if frame is not None else None


def site_text(site: Site | None, path: PathText = short_path, none: str = "") -> str:
    """A Site's label, `none` for none."""
    return site.label(path) if site is not None else none


Words = tuple["str | Site", ...]    # a sentence that names frames: its text and Sites, in order


def words(*parts: str | Site | None) -> Words:
    """Words from text and Sites (a None Site is left out; adjacent texts are joined)."""
    out: list[str | Site] = []
    for part in parts:
        if part is None or part == "":
            continue
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return tuple(out)


def words_text(said: Words, path: PathText = short_path) -> str:
    """Words as text, each Site labelled with `path`."""
    return "".join(p if isinstance(p, str) else p.label(path) for p in said)


def site_codes(frame_ids: np.ndarray, site: Callable[[int], Site | None]) -> tuple[np.ndarray, list[Site | None]]:
    """Each row's site as a code into the distinct Sites of `frame_ids` (in order of first appearance), for
    grouping by site: frames that read the same (two native frames of one symbol) are one site. One `site`
    call per distinct frame id."""
    import numpy as np
    import pandas as pd

    ids, uniques = pd.factorize(np.asarray(frame_ids, dtype=np.int64))
    first: dict[Site | None, int] = {}
    codes = np.array([first.setdefault(site(int(f)), len(first)) for f in uniques.tolist()], dtype=np.int64)
    return codes[ids] if len(ids) else ids.astype(np.int64), list(first)
