"""Read a serving engine's start-up log (vLLM, SGLang) into the budget figures it states.

Contract: `read_engine_log(path)` returns an `EngineConfig` whose figures come from the log's lines that
`engine_logs.toml` describes (each figure names its line), or raises one BadInputError naming the file:
not a regular file, not text, no line of either engine's memory budget (the message lists what was looked
for), or lines of both engines. Only the first MAX_LOG_BYTES are read (the budget is stated at start-up)
and each line is cut at MAX_LINE_CHARS, so a serving log of gigabytes costs what its start does; the
patterns are checked by a literal first. Of lines tagged with a worker's rank (``TP1``, ``rank=1``,
``Worker_TP1``) only the lowest rank's are read: tensor-parallel workers repeat its figures for their shard.
`check_patterns()` validates the shipped table (the tests call it). A figure appears only where a line
states it: nothing is guessed here (`analyze.budget` derives what it can and says so). `engine_config(log,
engine, figures, given_as)` is the one way to the figures of a check: the log's, each figure given replacing
the log's (sourced as the option `given_as` names), or the figures alone for `engine`; UsageError when
neither a log nor an engine is given, or when the engine named is not the log's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from .. import tomldata
from ..confine import open_confined
from ..engine_config import ENGINES, FIGURES, EngineConfig, Figure
from ..errors import BadInputError, RulesError, UsageError
from .safe_pickle import regular_file

MAX_LOG_BYTES = 64 << 20
MAX_LINE_CHARS = 64 << 10
GiB = 1 << 30
UNITS = ("gib", "ratio", "count", "text")
COMBINE = ("first", "last", "sum")
_RANK = re.compile(r"(?:\bTP|Worker_TP|\brank=)(\d{1,6})\b")     # a worker's rank in a line's prefix


@dataclass(frozen=True)
class _Pattern:
    engine: str
    contains: str
    regex: re.Pattern[str]
    combine: dict[str, str]
    sets: dict[str, float]
    generation: str | None


@functools.cache
def check_patterns() -> tuple[_Pattern, ...]:
    """The shipped patterns, each checked: engine, literal, a compiling regex whose groups name figures."""
    where = "engine_logs.toml"
    doc = tomldata.read_shipped("snapanalyze.load", where)
    tomldata.keys(doc, ["line"], where)
    out = []
    for i, item in enumerate(doc.get("line", [])):
        here = f"{where} line[{i}]"
        tomldata.keys(item, ["engine", "contains", "pattern", "combine", "sets", "generation"], here)
        engine = tomldata.text(item.get("engine"), f"{here}.engine")
        if engine not in ENGINES:
            raise RulesError(f"{here}.engine: {engine!r} is not one of {', '.join(ENGINES)}")
        try:
            regex = re.compile(tomldata.text(item.get("pattern"), f"{here}.pattern"))
        except re.error as exc:
            raise RulesError(f"{here}.pattern: not a regular expression ({exc})") from None
        for group in regex.groupindex:
            name, unit = _split(group)
            if name not in FIGURES and name != "version" or unit not in UNITS:
                raise RulesError(f"{here}.pattern: group {group!r} is not FIGURE__UNIT")
        combine = tomldata.table(item.get("combine", {}), f"{here}.combine")
        sets = tomldata.table(item.get("sets", {}), f"{here}.sets")
        if any(v not in COMBINE for v in combine.values()) or not set(combine) | set(sets) <= set(FIGURES):
            raise RulesError(f"{here}: combine and sets name figures; combine is one of {COMBINE}")
        out.append(_Pattern(engine, tomldata.text(item.get("contains"), f"{here}.contains"), regex, combine,
                            {k: float(v) for k, v in sets.items()}, item.get("generation")))
    return tuple(out)


def _split(group: str) -> tuple[str, str]:
    name, _, rest = group.partition("__")
    return name, rest.split("__", 1)[0]


_NUMBER = re.compile(r"-?\d{1,15}(?:\.\d{1,12})?")
MAX_FIGURE = 1 << 50          # no engine figure reaches a PiB of GiB, or 10^15 tokens


class _NotANumber(ValueError):
    pass


def _number(text: str, unit: str) -> tuple[float, float]:
    """A logged number and its precision (half its last printed digit), in the figure's unit; `_NotANumber` when
    the text is no number a log prints (`.`, `1.2.3`, a 400-digit figure), said without repeating it whole."""
    digits = text.replace(",", "")
    if not _NUMBER.fullmatch(digits) or abs(float(digits)) > MAX_FIGURE:
        shown = digits if len(digits) <= 24 else f"{digits[:12]}… ({len(digits):,} characters)"
        raise _NotANumber(f"{shown!r} is not a number in range")
    decimals = max(-Decimal(digits).as_tuple().exponent, 0)   # type: ignore[operator]
    half = 0.5 * 10.0 ** -decimals if unit != "count" else 0.0
    value = float(digits)
    return (value * GiB, half * GiB) if unit == "gib" else (value, half)


def _lines(path: Path) -> list[str]:
    regular_file(path)
    try:
        with open_confined(path) as f:
            data = f.read(MAX_LOG_BYTES)
    except OSError as exc:
        raise BadInputError(path, f"cannot be read ({exc.strerror or exc})") from None
    if b"\x00" in data[:65536]:
        raise BadInputError(path, "not a text log (it holds NUL bytes): give the engine's start-up log")
    return [line[:MAX_LINE_CHARS] for line in data.decode("utf-8", errors="replace").splitlines()]


def parse_engine_log(lines: list[str], source: str) -> EngineConfig:
    """The figures `lines` state (module docstring); BadInputError naming `source` when none."""
    patterns = check_patterns()
    found: dict[str, Figure] = {}
    engines: dict[str, int] = {}
    version = generation = None
    candidates = []
    for number, line in enumerate(lines, start=1):
        hits = [p for p in patterns if p.contains in line]
        if hits:
            tag = _RANK.search(line.split("]", 1)[0] if "]" in line else line[:80])
            candidates.append((number, line, hits, None if tag is None else int(tag.group(1))))
    first_rank = min((r for *_, r in candidates if r is not None), default=None)
    for number, line, hits, rank in candidates:
        if rank is not None and rank != first_rank:
            continue
        for p in hits:
            match = p.regex.search(line)
            if match is None:
                continue
            engines.setdefault(p.engine, number)
            generation = generation or p.generation
            shown = " ".join(line.split())[:300]
            values: dict[str, tuple[float, float]] = {}
            for group, text in match.groupdict().items():
                if text is None:
                    continue
                name, unit = _split(group)
                if name == "version":
                    version = version or text
                    continue
                try:
                    value, half = _number(text, unit)
                except _NotANumber as exc:
                    raise BadInputError(source, f"line {number}: the {name.replace('_', ' ')} figure {exc}") \
                        from None
                before = values.get(name, (0.0, 0.0))
                values[name] = (before[0] + value, before[1] + half)
            values.update({name: (value, 0.0) for name, value in p.sets.items()})
            for name, (value, half) in values.items():
                how = p.combine.get(name, "first")
                detail = f"line {number}: {shown}"
                if name not in found or how == "last":
                    found[name] = Figure(value, "log", detail, half)
                elif how == "sum":
                    old = found[name]
                    found[name] = Figure(old.value + value, "log", f"{old.detail}; + {detail}", old.precision + half)
    if not engines:
        raise BadInputError(source, "no start-up line of vLLM or SGLang stating their memory budget (looked for: "
                            "vLLM's 'Model loading took', 'Available KV cache memory', 'GPU KV cache size', "
                            "'model weights take …'; SGLang's 'Load weight end', 'KV Cache is allocated', "
                            "'Memory pool end', 'max_total_num_tokens='): give the engine's start-up log, or the "
                            "figures as options (--engine, --gpu-memory-utilization, …)")
    if len(engines) > 1:
        seen = ", ".join(f"{e} from line {n}" for e, n in sorted(engines.items(), key=lambda kv: kv[1]))
        raise BadInputError(source, f"lines of both vLLM and SGLang ({seen}): give one engine's log")
    engine = next(iter(engines))
    return EngineConfig(engine, version, generation, dict(sorted(found.items())), source)


def read_engine_log(path: str | Path) -> EngineConfig:
    """The budget figures of the engine log at `path` (module docstring)."""
    path = Path(path)
    return parse_engine_log(_lines(path), str(path))


def engine_config(log: str | Path | None, engine: str | None, figures: Mapping[str, Any] | None = None,
                  given_as: Mapping[str, str] | None = None) -> EngineConfig:
    """The figures of a budget check (module docstring): `figures` maps `FIGURES` names to values (None: not
    given); `given_as` names how each was given (an option such as ``--total``; default the figure's name)."""
    given = {name: Figure(float(value), "option", (given_as or {}).get(name, name))
             for name, value in (figures or {}).items() if value is not None}
    if log is None and engine is None:
        raise UsageError("budget figures given without an engine: give --engine vllm|sglang or --engine-log LOG"
                         if given else "give the engine's start-up log (--engine-log LOG) or the engine and its "
                         "figures (--engine vllm|sglang …)")
    if log is None:
        return EngineConfig(str(engine), None, None, given, "options")
    config = read_engine_log(log)
    if engine is not None and engine != config.engine:
        raise UsageError(f"--engine {engine}, but {log} is a {config.engine} log")
    return EngineConfig(config.engine, config.version, config.generation, {**config.figures, **given},
                        config.source)
