"""The one reader of TOML tables of facts (rule packs, categories, scopes, roles, engines, advice): parsed, and
their shape checked, with an error that names the file and what is wrong.

Contract: `parse(text, where)` returns the document or raises RulesError ("<where>: not valid TOML (…)");
`read_shipped(package, name)` parses a file shipped in a package, `read_shipped_folder(package, folder)`
every ``*.toml`` of a folder shipped in it (as ``(folder/name, document)``, by name). The checks are `keys`
(no key outside the allowed ones), `text` (a non-empty string), `texts` (a list of strings) and `table` (a
table), each raising RulesError naming where.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from importlib import resources
from typing import Any

from .errors import RulesError


def parse(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{where}: not valid TOML ({exc})") from None


def read_shipped(package: str, name: str) -> dict[str, Any]:
    return parse(resources.files(package).joinpath(name).read_text(), name)


def read_shipped_folder(package: str, folder: str) -> list[tuple[str, dict[str, Any]]]:
    found = [ref for ref in resources.files(package).joinpath(folder).iterdir()
             if ref.name.endswith(".toml") and ref.is_file()]
    return [(f"{folder}/{ref.name}", parse(ref.read_text(), f"{folder}/{ref.name}"))
            for ref in sorted(found, key=lambda r: r.name)]


def keys(item: dict[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = sorted(allowed)
    unknown = set(item) - set(allowed)
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {', '.join(allowed)})")


def table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RulesError(f"{where}: must be a table")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise RulesError(f"{where}: must be a non-empty string")
    return value


def texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RulesError(f"{where}: must be a list of strings")
    return value
