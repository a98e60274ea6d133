"""``routes_of``: a plan document's routes, read the same whether an entry is plain or
odd (a well-formed entry skips the field-by-field check; anything else gets it)."""

from __future__ import annotations

import copy

import pytest

from topoopt.errors import PlanCheckError
from topoopt.plans.common import routes_of

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
    (lambda r: r[2].__setitem__("extra", 1), r"routes\[2\].extra"),
    (lambda r: r[3].__setitem__("src", 1.0), r"routes\[3\].src"),
    (lambda r: r[2].update(src=0, dst=1), r"routes\[2\].src.*routed twice"),
])
def test_odd_entries_are_named(edit, where):
    routes = copy.deepcopy(ROUTES)
    edit(routes)
    with pytest.raises(PlanCheckError, match=where):
        routes_of({"routes": routes})
