"""Source resolution: a frame's file found at its own path or by its longest path suffix under a root, its
line resolved to Class.method with bases across files, the statement and its only call; drifted lines,
a newer Python's syntax and hostile paths handled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import UsageError
from snapanalyze.cli import main
from snapanalyze.load.source import MAX_FILE_BYTES, SourceIndex

MODEL = '''\
import torch
from torch import nn


class Base(nn.Module):
    pass


class SwiGLU(Base):
    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d, 4 * d)

    def forward(self, x):
        h = self.w1(x)
        return h * torch.sigmoid(
            h)


def outer():
    def inner(x):
        return x + 1
    return inner
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "pkg" / "model.py").write_text(MODEL)
    (tmp_path / "proj" / "other").mkdir()
    (tmp_path / "proj" / "other" / "model.py").write_text("def forward():\n    pass\n")
    (tmp_path / "proj" / "pkg" / "optim.py").write_text(
        "from torch.optim import Optimizer\n\n\nclass MyAdam(Optimizer):\n    def step(self):\n"
        "        m = torch.zeros_like(p)\n")
    (tmp_path / "proj" / "pkg" / "sub.py").write_text("from .optim import MyAdam\n\n\nclass Fancy(MyAdam):\n"
                                                       "    def step(self):\n        return 1\n")
    return tmp_path / "proj"


def test_a_frame_resolves_to_class_method_bases_code_and_call(tree: Path) -> None:
    index = SourceIndex.of(tree)
    assert index is not None
    got = index.resolve("/home/u/run/pkg/model.py", 15, "forward")
    assert got is not None
    assert (got.qualname, got.cls, got.bases) == ("SwiGLU.forward", "SwiGLU", ("Base", "Module"))
    assert (got.code, got.call) == ("h = self.w1(x)", "self.w1")
    multi = index.resolve("/home/u/run/pkg/model.py", 17, "forward")      # inside a multi-line statement
    assert multi is not None and multi.code == "return h * torch.sigmoid( h)" and multi.call == "torch.sigmoid"
    nested = index.resolve("/x/pkg/model.py", 22, "inner")
    assert nested is not None and nested.qualname == "outer.inner" and nested.cls == ""
    across = index.resolve("/elsewhere/pkg/sub.py", 5, "step")
    assert across is not None and across.bases == ("MyAdam", "Optimizer")   # the base defined in another file


def test_the_longest_suffix_decides_and_a_tie_resolves_nothing(tree: Path) -> None:
    index = SourceIndex.of([tree])
    assert index is not None
    assert index.locate("/abs/pkg/model.py") == str(tree / "pkg" / "model.py")
    assert index.locate("/abs/other/model.py") == str(tree / "other" / "model.py")
    assert index.locate("/abs/nowhere/model.py") is None             # two model.py, only the name shared
    assert index.locate("/abs/nowhere/optim.py") == str(tree / "pkg" / "optim.py")   # the only one


def test_a_drifted_line_finds_the_nearest_definition_with_the_frame_name(tree: Path) -> None:
    index = SourceIndex.of(tree)
    assert index is not None
    got = index.resolve("/r/pkg/model.py", 12, "forward")       # line 12 is in __init__: the checkout drifted
    assert got is not None and got.qualname == "SwiGLU.forward"
    # Line 12's statement (`self.w1 = nn.Linear(…)`) is not what ran in forward: no code or call from it.
    assert got.drifted and (got.code, got.call) == ("", "")
    same = index.resolve("/r/pkg/model.py", 15, "forward")
    assert same is not None and not same.drifted and same.code == "h = self.w1(x)"


def test_a_file_at_its_own_path_is_read_and_newer_syntax_does_not_hide_the_rest(tmp_path: Path) -> None:
    own = tmp_path / "own.py"
    own.write_text('class A:\n    def f(self, d):\n        x = f"{d["k"]}"\n        return x\n')  # 3.12 syntax
    index = SourceIndex.of(tmp_path)
    assert index is not None
    got = index.resolve(str(own), 4, "f")
    assert got is not None and got.qualname == "A.f" and got.code == "return x"
    bad = index.resolve(str(own), 3, "f")
    assert bad is not None and bad.qualname == "A.f" and 'f"{d["k"]}"' in bad.code


def test_devices_and_missing_roots_are_refused(tmp_path: Path) -> None:
    index = SourceIndex.of(tmp_path)
    assert index is not None
    assert index.resolve("/dev/zero", 1, "f") is None and index.resolve("/proc/self/mem", 1, "f") is None
    with pytest.raises(UsageError, match="not a directory"):
        SourceIndex.of(tmp_path / "nope")
    assert SourceIndex.of(None) is None and SourceIndex.of([]) is None


def test_files_that_cannot_be_read_or_parsed_are_skipped_with_the_reason(tmp_path: Path) -> None:
    """A device or FIFO named like a module, a file over the size cap, and one nesting deeper than Python's
    parser goes are skipped — each named with why — and never hang or fail the rest."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "ok.py").write_text("def f(x):\n    return x\n")
    (root / "big.py").write_text("def f(x):\n    return x\n" + "#" * (MAX_FILE_BYTES + 1))
    (root / "deep.py").write_text("def f(x):\n    return x\nY = " + "+".join(["x"] * 100_000) + "\n")
    os.mkfifo(root / "fifo.py")                      # reading it would block forever
    (root / "kmsg.py").symlink_to("/dev/zero")       # reading it would never end
    index = SourceIndex.of(root)
    assert index is not None
    frames = [(f"/elsewhere/{name}.py", 2, "f") for name in ("ok", "big", "deep", "fifo", "kmsg")]
    sources = index.frames(frames)
    assert [f[0] for f in sources.found] == ["/elsewhere/ok.py"]
    assert sources.skipped == {"/elsewhere/big.py": "not read: over 1 MiB",
                               "/elsewhere/deep.py": "not parsed: it nests deeper than Python parses",
                               "/elsewhere/fifo.py": "not read: not a regular file",
                               "/elsewhere/kmsg.py": "not read: not a regular file"}


