"""``topoopt react pattern`` and ``estimate`` (no simulator needed)."""

import json

from click.testing import CliRunner

from topoopt.cli import main
from topoopt.collectives import pattern_from_json


def run(*args):
    return CliRunner().invoke(main, ["react", *args])


def test_estimate_is_the_section_4_3_example():
    base = ["estimate", "--collective", "tree", "--nodes", "16", "--size", "2MB",
            "--alpha", "4us", "--bandwidth", "100Gbps"]
    for extra, reduce_us in (([], "576 us"), (["--congest", "3:2"], "656 us"),
                             (["--congest", "3:2", "--swap", "3:2@1"], "576 us")):
        r = run(*base, *extra)
        assert r.exit_code == 0, r.output
        line = next(x for x in r.output.splitlines() if x.startswith("reduce"))
        assert reduce_us in line


def test_pattern_table_and_json(tmp_path):
    r = run("pattern", "--collective", "ring", "--nodes", "3", "--size", "12B",
            "--order", "0,2,1")
    assert r.exit_code == 0, r.output
    assert "reduce-scatter" in r.output and "all-gather" in r.output
    r = run("pattern", "--collective", "rd-allgather", "--nodes", "5", "--json")
    assert r.exit_code == 0
    p = pattern_from_json(json.loads(r.output))
    assert p.collective == "allgather" and p.ranks == 5
    out = tmp_path / "tree.json"
    assert run("pattern", "--nodes", "7", "-o", str(out)).exit_code == 0
    assert pattern_from_json(out.read_text()).ranks == 7


def test_bad_inputs_exit_2_with_one_line():
    for args in (["estimate", "--swap", "3-2"], ["estimate", "--nodes", "4", "--congest", "9:1"],
                 ["pattern", "--nodes", "1"], ["pattern", "--collective", "ring",
                                               "--nodes", "3", "--order", "0,0,1"],
                 ["estimate", "--alpha", "fast"]):
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error:") and "Traceback" not in r.output
