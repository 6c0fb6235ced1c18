"""Resolve a Python frame's file and line to the program's own source: qualified name, class, bases, code.

Contract: `SourceIndex(roots)` answers `resolve(filename, line, name)` with a `FrameSource` (or None when
the file cannot be found or parsed). A frame's file is read at its own path when that is a readable
regular ``.py`` file, else found under the roots by the longest path suffix it shares with a file there
(the unique best match; a tie or a bare file-name match among several files is left unresolved; a file of an
installed package, ``…/site-packages/timm/layers/mlp.py``, only where its whole package-relative path matches,
never by its name alone). Each file is read and parsed with `ast` once; lookups are cached per (file, line,
name), so a caller resolves each distinct frame once. `qualname` is the chain of enclosing classes and
functions (``SwiGLU.forward``, ``outer.inner``); when the function at the line is not the frame's own name
(line numbers drift between the snapshot and the checkout), the nearest definition with that name in the file
is used, and the frame is `drifted`: the statement at its line is not the one that ran, so `code` and `call`
are empty; so is a frame whose line is blank or a comment there (nothing runs on such a line). `bases` are the
enclosing class's base-class names (last dotted part, ``nn.Module`` → ``Module``), followed transitively
through classes defined anywhere under the roots. `code` is the statement at the line (whitespace collapsed,
at most 240 characters); `call` is the dotted name of the only call that statement makes ("" when it makes
none or several, because then which call allocated is not known). Roots that do not exist are a UsageError.
A file is read only if it is a regular file of at most 1 MiB (the largest modules of transformers, vLLM or
Megatron are a few hundred KB; a device, a FIFO or a generated blob would hang or cost seconds and GBs) and
parsed only if Python's parser accepts its nesting; a file found but skipped is named with the reason in
`FrameSources.skipped`, and its frames decide as if it had no source. With `environment`, a frame of an
installed package (``…/site-packages/transformers/models/…``) that neither its own path nor the roots give
is read at the same package-relative path in this Python's site-packages (found by path: nothing is
imported); whether that copy is the version that ran is for the caller to check (`drifted` frames).
`frames(frames)` resolves a snapshot's frames into the `FrameSources` map it carries.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import site
import stat
import sysconfig
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..confine import open_confined
from ..errors import UsageError
from ..frame_source import Frame, FrameSource, FrameSources

MAX_FILE_BYTES = 1 << 20
_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", ".tox", ".mypy_cache"}
_PACKAGE = re.compile(r"(?:^|/)(?:site|dist)-packages/([^/]+/.+\.py)$")   # a package's file, relative
_CLASS_RE = re.compile(r"^[ \t]*class[ \t]+(\w+)", re.MULTILINE)
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor, ast.While, ast.If,
             ast.With, ast.AsyncWith, ast.Try)


@dataclass(frozen=True)
class _Def:
    start: int
    end: int
    name: str
    chain: tuple[str, ...]             # enclosing names, outermost first, this one last
    cls: str                           # innermost enclosing class ("" if none)


@dataclass
class _File:
    defs: list[_Def]
    statements: list[tuple[int, int, ast.stmt]]     # (start, end, node) of every statement
    lines: list[str]
    classes: dict[str, tuple[str, ...]]             # class name -> base names


def _base_name(node: ast.expr) -> str:
    while isinstance(node, ast.Subscript):          # Generic[T] → Generic
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):               # a chained call: f(x).to(...) → "….to"
        parts.append("…")
    return ".".join(reversed(parts))


PARSE_BUDGET = 3 << 20         # characters one file's parses may read in all (its first parse and its retries)


def _tree(text: str) -> ast.Module | str:
    """The file's syntax tree. A line this Python cannot parse (the program may target a newer one, e.g.
    3.12's nested f-string quotes) is blanked to `pass` at its indentation and parsing retried, so the
    definitions around it still resolve; `code` then shows that line's raw text. Retries are bounded by what they
    parse (PARSE_BUDGET characters in all, at most 32): a megabyte file full of syntax errors is parsed twice,
    not thirty-two times."""
    lines = text.splitlines()
    for _ in range(max(1, min(32, PARSE_BUDGET // max(len(text), 1)))):
        try:
            with warnings.catch_warnings():          # the program's invalid escapes are not our warnings
                warnings.simplefilter("ignore")
                return ast.parse("\n".join(lines))
        except SyntaxError as exc:
            n = (exc.lineno or 0) - 1
            if not 0 <= n < len(lines) or lines[n].strip() == "pass":
                return f"not parsed: {exc.msg} at line {exc.lineno}"
            lines[n] = lines[n][:len(lines[n]) - len(lines[n].lstrip())] + "pass"
        except (ValueError, RecursionError, MemoryError) as exc:
            return f"not parsed: {'it nests deeper than Python parses' if isinstance(exc, RecursionError) else exc}"
    return "not parsed: more lines this Python cannot parse than are retried for a file of its size"


def _parse(text: str) -> _File | str:
    """The file's definitions and statements, or why it could not be parsed."""
    tree = _tree(text)
    if isinstance(tree, str):
        return tree
    defs: list[_Def] = []
    statements: list[tuple[int, int, ast.stmt]] = []
    classes: dict[str, tuple[str, ...]] = {}

    def visit(node: ast.AST, chain: tuple[str, ...], cls: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                statements.append((child.lineno, child.end_lineno or child.lineno, child))
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                inner = (*chain, child.name)
                is_class = isinstance(child, ast.ClassDef)
                if isinstance(child, ast.ClassDef):
                    classes.setdefault(child.name, tuple(b for b in map(_base_name, child.bases) if b))
                defs.append(_Def(start, child.end_lineno or child.lineno, child.name, inner, cls))
                visit(child, inner, child.name if is_class else cls)
            elif isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                visit(child, chain, cls)        # only statements hold statements: expressions are not walked

    visit(tree, (), "")
    return _File(defs, statements, text.splitlines(), classes)


def _calls(node: ast.stmt) -> list[str]:
    """Dotted names of the calls a simple statement makes (none for a compound statement's body)."""
    if isinstance(node, _COMPOUND):
        return []
    return [_dotted(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)]


@dataclass
class SourceIndex:
    """Source roots, parsed on demand (see the module docstring)."""

    roots: tuple[Path, ...]
    environment: bool = False          # installed packages' frames are also looked up in this site-packages
    _by_name: dict[str, list[tuple[str, ...]]] | None = field(default=None, repr=False)
    _files: dict[str, _File | str] = field(default_factory=dict, repr=False)   # parsed, or why not
    _located: dict[str, str | None] = field(default_factory=dict, repr=False)
    _resolved: dict[tuple[str, int, str], FrameSource | None] = field(default_factory=dict, repr=False)
    _class_files: dict[str, list[str]] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | SourceIndex | None,
           environment: bool = False) -> SourceIndex | None:
        """An index over `roots` (one path or several), the given index itself, or None for none;
        `environment`: also find installed packages' files in this Python's site-packages."""
        if isinstance(roots, SourceIndex):
            return roots
        items = [] if roots is None else [roots] if isinstance(roots, (str, os.PathLike)) else list(roots)
        if not items and not environment:
            return None
        paths = []
        for item in items:
            path = Path(item)
            if not path.is_dir():
                raise UsageError(f"--source {item}: not a directory (give the checkout of the program's source)")
            paths.append(path.resolve())
        return cls(tuple(paths), environment=environment)

    def frames(self, frames: Iterable[Frame]) -> FrameSources:
        """The source of each of `frames` that has one, as the map a snapshot carries (`FrameSources`)."""
        found, skipped = {}, {}
        for frame in frames:
            if frame[0].endswith(".py") and (hit := self.resolve(*frame)) is not None:
                found[frame] = hit
            elif (path := self._located.get(frame[0])) is not None and isinstance(self._files.get(path), str):
                skipped[frame[0]] = str(self._files[path])
        return FrameSources(found, environment=self.environment, skipped=skipped)

    # -- finding files ----------------------------------------------------------------------------
    def _index(self) -> dict[str, list[tuple[str, ...]]]:
        """Every .py file under the roots, by file name → its path parts (reversed, for suffix matching)."""
        if self._by_name is None:
            found: dict[str, list[tuple[str, ...]]] = {}
            for root in self.roots:
                for dirpath, dirnames, filenames in os.walk(root):
                    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
                    for name in sorted(filenames):
                        if name.endswith(".py"):
                            parts = Path(dirpath, name).parts
                            found.setdefault(name, []).append(tuple(reversed(parts)))
            self._by_name = found
        return self._by_name

    def locate(self, filename: str) -> str | None:
        """The file a frame names: at its own path, else the unique longest path-suffix match under the roots,
        else (`environment`) an installed package's file at its package-relative path in this site-packages."""
        if filename in self._located:
            return self._located[filename]
        found = None
        if filename.endswith(".py") and _regular_file(filename):
            found = filename
        else:
            parts = tuple(reversed([p for p in filename.replace("\\", "/").split("/") if p]))
            candidates = self._index().get(parts[0], []) if parts else []
            scored = sorted(((_common(parts, c), c) for c in candidates), reverse=True)
            # An installed package's file is that package's file only: under a root, its whole package-relative
            # path must match (timm/layers/mlp.py is not a program's nets/mlp.py); a program's own file may match
            # by the longest suffix, or by its name where it is the only file of that name.
            installed = _PACKAGE.search(filename.replace("\\", "/"))
            need = len(installed.group(1).split("/")) if installed else 2
            if scored and (len(scored) == 1 or scored[0][0] > scored[1][0]) \
                    and (scored[0][0] >= need or (len(scored) == 1 and not installed)):
                found = str(Path(*reversed(scored[0][1])))
        if found is None and self.environment and (installed := _PACKAGE.search(filename)) is not None:
            found = _installed(installed.group(1))
        self._located[filename] = found
        return found

    def _file(self, path: str) -> _File | None:
        if path not in self._files:
            try:
                self._files[path] = _parse(_read(path))
            except (OSError, ValueError) as exc:
                self._files[path] = f"not read: {exc.strerror or exc}" if isinstance(exc, OSError) else "not read"
        parsed = self._files[path]
        return parsed if isinstance(parsed, _File) else None

    # -- classes ----------------------------------------------------------------------------------
    def _bases(self, cls: str, here: _File) -> tuple[str, ...]:
        """Base names of `cls`, transitively, as far as the sources define them (cycles and depth capped)."""
        out: list[str] = []
        todo = list(here.classes.get(cls, ()))
        seen = {cls}
        while todo and len(seen) < 64:
            base = todo.pop(0)
            if base in seen:
                continue
            seen.add(base)
            out.append(base)
            todo.extend(self._class_bases(base, here))
        return tuple(out)

    def _class_bases(self, name: str, here: _File) -> tuple[str, ...]:
        if name in here.classes:
            return here.classes[name]
        if self._class_files is None:               # first look across files: find where classes live
            self._class_files = {}
            for paths in self._index().values():
                for parts in paths:
                    path = str(Path(*reversed(parts)))
                    text = _text(path)
                    for found in set(_CLASS_RE.findall(text or "")):
                        self._class_files.setdefault(found, []).append(path)
        for path in self._class_files.get(name, []):
            parsed = self._file(path)
            if parsed is not None and name in parsed.classes:
                return parsed.classes[name]
        return ()

    # -- frames -----------------------------------------------------------------------------------
    def resolve(self, filename: str, line: int, name: str) -> FrameSource | None:
        key = (filename, line, name)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(filename, line, name)
        return self._resolved[key]

    def _resolve(self, filename: str, line: int, name: str) -> FrameSource | None:
        path = self.locate(filename)
        parsed = self._file(path) if path else None
        if parsed is None or path is None:
            return None
        containing = [d for d in parsed.defs if d.start <= line <= d.end]
        here = max(containing, key=lambda d: d.start) if containing else None
        drifted = False
        if name not in ("<module>", "") and (here is None or here.name != name):
            named = [d for d in parsed.defs if d.name == name]
            if named:        # the line drifted: the nearest definition with the frame's name
                here = min(named, key=lambda d: (0 if d.start <= line <= d.end else min(abs(d.start - line),
                                                                                          abs(d.end - line)), d.start))
                drifted = not here.start <= line <= here.end
            elif here is None:
                return None
        cls = here.cls if here else ""
        if not drifted and here is not None and not _is_code_line(parsed, line):
            drifted = True                  # a blank or comment line ran nothing: the checkout differs there
        code, call = ("", "") if drifted else _statement(parsed, line)
        return FrameSource(qualname=".".join(here.chain) if here else "<module>", cls=cls,
                           bases=self._bases(cls, parsed) if cls else (), code=code, call=call, path=path,
                           drifted=drifted)


