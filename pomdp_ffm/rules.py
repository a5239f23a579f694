"""The vocabulary config schemas state their rules in: ``checked(default, rule)`` gives a field its rule, which
``check_rules`` applies, to the run's config (config.py) and to a memory's options given outside it
(``options_of``). A module of its own so that the registries' entries (algos.py, seq_models/) declare their option
sections beside themselves: config.py imports them, so they cannot import it."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any, NamedTuple

from omegaconf import MISSING


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


def given(value) -> bool:  # Hydra builds the schema's defaults (MISSING, "???", included) before values are set
    return not (isinstance(value, str) and value == MISSING)


def check_rules(cfg, prefix: str = "") -> None:
    """Every field against its rule (``checked``); floats must be finite. Types are OmegaConf's to check."""
    for f in dataclasses.fields(cfg):
        key, value, rule = prefix + f.name, getattr(cfg, f.name), f.metadata.get("rule")
        if dataclasses.is_dataclass(value):
            check_rules(value, key + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key}={value!r} must be a finite number")
        elif rule is not None and given(value):
            try:
                ok = bool(rule.ok(value))
            except (TypeError, ValueError):  # a value of another type, in an object built without OmegaConf
                ok = False
            if not ok:
                raise ValueError(f"{key}={value!r} {rule.says() if callable(rule.says) else rule.says}")


def options_of(cls: type, options: dict, section: str):
    """A memory's options given by keyword outside the config (a model built by hand): its option dataclass ``cls``
    (the one place of their defaults) with ``options`` set, checked as the config checks its section ``section``
    (each value of its field's type, each field's rule, ``check_together``): a bad one is a ValueError naming it as
    the config would (``policy.<memory>.<option>``), an unknown one a TypeError naming the allowed."""
    names = [f.name for f in dataclasses.fields(cls)]
    if unknown := sorted(set(options) - set(names)):
        raise TypeError(f"{section} has no option(s) {unknown}; allowed: {names}")
    hints = typing.get_type_hints(cls)
    for name, value in options.items():
        if not _of_type(value, hints[name]):
            raise ValueError(f"{section}.{name}={value!r} must be of type {_type_name(hints[name])}")
    chosen = cls(**options)
    check_rules(chosen, section + ".")
    if hasattr(chosen, "check_together"):
        chosen.check_together(section)
    return chosen


def _of_type(value, hint) -> bool:
    """Whether ``value`` fits a field's type as OmegaConf would take it (an int for a float; no bool for an int)."""
    if typing.get_origin(hint) is typing.Union:
        return any(_of_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, (list, tuple)) and all(_of_type(v, item) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint) -> str:
    return str(hint).replace("typing.", "") if typing.get_origin(hint) else hint.__name__
