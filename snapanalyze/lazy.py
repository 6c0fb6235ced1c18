"""Names a package exports without importing their modules until first use (PEP 562).

Contract: `exports(package, table, namespace)` takes a package's `__name__`, its table {relative module: names}
and its `globals()`, and returns the package's `__getattr__` (imports the module naming the attribute, keeps the
value in `namespace`, and raises AttributeError for any other name) and `__dir__`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def exports(package: str, table: Mapping[str, tuple[str, ...]], namespace: MutableMapping[str, Any]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    module_of = {name: module for module, names in table.items() for name in names}

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module, package), name)
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *module_of])

    return getattr_, dir_
