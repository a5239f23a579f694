"""Which tests the default suite (`make test`) leaves to `make test-all`: marked at the tests themselves."""

import itertools

import pytest
from _pytest.mark.structures import ParameterSet

from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.seq_models import available


def slow_case(*values, **kw):
    """One case of a parametrize list that runs in `make test-all` only (its variants' ground is in `make test`)."""
    return pytest.param(*values, marks=pytest.mark.slow, **kw)


def parametrize_first_fast(argnames: str, cases, **kw):
    """``pytest.mark.parametrize`` whose first case stays in the default suite and the rest run in `make test-all`:
    for families of cases that each start the entry point or train a small run, where the first proves the path
    and the others its variants. Stacked, only the product's first case stays."""
    several = "," in argnames

    def slow(case):
        if isinstance(case, ParameterSet):
            return pytest.param(*case.values, marks=[*case.marks, pytest.mark.slow], id=case.id)
        return slow_case(*(case if several else (case,)))

    cases = list(cases)
    return pytest.mark.parametrize(argnames, cases[:1] + [slow(case) for case in cases[1:]], **kw)


def every_memory_in_turn(*choices) -> list:
    """Cases (model, *choice) for every registered memory crossed with every combination of ``choices`` (e.g. the
    algorithms): in the default suite each memory meets one combination, taken in turn down the registry, and the
    compared memories (catalog.COMPARED) meet them all; the other cases run in `make test-all`. So a memory added to
    the registry adds one case per such test to `make test`."""
    combos = list(itertools.product(*choices))
    cases = []
    for i, model in enumerate(available()):
        for j, combo in enumerate(combos):
            fast = model in COMPARED or j == i % len(combos)
            cases.append((model, *combo) if fast else slow_case(model, *combo))
    return cases
