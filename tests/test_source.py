"""Source resolution: a frame's file found at its own path or by its longest path suffix under a root, its
line resolved to Class.method with bases across files, the statement and its only call; drifted lines,
a newer Python's syntax and hostile paths handled."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapanalyze import UsageError
from snapanalyze.load.source import SourceIndex

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
