"""Attribution rules as data: categories, frame rules and plumbing patterns, loaded from TOML.

Contract: `load_rules(user_file=None)` returns a RuleSet built from `categories.toml` and the shipped rule
packs (`rulepacks/{torch,vllm,sglang,transformers,generic}.toml`, in that order), with a user's TOML file
layered on top: its `[[categories]]` are added (or redefine a shipped one's precedence/owner), its
`[[rules]]` are consulted before the shipped ones, its `[[plumbing]]` is added, and `disable = [names]`
switches shipped rules off. A rule matches a frame when every pattern it gives (`file`, `function`:
Python regexes, `re.search`) matches; file paths are matched with '/' separators. A malformed file raises
RulesError naming the file and the problem. `RuleSet.match_frame` is cached per distinct frame.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import RulesError

PACKS = ("torch", "vllm", "sglang", "transformers", "generic")
OWNERS = ("outermost", "innermost")


@dataclass(frozen=True)
class Category:
    name: str
    precedence: int
    owner: str
    description: str = ""


@dataclass(frozen=True)
class Rule:
    """One named pattern over a single frame, with the category it proves and why."""

    name: str
    category: str
    reason: str
    file: re.Pattern[str] | None
    function: re.Pattern[str] | None
    tags: tuple[str, ...] = ()
    pack: str = ""

    def matches(self, filename: str, function: str) -> bool:
        return ((self.file is None or self.file.search(filename) is not None)
                and (self.function is None or self.function.search(function) is not None))


@dataclass
class RuleSet:
    categories: dict[str, Category]
    rules: list[Rule]
    plumbing: list[Rule]
    sources: list[str] = field(default_factory=list)
    _frame_cache: dict[tuple[str, str], tuple[bool, tuple[int, ...]]] = field(default_factory=dict, repr=False)

    def match_frame(self, filename: str, function: str) -> tuple[bool, tuple[int, ...]]:
        """(is plumbing, indices of matching rules in order) for one frame."""
        key = (filename, function)
        hit = self._frame_cache.get(key)
        if hit is None:
            plumbing = any(p.matches(filename, function) for p in self.plumbing)
            matched = () if plumbing else tuple(i for i, r in enumerate(self.rules)
                                                if r.matches(filename, function))
            hit = (plumbing, matched)
            self._frame_cache[key] = hit
        return hit

    def is_plumbing(self, filename: str, function: str) -> bool:
        return self.match_frame(filename, function)[0]


def _compile(pattern: Any, where: str, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise RulesError(f"{where}: '{what}' must be a string regex, got {type(pattern).__name__}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise RulesError(f"{where}: '{what}' is not a valid regex ({exc})") from None


def _rule(item: Any, where: str, pack: str, categories: dict[str, Category], plumbing: bool) -> Rule:
    if not isinstance(item, dict):
        raise RulesError(f"{where}: each rule must be a table")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise RulesError(f"{where}: a rule needs a 'name'")
    where = f"{where}: rule '{name}'"
    known = {"name", "category", "reason", "file", "function", "tags"}
    unknown = set(item) - known
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(known)})")
    category = "plumbing" if plumbing else item.get("category")
    if not plumbing and category not in categories:
        raise RulesError(f"{where}: unknown category {category!r} (known: {', '.join(categories)}; "
                         "declare new ones under [[categories]])")
    if "file" not in item and "function" not in item:
        raise RulesError(f"{where}: give at least one of 'file' or 'function'")
    tags = item.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise RulesError(f"{where}: 'tags' must be a list of strings")
    reason = item.get("reason", "")
    if not isinstance(reason, str) or not reason:
        raise RulesError(f"{where}: a rule needs a one-line 'reason'")
    return Rule(name=name, category=str(category), reason=reason,
                file=_compile(item.get("file"), where, "file"),
                function=_compile(item.get("function"), where, "function"), tags=tuple(tags), pack=pack)


def _read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{where}: not valid TOML ({exc})") from None


def _categories(doc: dict[str, Any], where: str, into: dict[str, Category]) -> None:
    items = doc.get("categories", [])
    if not isinstance(items, list):
        raise RulesError(f"{where}: 'categories' must be an array of tables ([[categories]])")
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RulesError(f"{where}: each [[categories]] entry needs a 'name'")
        name = item["name"]
        base = into.get(name)
        precedence = item.get("precedence", base.precedence if base else 50)
        owner = item.get("owner", base.owner if base else "innermost")
        if not isinstance(precedence, int) or owner not in OWNERS:
            raise RulesError(f"{where}: category '{name}': precedence must be an integer and owner one of "
                             f"{OWNERS}")
        into[name] = Category(name, precedence, owner, str(item.get("description", base.description
                                                                     if base else "")))


def _rules_of(doc: dict[str, Any], where: str, pack: str, categories: dict[str, Category],
              key: str) -> list[Rule]:
    items = doc.get(key, [])
    if not isinstance(items, list):
        raise RulesError(f"{where}: '{key}' must be an array of tables ([[{key}]])")
    return [_rule(item, where, pack, categories, plumbing=(key == "plumbing")) for item in items]


def load_rules(user_file: str | Path | None = None) -> RuleSet:
    """The shipped categories and packs, with `user_file` (TOML) layered on top (see module docstring).

    Without a file the shipped set is parsed once per process and the same RuleSet returned each time
    (treat it as read-only), so repeated attributions share their per-stack decisions."""
    return _shipped_rules() if user_file is None else _build_rules(user_file)


@functools.cache
def _shipped_rules() -> RuleSet:
    return _build_rules(None)


def _build_rules(user_file: str | Path | None) -> RuleSet:
    base = resources.files("snapanalyze.analyze")
    categories: dict[str, Category] = {}
    _categories(_read_toml(base.joinpath("categories.toml").read_text(), "categories.toml"),
                "categories.toml", categories)
    shipped: list[Rule] = []
    plumbing: list[Rule] = []
    sources = []
    for pack in PACKS:
        ref = base.joinpath("rulepacks", f"{pack}.toml")
        if not ref.is_file():
            continue
        where = f"rulepacks/{pack}.toml"
        doc = _read_toml(ref.read_text(), where)
        shipped += _rules_of(doc, where, pack, categories, "rules")
        plumbing += _rules_of(doc, where, pack, categories, "plumbing")
        sources.append(where)
    user: list[Rule] = []
    if user_file is not None:
        where = str(user_file)
        try:
            text = Path(user_file).read_text()
        except OSError as exc:
            raise RulesError(f"{where}: cannot read the rules file ({exc.strerror or exc})") from None
        doc = _read_toml(text, where)
        unknown = set(doc) - {"categories", "rules", "plumbing", "disable", "pack"}
        if unknown:
            raise RulesError(f"{where}: unknown top-level key(s) {sorted(unknown)} "
                             "(allowed: categories, rules, plumbing, disable, pack)")
        _categories(doc, where, categories)
        user = _rules_of(doc, where, "user", categories, "rules")
        plumbing = _rules_of(doc, where, "user", categories, "plumbing") + plumbing
        disable = doc.get("disable", [])
        if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
            raise RulesError(f"{where}: 'disable' must be a list of rule names")
        names = {r.name for r in shipped} | {p.name for p in plumbing}
        missing = [d for d in disable if d not in names]
        if missing:
            raise RulesError(f"{where}: 'disable' names unknown rule(s): {', '.join(missing)}")
        shipped = [r for r in shipped if r.name not in disable]
        plumbing = [p for p in plumbing if p.name not in disable]
        sources.insert(0, where)
    seen: dict[str, str] = {}
    for r in user + shipped:
        if r.name in seen:
            raise RulesError(f"{r.pack}: rule name '{r.name}' is used twice")
        seen[r.name] = r.pack
    return RuleSet(categories=categories, rules=user + shipped, plumbing=plumbing, sources=sources)
