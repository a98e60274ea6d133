"""Cost model: the TopoOpt §5.2 ratios, cost-equivalent Fat-tree, bill of materials, overrides."""

import numpy as np
import pytest

from topoopt.errors import ConfigError
from topoopt.fabrics import expander, fat_tree, ideal_switch, star
from topoopt.fabrics.cost import (
    COST_KEYS,
    DEFAULT_PRICES,
    bill_of_materials,
    cost_equivalent_bandwidth,
    fabric_cost,
    price_table,
    topoopt_cost,
)

G = 1e9
# Fat-tree sizes k = 4..26 (16 .. 4,394 servers), the range of TopoOpt Figure 10 and §5.2.
SIZES = [k ** 3 // 4 for k in (4, 6, 8, 10, 12, 16, 20, 24, 26)] + [100, 432, 1000]


def test_ocs_topoopt_costs_about_4_thirds_of_patch_panel():
    ratios = [topoopt_cost(n, 4, 100 * G, optics="ocs").total
              / topoopt_cost(n, 4, 100 * G).total for n in SIZES]
    assert 1.25 <= np.mean(ratios) <= 1.41          # paper: 1.33x on average


def test_ideal_switch_costs_about_3_2x_topoopt():
    ratios = [fabric_cost(ideal_switch(n, 4 * 100 * G)).total / topoopt_cost(n, 4, 100 * G).total
              for n in SIZES]
    assert 2.8 <= np.mean(ratios) <= 3.6             # paper: 3.2x on average (3.0-3.6x)
    assert min(ratios) > 2.5 and max(ratios) < 4.0


@pytest.mark.parametrize("n,d,b", [(16, 4, 100 * G), (128, 4, 100 * G), (128, 8, 40 * G),
                                   (432, 8, 100 * G), (1024, 4, 25 * G)])
def test_cost_equivalent_fat_tree_matches_topoopt(n, d, b):
    speed = cost_equivalent_bandwidth(n, d, b)
    assert speed < d * b                              # B' < B, TopoOpt §5
    ft = fabric_cost(fat_tree(n, speed)).total
    assert ft == pytest.approx(topoopt_cost(n, d, b).total, rel=1e-6)


def test_cost_order_of_fabrics():
    n = 128
    topo = topoopt_cost(n, 4, 100 * G).total
    costs = {"expander": fabric_cost(expander(n, 4, 100 * G)).total,
             "oversub": fabric_cost(fat_tree(n, 400 * G, oversubscription=2)).total,
             "ideal": fabric_cost(ideal_switch(n, 400 * G)).total}
    assert costs["expander"] < topo < costs["oversub"] < costs["ideal"]


def test_bill_of_materials_of_a_k4_fat_tree():
    bill, _ = bill_of_materials(fat_tree(16, 100 * G))
    # 48 cables (16 server, 16 edge-agg, 16 agg-core), 80 switch ports (16+32+32)
    assert bill == {("nic_port", 100 * G): 16, ("transceiver", 100 * G): 96,
                    ("switch_port", 100 * G): 80, ("fibre", None): 48}
    bill, note = bill_of_materials(ideal_switch(16, 100 * G))
    assert bill[("switch_port", 100 * G)] == 80 and "Fat-tree" in note
    bill, _ = bill_of_materials(star(4, 10 * G))
    assert bill == {("nic_port", 10 * G): 4, ("transceiver", 10 * G): 8,
                    ("switch_port", 10 * G): 4, ("fibre", None): 4}
    bill, _ = bill_of_materials(expander(16, 4, 100 * G))
    assert bill == {("nic_port", 100 * G): 64, ("transceiver", 100 * G): 64,
                    ("fibre", None): 64}


def test_prices_interpolate_and_scale():
    p = DEFAULT_PRICES
    assert p.price("transceiver", 150 * G) == pytest.approx(200)   # halfway 100 -> 300
    assert p.price("nic_port", 1600 * G) == pytest.approx(4000)    # 2 x the 800G price
    assert p.price("switch_port", 5 * G) == pytest.approx(25)      # half the 10G price
    for comp in ("transceiver", "switch_port", "nic_port"):         # faster costs more
        speeds = np.array(sorted(getattr(p, comp)))
        prices = [p.price(comp, s) for s in speeds]
        assert np.all(np.diff(prices) > 0)
    assert all(p.source(c) for c in ("patch_panel_port", "ocs_port", "fibre"))
    assert p.source("transceiver", 100 * G)


def test_config_overrides_and_their_source():
    p = price_table({"ocs_port": 500, "transceiver": {"100Gbps": 80, "1.6Tbps": 2000}})
    assert p.ocs_port == 500 and p.price("transceiver", 100 * G) == 80
    assert p.price("transceiver", 1600 * G) == 2000
    assert p.source("ocs_port") == "config [cost]"
    assert p.source("transceiver", 100 * G) == "config [cost]"
    report = fabric_cost(fat_tree(16, 100 * G), p)
    line = next(i for i in report.items if i.component == "transceiver")
    assert line.unit_price == 80 and line.source == "config [cost]"
    assert report.to_json()["total"] == pytest.approx(report.total)
    assert price_table({}) is DEFAULT_PRICES


@pytest.mark.parametrize("bad,field", [({"bogus": 1}, "cost.bogus"),
                                       ({"ocs_port": -1}, "cost.ocs_port"),
                                       ({"fibre": "cheap"}, "cost.fibre"),
                                       ({"transceiver": 100}, "cost.transceiver"),
                                       ({"nic_port": {"fast": 1}}, "cost.nic_port.fast")])
def test_bad_cost_keys_name_the_field(bad, field):
    with pytest.raises(ConfigError) as err:
        price_table(bad)
    assert err.value.field == field
    assert set(COST_KEYS) >= {"transceiver", "switch_port", "patch_panel_port", "ocs_port"}
