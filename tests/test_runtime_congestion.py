"""The congestion harness on a real network stack: ranks in network namespaces with shaped
veth links, external TCP flows into one rank; REACT must move that rank off the critical
path. Skipped where torch or network namespaces (root + iproute2) are missing."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

pytest.importorskip("torch", reason="the runtime tests need torch (pip install "
                    "torch==2.13.0, the 'runtime' extra)")

from topoopt.react.runtime.netem import NetnsTestbed, netns_supported  # noqa: E402

_OK, _WHY = netns_supported()
needs_netns = pytest.mark.skipif(not _OK, reason=f"network-namespace testbed: {_WHY}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@needs_netns
def test_testbed_shapes_links_and_cleans_up():
    before = _namespaces()
    with NetnsTestbed(2, "200Mbps") as tb:
        made = _namespaces() - before
        assert set(tb.namespaces) <= made and tb.hub in made and tb.ext in made
        qdisc = subprocess.run(["ip", "netns", "exec", tb.namespaces[1], "tc", "qdisc", "show",
                                "dev", tb.ifnames[1]], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc
        tb.shape(1, "50Mbps")
        qdisc = subprocess.run(["ip", "netns", "exec", tb.namespaces[1], "tc", "qdisc", "show",
                                "dev", tb.ifnames[1]], capture_output=True, text=True).stdout
        assert "50Mbit" in qdisc
        flows = tb.external_flows(0, flows=1)
        assert flows.sender.poll() is None and flows.sink.poll() is None
    assert _namespaces() == before
    assert flows.sender.poll() is not None


@needs_netns
@pytest.mark.slow
def test_react_moves_the_congested_rank_off_the_critical_path():
    from topoopt.collectives import double_binary_tree_allreduce, pattern_from_json
    from topoopt.react.loop import ReactParams
    from topoopt.react.runtime.experiment import (
        RunSpec,
        SlowRank,
        critical_share,
        fluid_pattern_run,
        run_runtime,
    )

    slow = 2      # in NCCL's tree 0 on 4 ranks, rank 2 adds up both leaves (most incoming)
    spec = RunSpec("tree", 4, 1e6, epochs=24, warmup=6, params=ReactParams(batch=4),
                   slack=2)
    how = SlowRank(slow, "flows", flows=3)
    r = run_runtime(spec, how, link_rate=400e6, timeout=240)
    info = (f"changes {r.changes} dropped {r.dropped} share {r.share} means "
            f"{r.mean('baseline'):.3f}/{r.mean('react'):.3f} log {r.leader_log}")
    assert r.wrong_epochs == 0            # every epoch's sum was right, across the swaps
    assert r.changes, "REACT changed nothing under steady congestion: " + info
    swapped = {int(x) for _, _, swaps, _ in r.changes for s in swaps
               for x in s.split("@")[0].split("<->")}
    assert slow in swapped, info
    # fewer bytes flow into the congested rank, and less of the critical path is there
    initial = double_binary_tree_allreduce(4, 1e6)
    final = pattern_from_json(r.final)
    final_in = int(final.nbytes[final.dst == slow].sum())
    assert final_in == sum(e["bytes"] for e in r.final["edges"] if e["dst"] == slow)
    assert final_in < int(initial.nbytes[initial.dst == slow].sum()), info
    # measured: the critical path of the final pattern's epochs holds no more of the
    # congested rank's flows than the baseline's (which flows, not their seconds: the
    # background flows' rate drifts between the two runs on a shared machine)
    assert r.share["react"][1] <= r.share["baseline"][1], info
    # the pattern the runtime ended on, rated under the same congestion by the fluid
    # model of the testbed (no wall clock): faster, and its critical path spends less
    # time, in fewer flows, at the congested rank
    before = fluid_pattern_run(initial, how, 400e6)
    after = fluid_pattern_run(final, how, 400e6)
    assert after.epoch_time[0] < before.epoch_time[0], info
    at_before = critical_share(initial, before.fct, slow, outgoing=False)
    at_after = critical_share(final, after.fct, slow, outgoing=False)
    assert at_after[2] < at_before[2] and at_after[1] < at_before[1], (at_before, at_after)
    assert np.isfinite(r.baseline).all() and np.isfinite(r.react).all()
