"""report.html: built from plan.json alone, every number checked against it, and loaded
in a real browser (headless Chromium) with no console errors."""

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import PlanCheckError
from topoopt.export.plan_dir import check_plan_dir, write_plan, write_report
from topoopt.export.report import REPORT, build_report, check_report, report_extras, value_of
from topoopt.planners.planner import plan
from topoopt.plans.document import cluster_job_of, rings_of, strategy_of
from topoopt.traffic import derive_traffic
from topoopt.units import format_time
from topoopt.workloads import model_of

SMALL_BERT = {"layers": 2, "hidden": 512, "heads": 8, "seq": 64, "vocab": 8000}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small plan (8 servers x 2 ports, BERT: rings and MP links) written with its report."""
    planned = plan(Cluster(servers=8, nics=2, link_bandwidth=100e9),
                   Job("bert", batch_per_gpu=16, size=SMALL_BERT), budget=20, rounds=2, seed=0)
    out = tmp_path_factory.mktemp("report") / "plan"
    write_plan(planned, out, plots=False)
    return out


def _doc(folder):
    return json.loads((folder / "plan.json").read_text())


class _Dom(HTMLParser):
    """Rows of the fabric table, server nodes and link lines of a page (or a browser's DOM)."""

    def __init__(self):
        super().__init__()
        self.rows, self.servers, self.links, self._row, self._cell = {}, [], [], None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "tr" and "fabric" in cls:
            self._row = a["data-fabric"]
            self.rows[self._row] = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "g" and "server" in cls:
            self.servers.append(int(a["data-server"]))
        elif tag == "line" and "link" in cls:
            self.links.append((int(a["data-link"]), float(a["stroke-width"]), cls))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self.rows[self._row].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _dom(text):
    d = _Dom()
    d.feed(text)
    return d


def test_plan_writes_a_report_that_checks(folder):
    doc = _doc(folder)
    assert REPORT in doc["files"]
    assert REPORT in check_plan_dir(folder, simulate=False)
    text = (folder / REPORT).read_text()
    # the same plan gives the same page, byte for byte
    assert build_report(doc) == text
    found = check_report(text, doc)
    assert found["servers"] == 8 and found["links"] == len(doc["topology"]["links"])
    assert found["fields"] > 100
    # the fabric table shows each fabric's iteration time as plan.json has it
    dom = _dom(text)
    assert list(dom.rows)[0] == "topoopt" and set(dom.rows) == set(doc["iteration_time_s"])
    for name, cells in dom.rows.items():
        assert cells[1] == format_time(doc["iteration_time_s"][name])
    assert sorted(dom.servers) == list(range(8))
    assert sorted(i for i, _, _ in dom.links) == list(range(len(doc["topology"]["links"])))
    # the heatmap after planning: one cell per server pair that carries bytes
    cluster, job = cluster_job_of(doc)
    after = derive_traffic(model_of(job), strategy_of(doc["strategy"]), cluster.servers,
                           job.global_batch(cluster), job.dtype_bytes).matrix(rings_of(doc))
    heat = text.split('data-which="after"')[1].split("</svg>")[0]
    assert heat.count('class="cell"') == np.count_nonzero(after) > 0
    # self-contained: no script, no external resource
    assert "<script" not in text and not re.search(r"(src|href)=\"(https?:)?//", text)


def test_link_widths_follow_their_bytes_and_the_busiest_is_on_top(folder):
    doc = _doc(folder)
    loads = [value_of(f"load:{i}", doc) for i in range(len(doc["topology"]["links"]))]
    # the loads are those plan.json's metrics were computed from
    assert max(loads) == pytest.approx(doc["metrics"]["max_link_load_bytes"], rel=1e-9)
    ring_bytes = sum(r["group_bytes"] * r["share"] for r in doc["rings"])
    assert sum(loads) >= ring_bytes * (1 - 1e-9)  # every ring byte is on some link
    links = _dom((folder / REPORT).read_text()).links
    widths = {i: w for i, w, _ in links}
    order = np.argsort(loads, kind="stable")
    assert [widths[i] for i in order] == sorted(widths.values())  # wider = more bytes
    assert loads[links[-1][0]] == max(loads)  # drawn last: nothing hides it
    assert any("mp" in cls for _, _, cls in links) == ("mp" in doc["topology"]["labels"])


def test_ring_bytes_on_the_page_add_up_to_the_groups(folder):
    doc = _doc(folder)
    for members in {tuple(r["members"]) for r in doc["rings"]}:
        idx = [i for i, r in enumerate(doc["rings"]) if tuple(r["members"]) == members]
        shown = sum(value_of(f"rings[{i}].group_bytes*rings[{i}].share", doc) for i in idx)
        assert shown == pytest.approx(doc["rings"][idx[0]]["group_bytes"], rel=1e-12)


@pytest.mark.parametrize("tamper, message", [
    (lambda t, d: t.replace(format_time(d["iteration_time_s"]["ideal"]), "1.234 ms", 1),
     "plan.json gives"),
    (lambda t, d: t.replace("<h2>Topology</h2>", "<h2>Topology of 42 racks</h2>"),
     "not a number from plan.json"),
    (lambda t, d: t.replace('<g class="server"', '<g class="x"', 1), "draws 7 servers"),
    (lambda t, d: t.replace("</body>", '<script src="https://cdn.example/x.js"></script>'
                                        "</body>"), "self-contained"),
])
def test_check_report_names_what_is_not_the_plans(folder, tamper, message):
    doc = _doc(folder)
    text = tamper((folder / REPORT).read_text(), doc)
    with pytest.raises(PlanCheckError, match=message):
        check_report(text, doc)


def test_plan_check_finds_a_stale_report(folder, tmp_path):
    out = tmp_path / "plan"
    shutil.copytree(folder, out)
    doc = _doc(out)
    doc["cost"]["fattree"] *= 1.5  # still a valid plan.json, but not the page's numbers
    (out / "plan.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    with pytest.raises(PlanCheckError, match="report"):
        check_plan_dir(out, simulate=False)
    res = CliRunner().invoke(main, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert REPORT in check_plan_dir(out, simulate=False)


def test_report_command_lists_the_page_and_shows_validation(folder, tmp_path):
    out = tmp_path / "plan"
    shutil.copytree(folder, out)
    doc = _doc(out)
    (out / REPORT).unlink()
    doc["files"].remove(REPORT)
    (out / "plan.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    predicted = doc["iteration_time_s"]["topoopt"]
    rows = [{"fabric": "topoopt", "predicted_s": predicted, "flow_s": predicted * 1.01,
             "ns3_s": predicted * 1.07, "error": 0.06, "predicted_error": 0.07}]
    (out / "validate.json").write_text(json.dumps({"plan": str(out), "mtu": 9000,
                                                   "fabrics": rows}))
    res = CliRunner().invoke(main, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert REPORT in _doc(out)["files"]
    text = (out / REPORT).read_text()
    assert 'id="validation"' in text and format_time(predicted * 1.07) in text
    assert list(report_extras(out, _doc(out))) == ["validate.json"]
    assert REPORT in check_plan_dir(out, simulate=False)
    # the validation file changed after the page: the check says so
    rows[0]["ns3_s"] *= 2
    (out / "validate.json").write_text(json.dumps({"fabrics": rows}))
    with pytest.raises(PlanCheckError, match="validate.json"):
        check_plan_dir(out, simulate=False)


def test_report_never_replaces_a_users_page(folder, tmp_path):
    out = tmp_path / "plan"
    shutil.copytree(folder, out)
    doc = _doc(out)
    doc["files"].remove(REPORT)
    (out / "plan.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    (out / REPORT).write_text("my notes")
    res = CliRunner().invoke(main, ["report", str(out)])
    assert res.exit_code == 2 and "in the way" in res.output
    assert (out / REPORT).read_text() == "my notes"
    res = CliRunner().invoke(main, ["report", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "plan.json" in res.output and "Traceback" not in res.output


def test_write_report_of_a_plan_without_one(folder, tmp_path):
    out = tmp_path / "plan"
    shutil.copytree(folder, out)
    (out / REPORT).unlink()
    path, found = write_report(out)
    assert path.read_text() == build_report(_doc(out)) and found["servers"] == 8


# ------------------------------------------------------------------------ browser
def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browse(url, tmp_path, *args):
    """Run headless Chromium on ``url``; return (stdout, console lines of stderr)."""
    cmd = [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
           "--enable-logging=stderr", "--v=0", *args, url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    console = [line for line in res.stderr.splitlines()
               if ":CONSOLE" in line or "Uncaught" in line]
    return res.stdout, console


@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium not installed (apt-get install chromium; "
                           ".ci/run installs it)")
def test_report_in_a_real_browser(folder, tmp_path):
    # the console capture sees a page's errors (or this test could not fail)
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>throw new Error('seen')</script></body></html>")
    assert any("seen" in line for line in _browse(bad.as_uri(), tmp_path, "--dump-dom")[1])

    doc = _doc(folder)
    url = (folder / REPORT).as_uri()
    dom, console = _browse(url, tmp_path, "--dump-dom")
    assert console == []
    page = _dom(dom)
    assert sorted(page.servers) == list(range(doc["topology"]["servers"]))
    assert len(page.links) == len(doc["topology"]["links"])
    for name, t in doc["iteration_time_s"].items():
        assert page.rows[name][1] == format_time(t)
        assert page.rows[name][7] == f"{doc['cost'][name]:,.0f}"
    shot = tmp_path / "report.png"
    _, console = _browse(url, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    assert console == []
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000  # a page drawn, not blank


def test_an_llm_plan_has_a_report_too(tmp_path):
    """An LLM job's plan.json (a parallelism, no operator strategy or MCMC search) gets the
    same page: its fabrics with their parallelism, iteration parts and MFU, its shard."""
    cluster = Cluster(servers=4, nics=4, link_bandwidth=100e9, gpus_per_server=4,
                      gpu=GPUS["H100"], intra_server_bandwidth=GPUS["H100"].nvlink_bandwidth)
    planned = plan(cluster, Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512}))
    with pytest.warns(UserWarning):  # no DP group: MSCCL skipped
        write_plan(planned, tmp_path / "plan", plots=False)
    doc = _doc(tmp_path / "plan")
    assert "llm" in doc and REPORT in check_plan_dir(tmp_path / "plan", simulate=False)
    text = (tmp_path / "plan" / REPORT).read_text()
    dom = _dom(text)
    for name, t in doc["iteration_time_s"].items():
        cells = dom.rows[name]
        assert cells[1] == format_time(t)
        assert cells[10] == f"{100 * doc['llm']['fabrics'][name]['iteration']['mfu']:.1f}%"
    assert sorted(dom.servers) == [0, 1, 2, 3] and 'id="search"' not in text
