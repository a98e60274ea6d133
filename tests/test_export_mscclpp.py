"""The MSCCL++ execution plan of the planned rings, read back by the executor's rules
(microsoft/mscclpp 1f5f065 src/core/executor/execution_plan.cc, executor.cc,
execution_common.hpp; lines cited in topoopt.export.mscclpp) and run on integers."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from topoopt.errors import PlanCheckError
from topoopt.export.mscclpp import (
    MAX_OPERATION,
    format_mscclpp_plan,
    mscclpp_ring_allreduce,
    parse_mscclpp_plan,
    simulate_mscclpp,
)

RINGS = {"one ring": [[0, 1, 2, 3]],
         "three rings of 8": [[0, 1, 2, 3, 4, 5, 6, 7], [0, 3, 6, 1, 4, 7, 2, 5],
                              [0, 7, 6, 5, 4, 3, 2, 1]],
         "long rings": [list(range(16)), list(range(15, -1, -1))]}


@pytest.mark.parametrize("name", sorted(RINGS))
def test_the_plan_is_an_allreduce_within_the_executors_limits(name):
    rings = RINGS[name]
    plan = parse_mscclpp_plan(format_mscclpp_plan(mscclpp_ring_allreduce(rings)))
    k, r = len(rings[0]), len(rings)
    x = np.random.default_rng(1).integers(-1000, 1000, (k, r * k))
    assert (simulate_mscclpp(plan, x) == x.sum(axis=0)).all()
    for g in plan.doc["gpus"]:
        assert all(len(tb["ops"]) <= MAX_OPERATION for tb in g["threadblocks"])
    # each ring hop is one channel on each end, towards the ring's next and previous rank
    for q, g in enumerate(plan.doc["gpus"]):
        want = sorted(p for ring in rings for j, s in enumerate(ring) if s == q
                      for p in (ring[(j + 1) % k], ring[j - 1]))
        assert sorted(plan.peers[q]) == want


def _broken(edit):
    doc = mscclpp_ring_allreduce(RINGS["three rings of 8"])
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("edit, rule", [
    (lambda d: d["gpus"][1].update(id=2), "line 257"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"].__setitem__(0, {"name": "send"}),
     "unknown operation"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"].extend([{"name": "nop"}] * 64),
     "executor.cc line 478"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"][0].update(channel_ids=[1]),
     "does not reach"),
    (lambda d: d["gpus"][0]["channels"][0]["connected_to"].pop(), "unequal|out of range"),
    (lambda d: d.pop("protocol"), "protocol"),
    (lambda d: d["gpus"][0]["threadblocks"][0]["ops"][0]["src_buff"][0].update(index=99),
     "outside buffer"),
])
def test_executor_rules_refuse(edit, rule):
    with pytest.raises(PlanCheckError, match=rule):
        parse_mscclpp_plan(_broken(edit))


def test_a_lost_send_deadlocks():
    doc = mscclpp_ring_allreduce(RINGS["one ring"])
    bad = copy.deepcopy(doc)
    bad["gpus"][2]["threadblocks"][0]["ops"].pop(0)   # rank 2 never sends its first chunk
    plan = parse_mscclpp_plan(json.dumps(bad))
    with pytest.raises(PlanCheckError, match="deadlock"):
        simulate_mscclpp(plan, np.ones((4, 4), int))