def test_a_skipped_file_is_named_in_the_attribution_notes(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "model.py").write_text("def forward(x):\n    return x\n" + "#" * (MAX_FILE_BYTES + 1))
    b = SnapshotBuilder()
    b.segment(0x7F00_0000_0000, [(2 << 20, 2 << 20, "inactive")])
    b.alloc(0x7F00_0000_0000, 1 << 20, frames=[{"filename": "/app/model.py", "line": 2, "name": "forward"}])
    path = write_pickle(tmp_path / "s.pickle", b.build())
    result = CliRunner().invoke(main, ["attribute", str(path), "--source", str(root)])
    assert result.exit_code == 0, result.output
    assert ("1 file of the program's own code found under --source was skipped (model.py: not read: over 1 MiB)"
            in result.output)


def test_an_installed_packages_file_never_resolves_to_a_program_file_of_the_same_name(tmp_path: Path) -> None:
    """timm's layers/mlp.py is not the program's nets/mlp.py: an installed package's frame needs its whole
    package-relative path under a root, while the program's own file still resolves by its name alone."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mlp.py").write_text("def forward(x):\n    return x\n")
    index = SourceIndex.of(tmp_path)
    assert index is not None
    assert index.locate("/opt/conda/lib/python3.11/site-packages/timm/layers/mlp.py") is None
    assert index.locate("/home/u/run/mlp.py") == str(tmp_path / "nets" / "mlp.py")     # the program's, by name
    (tmp_path / "vendored" / "timm" / "layers").mkdir(parents=True)
    (tmp_path / "vendored" / "timm" / "layers" / "mlp.py").write_text("def forward(x):\n    return x\n")
    index = SourceIndex.of(tmp_path)
    assert index is not None
    assert index.locate("/opt/conda/lib/python3.11/site-packages/timm/layers/mlp.py") == \
        str(tmp_path / "vendored" / "timm" / "layers" / "mlp.py")              # a checkout of the package


def test_a_frame_on_a_blank_or_comment_line_of_the_checkout_has_drifted(tree: Path) -> None:
    (tree / "pkg" / "commented.py").write_text(
        "def forward(x):\n    # the old line\n\n    return x * 2\n")
    index = SourceIndex.of(tree)
    assert index is not None
    comment = index.resolve("/r/pkg/commented.py", 2, "forward")
    blank = index.resolve("/r/pkg/commented.py", 3, "forward")
    code = index.resolve("/r/pkg/commented.py", 4, "forward")
    assert comment is not None and comment.drifted and comment.code == ""
    assert blank is not None and blank.drifted
    assert code is not None and not code.drifted and code.code == "return x * 2"
