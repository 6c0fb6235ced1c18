"""What an estimate cannot follow, said in one line that names the program's line.

Contract: `refusal(exc)` turns an exception the program raised under fake tensors into an `EstimateRefused`
(a `CollectorError`): the innermost frame of the program's traceback outside torch and snapanalyze (its own
file, or a model library's), the code on that line, and why the emulation stops there — a value read from a
tensor (`.item()`, `bool()`, a data-dependent branch), an output whose shape depends on the data (`nonzero`,
`masked_select`), a custom kernel without a fake implementation — or, for any other error, the program's own
error. Never a partial number: the caller writes no snapshot.
"""

from __future__ import annotations

import linecache
import re
import sys
from types import TracebackType

from ...errors import CollectorError

_INFRA = re.compile(r"([\\/]torch[\\/]|[\\/]snapanalyze[\\/](collect|cli)[\\/]|[\\/]runpy\.py$|^<frozen runpy>$|"
                    r"[\\/]click[\\/]|[\\/]contextlib\.py$|[\\/]functools\.py$|[\\/]typing_extensions\.py$)")


class EstimateRefused(CollectorError):
    """The program did something the fake-tensor emulation cannot follow (or failed by itself)."""


def program_line(tb: TracebackType | None) -> str:
    """`file:line (code)` of the innermost traceback frame outside torch and snapanalyze ('' when none)."""
    found = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _INFRA.search(code.co_filename):
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            found = f"{code.co_filename}:{tb.tb_lineno}" + (f" ({text[:120]})" if text else "")
        tb = tb.tb_next
    return found


def _why(exc: BaseException) -> str:
    from torch._subclasses import fake_tensor as ft
    name = type(exc).__name__
    if isinstance(exc, ft.DataDependentOutputException) or name in ("GuardOnDataDependentSymNode",
                                                                     "DataDependentOutputException"):
        return ("reads a value from a tensor (.item(), bool(), int(), a branch on tensor data); the estimate runs "
                "no kernels (fake tensors hold shapes, not values): compute it from Python numbers or the config")
    if isinstance(exc, ft.DynamicOutputShapeException):
        op = getattr(exc, "func", "")
        return (f"calls {op or 'an op'} whose output shape depends on the tensor's values (nonzero, masked_select, "
                "unique, boolean indexing); the estimate cannot size it without data")
    if isinstance(exc, (ft.UnsupportedOperatorException, ft.UnsupportedFakeTensorException)):
        op = getattr(exc, "func", "")
        return (f"calls {op or 'a kernel'} that has no fake (shape-only) implementation, as custom CUDA kernels do "
                "not: register one with torch.library.register_fake")
    text = " ".join(str(exc).split())[:300]
    return f"raised {name}" + (f": {text}" if text else "")


def refusal(exc: BaseException) -> EstimateRefused:
    if isinstance(exc, SyntaxError):
        return EstimateRefused(f"{exc.filename}:{exc.lineno}: the program does not compile under this Python "
                               f"({sys.version.split()[0]}): {exc.msg}")
    where = program_line(exc.__traceback__)
    return EstimateRefused(f"the estimate stopped at {where or 'the program'}: it {_why(exc)}")
