"""plan.json's text (topoopt.jsontext): the document of ``json.dumps(indent=1,
sort_keys=True)`` in fewer lines, deterministic, every line within its width."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from topoopt.jsontext import ROW, WIDTH, json_text

_scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
            | st.floats(allow_nan=False) | st.text(max_size=30))
_docs = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=12)
                     | st.dictionaries(st.text(max_size=12), kids, max_size=8), max_leaves=80)


def _reference(doc) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


@settings(max_examples=150, deadline=None)
@given(_docs)
def test_same_document_as_the_indented_dump(doc):
    text = json_text(doc)
    assert text.endswith("\n") and text == json_text(doc)
    assert json.loads(text) == json.loads(_reference(doc))
    # the keys in the file are in sorted order, as sort_keys writes them
    assert json.dumps(json.loads(text)) == json.dumps(json.loads(_reference(doc)))


@settings(max_examples=100, deadline=None)
@given(_docs, st.integers(10, 200), st.integers(10, 600))
def test_values_fit_their_width_unless_numbers(doc, width, row):
    decoder = json.JSONDecoder()
    for line in json_text(doc, width, row).splitlines():
        body = line.strip().removesuffix(",")
        if body[:1] == '"':   # a key (or a string in a list)
            key, end = decoder.raw_decode(body)
            body = body[end + 2:] if body[end:end + 2] == ": " else json.dumps(key)
        if body in ("{", "[", "}", "]"):
            continue
        value = json.loads(body)
        # a longer value on one line is a list of numbers
        assert len(body) <= max(width, row) or not isinstance(value, (list, dict)) or (
            isinstance(value, list) and all(isinstance(v, (int, float, bool, type(None)))
                                            for v in value)), line


def test_plan_like_layout_and_edge_values():
    routes = [{"src": s, "dst": d, "paths": [{"path": [s, 9, d], "fraction": 0.5},
                                             {"path": [s, 8, d], "fraction": 0.5}]}
              for s in range(3) for d in range(3) if s != d]
    doc = {"routes": routes, "order": list(range(500)), "empty": {"a": [], "b": {}},
           "tuple": (1, (2, "x")), "odd": {10: "ten", 2: ["two"]}, "inf": math.inf,
           "text": "ünïcode \u2028 \"quoted\"", "labels": [f"server{i}" for i in range(60)]}
    text = json_text(doc)
    assert json.loads(text) == json.loads(_reference(doc))
    assert json.dumps(json.loads(text)) == json.dumps(json.loads(_reference(doc)))
    lines = text.splitlines()
    # each route is one line, a list of numbers is one line however long
    assert sum(line.strip().startswith('{"dst"') for line in lines) == len(routes)
    assert any(line.startswith(' "order": [0, 1, 2') and len(line) > WIDTH for line in lines)
    # strings too long for one line go one per line
    assert ' "labels": [' in lines and '  "server59"' in lines
    # the top level is never folded onto one line
    assert lines[0] == "{" and lines[-1] == "}"
    assert max(len(line) for line in lines if "order" not in line) <= ROW