def _statement(parsed: _File, line: int) -> tuple[str, str]:
    """The statement at `line` (whitespace collapsed, at most 240 characters) and its only call ("" if none
    or several)."""
    stmts = [s for s in parsed.statements if s[0] <= line <= s[1]]
    node = max(stmts, key=lambda s: (s[0], -s[1]))[2] if stmts else None
    if node is not None and not isinstance(node, (*_COMPOUND, ast.Pass)):
        text = " ".join(parsed.lines[node.lineno - 1:(node.end_lineno or node.lineno)])
    else:
        text = parsed.lines[line - 1] if 0 < line <= len(parsed.lines) else ""
    calls = _calls(node) if node is not None else []
    return " ".join(text.split())[:240], calls[0] if len(calls) == 1 else ""


def _is_code_line(parsed: _File, line: int) -> bool:
    """Whether a line of the file can be one a frame points at: it exists and is neither blank nor a comment."""
    if not 0 < line <= len(parsed.lines):
        return False
    text = parsed.lines[line - 1].strip()
    return bool(text) and not text.startswith("#")


def _installed(relative: str) -> str | None:
    """`relative` (a package's file, ``transformers/models/…/modeling_qwen2.py``) in this Python's
    site-packages: the first regular file of that name there. Nothing is imported."""
    for root in _site_dirs():
        path = os.path.join(root, relative)
        if _regular_file(path):
            return path
    return None


@functools.cache
def _site_dirs() -> tuple[str, ...]:
    """This interpreter's site-packages directories (purelib, platlib, the site module's, the user's)."""
    paths = sysconfig.get_paths()
    found = [paths.get("purelib", ""), paths.get("platlib", "")]
    found += [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]
    return tuple(dict.fromkeys(p for p in found if p and os.path.isdir(p)))


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _regular_file(path: str) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode)


def _read(path: str) -> str:
    """The file's text, or OSError saying why it is not read (not a regular file, over the size cap)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError("not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise OSError(f"over {MAX_FILE_BYTES >> 20} MiB")
    with open_confined(path) as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"over {MAX_FILE_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def _text(path: str) -> str | None:
    try:
        return _read(path)
    except (OSError, ValueError):
        return None
