"""The vocabulary config schemas state their rules in: ``checked(default, rule)`` gives a field its rule, which
config.check_rules applies. A module of its own so that the registries' entries (algos.py, seq_models/) declare
their option sections beside themselves: config.py imports them, so they cannot import it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any, NamedTuple


class Rule(NamedTuple):
    ok: Callable[[Any], bool]
    # what the message says of a value that is not ok: "must be > 0", "is not one of [...]"; a function where it
    # names a registry's entries, read when the value is checked
    says: str | Callable[[], str]


def must(ok, what: str) -> Rule:
    return Rule(ok, f"must be {what}")


def at_least(low) -> Rule:
    return must(lambda v: v >= low, f">= {low}")


def above(low) -> Rule:
    return must(lambda v: v > low, f"> {low}")


def within(low, high, note: str = "") -> Rule:
    return must(lambda v: low <= v <= high, f"in [{low}, {high}]{note}")


def one_of(names) -> Rule:
    """``names``, or a function giving them when a value is checked: a registry, which may grow after import."""
    names = names if callable(names) else (lambda fixed=tuple(names): fixed)
    return Rule(lambda v: v in names(), lambda: f"is not one of {list(names())}")


def checked(default, rule: Rule):
    """A schema field with its default and its rule (a list default is copied per object)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})
