"""The fluid model's prediction for a real-runtime setting (``react run --slow-rank``):
the testbed as a one-switch star, checked against the ring's closed form."""

from __future__ import annotations

import numpy as np
import pytest

from topoopt.errors import ConfigError
from topoopt.react.loop import ReactParams
from topoopt.react.runtime.experiment import RunSpec, SlowRank, fluid_prediction


def _spec(collective: str = "ring", n: int = 4) -> RunSpec:
    return RunSpec(collective, n, 8e6, epochs=12, warmup=2, params=ReactParams(batch=3))


def test_uncongested_ring_takes_its_closed_form_time():
    # 2(n-1) steps, each one flow of S/n bytes per link, over two links of latency L
    n, size, rate, latency = 4, 8e6, 1e9, 20e-6
    f = fluid_prediction(_spec("ring", n), None, rate, latency=latency)
    want = 2 * (n - 1) * (size / n * 8 / rate + 2 * latency)
    assert np.allclose(f.baseline, want, rtol=1e-9)
    assert f.improvement == pytest.approx(0.0, abs=1e-9) and f.changes == ()


def test_a_rank_slowed_to_the_link_rate_changes_nothing():
    spec = _spec("tree", 8)
    plain = fluid_prediction(spec, None, 1e9)
    same = fluid_prediction(spec, SlowRank(2, "rate", rate=1e9), 1e9)
    assert np.array_equal(plain.baseline, same.baseline)
    assert np.array_equal(plain.react, same.react)


def test_external_flows_slow_the_baseline():
    spec = _spec("tree", 8)
    plain = fluid_prediction(spec, None, 1e9)
    for p in (1, 4):
        hit = fluid_prediction(spec, SlowRank(2, "flows", flows=p), 1e9)
        assert hit.mean("baseline") >= plain.mean("baseline")
    assert fluid_prediction(spec, SlowRank(2, "flows", flows=4), 1e9).mean("baseline") > \
        plain.mean("baseline")


def test_bad_link_rate_is_refused():
    with pytest.raises(ConfigError, match="link_rate"):
        fluid_prediction(_spec(), None, 0.0)


def test_a_fixed_pattern_runs_as_the_predictions_baseline():
    from topoopt.react.runtime.experiment import fluid_pattern_run, make_pattern

    n, size, rate, latency = 4, 8e6, 1e9, 20e-6
    spec = _spec("ring", n)
    r = fluid_pattern_run(make_pattern(spec), None, rate, epochs=2, latency=latency)
    assert np.allclose(r.epoch_time, 2 * (n - 1) * (size / n * 8 / rate + 2 * latency))
    tree = _spec("tree", 8)
    slow = SlowRank(2, "flows", flows=2)
    f = fluid_prediction(tree, slow, rate)
    got = fluid_pattern_run(make_pattern(tree), slow, rate, epochs=3)
    assert np.allclose(got.epoch_time, f.baseline[:3])
    assert got.fct.shape == (3, make_pattern(tree).edges_count)
    with pytest.raises(ConfigError, match="slow_rank"):
        fluid_pattern_run(make_pattern(spec), SlowRank(4), rate)
