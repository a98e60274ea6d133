"""``routes_of``: a plan document's routes, read the same whether an entry is plain or
odd (a well-formed entry skips the field-by-field check; anything else gets it)."""

from __future__ import annotations

import copy
import json
import math
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.errors import PlanCheckError
from topoopt.plans.common import _routes_json, routes_of
from topoopt.topology.topology import RouteArrays, Routes

ROUTES = [
    {"src": 0, "dst": 1, "paths": [{"path": [0, 1], "fraction": 1.0}]},
    {"src": 1, "dst": 0, "paths": [{"path": [1, 2, 0], "fraction": 0.25},
                                   {"path": [1, 3, 0], "fraction": 0.75}]},
    {"src": 2, "dst": 3, "paths": [{"path": [2, 3], "fraction": 1}]},   # an int fraction
    {"src": 3, "dst": 2, "paths": []},
]


def test_plain_routes_are_read_as_given():
    got = routes_of({"routes": copy.deepcopy(ROUTES)}).paths
    assert dict(got) == {(0, 1): (((0, 1), 1.0),),
                         (1, 0): (((1, 2, 0), 0.25), ((1, 3, 0), 0.75)),
                         (2, 3): (((2, 3), 1.0),),
                         (3, 2): ()}
    assert type(got[(2, 3)][0][1]) is float


@pytest.mark.parametrize("edit, where", [
    (lambda r: r[1]["paths"][0]["path"].__setitem__(1, True), r"routes\[1\].paths\[0\].path\[1\]"),
    (lambda r: r[1]["paths"][1]["path"].__setitem__(0, -1), r"routes\[1\].paths\[1\].path\[0\]"),
    (lambda r: r[0]["paths"][0].__setitem__("fraction", 0.0), r"routes\[0\].paths\[0\].fraction"),
    # an integer past float's range: named, not an OverflowError
    (lambda r: r[2]["paths"][0].__setitem__("fraction", 10 ** 400),
     r"routes\[2\].paths\[0\].fraction"),
    (lambda r: r[2].__setitem__("extra", 1), r"routes\[2\].extra"),
    (lambda r: r[3].__setitem__("src", 1.0), r"routes\[3\].src"),
    (lambda r: r[2].update(src=0, dst=1), r"routes\[2\].src.*routed twice"),
])
def test_odd_entries_are_named(edit, where):
    routes = copy.deepcopy(ROUTES)
    edit(routes)
    with pytest.raises(PlanCheckError, match=where):
        routes_of({"routes": routes})


_node = st.integers(-1, 6) | st.sampled_from([True, 2 ** 70, 1.0])
_entry = st.fixed_dictionaries({
    "src": _node, "dst": _node,
    "paths": st.lists(st.fixed_dictionaries({
        "path": st.lists(_node, max_size=4),
        "fraction": st.sampled_from([1.0, 0.5, 1, 0.0, -0.5, math.inf, math.nan])}),
        max_size=3)})


def _entry_by_entry(routes):
    """routes_of without its whole-list fast path, or the error it raises."""
    with patch("topoopt.plans.common._plain_routes", lambda entries: None):
        try:
            return dict(routes_of({"routes": copy.deepcopy(routes)}).paths)
        except PlanCheckError as exc:
            return str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(_entry, max_size=6), st.booleans())
def test_the_fast_path_reads_what_the_entries_say(routes, in_order):
    if in_order:
        routes = sorted(routes, key=lambda r: (repr(type(r["src"])), r["src"],
                                               repr(type(r["dst"])), r["dst"]))
    want = _entry_by_entry(routes)
    try:
        got = dict(routes_of({"routes": copy.deepcopy(routes)}).paths)
    except PlanCheckError as exc:
        got = str(exc)
    assert got == want


def test_a_plans_routes_stay_arrays():
    # a plan writes its routes in pair order: read without building a tuple per path
    routes = routes_of({"routes": copy.deepcopy(ROUTES)})
    assert getattr(routes.paths, "arrays", None) is routes.arrays()
    assert dict(routes.paths) == _entry_by_entry(ROUTES)
    assert dict(routes_of({"routes": ROUTES[::-1]}).paths) == _entry_by_entry(ROUTES)


def test_routes_are_written_alike_from_arrays_or_tuples():
    # TopologyFinder's routes are arrays; the document lists them as from tuples
    mapping = dict(routes_of({"routes": _shuffled(ROUTES)}).paths)
    arrays = Routes.from_arrays(RouteArrays.from_mapping(mapping))
    written = _routes_json(arrays)
    assert json.dumps(written) == json.dumps(_routes_json(Routes(mapping)))
    assert dict(routes_of({"routes": written}).paths) == mapping


def _shuffled(routes):
    return copy.deepcopy(routes[::-1])
