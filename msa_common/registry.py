"""The one registry idiom: a table of name -> "module:attr", imported on first use.

Tasks, agent families, backends and CLI commands each keep one such table beside the code that
asks for them. Listing a registry reads the table only, so `--help` and the list commands stay
cheap and import nothing they do not show; `load(name)` imports the one module it needs.
Aliases (old spellings that still work) map onto names; `normalize` says which spellings count
as the same (e.g. case-insensitive). Unknown names raise the registry's own one-line error.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _same(name: str) -> str:
    return name


@dataclass(frozen=True)
class Registry:
    table: Mapping[str, str]  # name -> "package.module:attribute"
    unknown: Callable[[str, tuple[str, ...]], Exception]  # (asked, names) -> the error to raise
    aliases: Mapping[str, str] = field(default_factory=dict)  # normalized alias -> name
    normalize: Callable[[str], str] = _same  # applied to what is asked before the lookup

    def __post_init__(self) -> None:
        bad = {a: n for a, n in self.aliases.items() if n not in self.table}
        if bad:
            raise ValueError(f"aliases {bad} point at no registered name")

    def names(self) -> tuple[str, ...]:
        return tuple(self.table)

    def find(self, name: str) -> str | None:
        """The registered name `name` stands for (itself or an alias), or None."""
        key = self.normalize(name)
        for n in self.table:
            if self.normalize(n) == key:
                return n
        return self.aliases.get(key)

    def resolve(self, name: str) -> str:
        """The registered name `name` stands for; unknown names raise the registry's error."""
        found = self.find(name)
        if found is None:
            raise self.unknown(name, self.names())
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def load(self, name: str) -> Any:
        """Import the module behind `name` and return its attribute."""
        module, _, attr = self.table[self.resolve(name)].partition(":")
        return getattr(importlib.import_module(module), attr)
