"""Path redaction for reports shared outside a team: file paths → package-relative tails or hashes.

Contract: `redact_path(path)` keeps what identifies code without naming anyone's machine: a path inside an
installed package (`…/site-packages/`, `…/dist-packages/`) or the standard library (`…/lib/pythonX.Y/`)
becomes its package-relative tail (`vllm/v1/worker/gpu_worker.py`); any other path with directories becomes
`[h]/name` where `h` is the first 8 hex digits of the SHA-256 of its directory (the same directory always
gets the same hash, so equal files still look equal); a bare name (`<string>`, `??`) is kept. A `Redactor`
is how a report shows paths, frames and the Sites and Words results carry (`sites`): with redaction, every
file is redacted from its full path, whichever snapshot, result or sentence names it; without, a Site's file
shows without its install prefix as everywhere else. Deterministic: no salt, no state.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..sites import Site, Words, site_text, words_text
from ..stacks import is_python_frame, short_path

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


@dataclass(frozen=True)
class Redactor:
    """How a report shows paths, frames, Sites and Words: redacted when `enabled`."""

    enabled: bool = False

    def path(self, path: str) -> str:
        """A file path (a snapshot's, a run's): redacted, else as given."""
        return redact_path(path) if self.enabled else path

    def frame(self, frame: tuple[str, int, str]) -> tuple[str, int, str]:
        filename, line, name = frame
        return (self.path(filename), line, name) if is_python_frame(filename) else frame

    def site_path(self, filename: str) -> str:
        """A Site's file as the report shows it (`Site.label`'s `path`): redacted, else without its install
        prefix."""
        return redact_path(filename) if self.enabled else short_path(filename)

    def site(self, site: Site | None, none: str = "") -> str:
        return site_text(site, self.site_path, none)

    def words(self, said: Words) -> str:
        return words_text(said, self.site_path)
