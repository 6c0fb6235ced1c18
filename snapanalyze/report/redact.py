"""Path redaction for reports shared outside a team: file paths → package-relative tails or hashes.

Contract: `redact_path(path)` keeps what identifies code without naming anyone's machine: a path inside an
installed package (`…/site-packages/`, `…/dist-packages/`) or the standard library (`…/lib/pythonX.Y/`)
becomes its package-relative tail (`vllm/v1/worker/gpu_worker.py`); any other path with directories becomes
`[h]/name` where `h` is the first 8 hex digits of the SHA-256 of its directory (the same directory always
gets the same hash, so equal files still look equal); a bare name (`<string>`, `??`) is kept. A `Redactor`
applies it to frames and to the `file:line:function` labels that attribution writes, and is a no-op when
disabled. Deterministic: no salt, no state beyond caches.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ..model import Snapshot
from ..stacks import frame_site, is_python_frame, short_path

_PACKAGE_ROOT = re.compile(r"^(?:.*/)?(?:site-packages|dist-packages|lib/python\d+(?:\.\d+)?)/")


def redact_path(path: str) -> str:
    """The shareable form of one file path (see the module docstring)."""
    path = path.replace("\\", "/")
    match = _PACKAGE_ROOT.match(path)             # greedy: the innermost package root wins
    if match is not None and match.end() < len(path):
        return path[match.end():]
    directory, sep, name = path.rpartition("/")
    if not sep:
        return path
    digest = hashlib.sha256(directory.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"[{digest}]/{name}"


@dataclass
class Redactor:
    """Redacts paths in a snapshot's frames and attribution labels when `enabled`."""

    snapshot: Snapshot
    enabled: bool = False
    _labels: dict[str, str] = field(default_factory=dict, repr=False)
    _paths: dict[str, set[str]] = field(default_factory=dict, repr=False)   # short path -> its redactions
    _seen: int = field(default=0, repr=False)     # frames of the interner already in `_labels`

    def path(self, path: str) -> str:
        return redact_path(path) if self.enabled else path

    def frame(self, frame: tuple[str, int, str]) -> tuple[str, int, str]:
        filename, line, name = frame
        return (self.path(filename), line, name) if is_python_frame(filename) else frame

    def label(self, label: str) -> str:
        """An attribution frame label (`short/path.py:line:function`, the function as `Class.method` where the
        source named it, or a C++ symbol) with its path redacted as the frame's full path is: one file gets one
        redaction whichever label names it. The snapshot's labels are made again from its frames, by
        `stacks.frame_site` with the redacting path (with the function's name and with the qualified name the
        snapshot's source gives it); a label of another snapshot is redacted by its path part."""
        if not self.enabled or not label:
            return label
        frames = self.snapshot.interner.frames
        sources = self.snapshot.sources.found if self.snapshot.sources is not None else {}
        for frame in frames[self._seen:]:
            if is_python_frame(frame[0]):
                source = sources.get(frame)
                named = source.qualname if source is not None and source.qualname != "<module>" else ""
                for qualname in dict.fromkeys(("", named)):
                    self._labels[frame_site(frame, qualname)] = frame_site(frame, qualname, redact_path)
                self._paths.setdefault(short_path(frame[0]), set()).add(redact_path(frame[0]))
        self._seen = len(frames)
        found = self._labels.get(label)
        if found is not None:
            return found
        parts = label.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit() and len(self._paths.get(parts[0], ())) == 1:
            return f"{next(iter(self._paths[parts[0]]))}:{parts[1]}:{parts[2]}"   # another snapshot's, same file
        head, sep, _ = label.partition(":")         # not a label of this snapshot: redact its path part
        return redact_path(head) + label[len(head):] if sep and "/" in head else label
