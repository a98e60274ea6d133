"""``--ray ADDRESS`` on a real Ray cluster of two nodes, each its own ``ray start`` process.

One cluster per module (a head and a second node joined to it, one CPU each, on free
ports, in a temporary folder), stopped whatever happens: every process of both nodes
(their process groups, and the workers the raylets started) is killed at the end.
The plans and cluster runs through it must equal the local process pool's byte for
byte; an unreachable address, a worker that raises and a cluster that loses its
workers mid-plan must each end in one line, with nothing written.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_multijob import CLI_CONFIG

pytest.importorskip("ray", reason="Ray not installed: pip install 'topoopt[ray]'")

#: Seconds one ``ray start`` may take (a busy 2-core machine needs ~40).
START_TIMEOUT_S = 180
TOPOOPT = [sys.executable, "-m", "topoopt"]

TINY_PLAN = """
[cluster]
servers = 8
nics = 2
link_bandwidth = "100Gbps"
[job]
model = "bert"
batch_per_gpu = 16
[job.size]
layers = 2
hidden = 512
heads = 8
seq = 64
vocab = 8000
[plan]
budget = 10
rounds = 1
chains = 2
baselines = ["ideal", "fattree"]
"""

TINY_CLUSTER = CLI_CONFIG   # the shared-cluster config test_multijob plans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class _Node:
    """One ``ray start --block`` process in its own session, and its log."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self._file = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
             "--disable-usage-stats", "--num-cpus=1", *args],
            stdout=self._file, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)

    def wait_started(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if "Ray runtime started" in text:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.5)
        return False

    def processes(self) -> list[int]:
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def stop(self) -> None:
        pids = self.processes()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            for pid in pids:   # workers run in process groups of their own
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        self._file.close()


def _start_head(tmp: Path) -> tuple[_Node, str]:
    """A head node on a free port; tried three times, since Ray aborts a node whose
    dashboard agent takes over 15 s to start (a busy machine)."""
    for attempt in range(3):
        port = _free_port()
        head = _Node(["--head", f"--port={port}", "--include-dashboard=false",
                      f"--temp-dir={tmp / f'ray{attempt}'}"], tmp / f"head{attempt}.log")
        if head.wait_started():
            return head, f"127.0.0.1:{port}"
        head.stop()
    raise RuntimeError(f"ray start --head failed three times; see {tmp}/head*.log")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """``(address, [head, second node])`` of a running two-node cluster."""
    tmp = tmp_path_factory.mktemp("ray")
    nodes: list[_Node] = []
    try:
        head, address = _start_head(tmp)
        nodes.append(head)
        for attempt in range(3):
            node = _Node([f"--address={address}"], tmp / f"node{attempt}.log")
            nodes.append(node)
            if node.wait_started():
                break
            node.stop()
            nodes.pop()
        else:
            raise RuntimeError(f"the second node did not join; see {tmp}/node*.log")
        yield address, nodes
    finally:
        for node in reversed(nodes):
            node.stop()


def _run(*args, cwd=None, timeout=600):
    return subprocess.run([*TOPOOPT, *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=timeout)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_cluster_has_two_nodes(ray_cluster):
    address, _ = ray_cluster
    probe = ("import ray; ray.init(address=%r, log_to_driver=False); "
             "print(sum(n['Alive'] for n in ray.nodes()), ray.cluster_resources()['CPU'])")
    out = subprocess.run([sys.executable, "-c", probe % address], capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["2", "2.0"]


def test_plan_on_ray_equals_the_process_pool(ray_cluster, tmp_path):
    address, _ = ray_cluster
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_PLAN)
    common = ["plan", str(cfg), "--no-plots", "--no-report", "--quiet", "--seed", "3"]
    pool = _run(*common, "-o", str(tmp_path / "pool"), "--workers", "2")
    assert pool.returncode == 0, pool.stderr
    on_ray = _run(*common, "-o", str(tmp_path / "ray"), "--ray", address)
    assert on_ray.returncode == 0, on_ray.stderr
    got, expected = _files(tmp_path / "ray"), _files(tmp_path / "pool")
    assert "plan.json" in expected and got == expected
    assert _run("plan", "--check", str(tmp_path / "ray")).returncode == 0


def test_cluster_on_ray_equals_the_process_pool(ray_cluster, tmp_path):
    address, _ = ray_cluster
    cfg = tmp_path / "mix.toml"
    cfg.write_text(TINY_CLUSTER)
    outs = []
    for name, how in (("pool.json", ["--workers", "2"]), ("ray.json", ["--ray", address])):
        res = _run("cluster", str(cfg), "--quiet", "--json", str(tmp_path / name), *how)
        assert res.returncode == 0, res.stderr
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]


def test_an_unreachable_address_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_PLAN)
    address = f"127.0.0.1:{_free_port()}"   # nothing listens there
    res = _run("plan", str(cfg), "-o", str(tmp_path / "out"), "--quiet", "--ray", address)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --ray") and address in lines[0]
    assert not (tmp_path / "out").exists()
    bad = _run("plan", str(cfg), "-o", str(tmp_path / "out"), "--ray", "nowhere")
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr
    assert not (tmp_path / "out").exists()


def test_a_worker_that_raises_names_the_task(ray_cluster):
    # one driver: a worker's TopoOptError comes back with its message and exit code 2;
    # any other exception is one line naming the task and the address, exit code 1
    address, _ = ray_cluster
    script = ("import operator\n"
              "from topoopt.errors import TopoOptError\n"
              "from topoopt.executor import ExecutorError, make_executor\n"
              "from topoopt.units import parse_size\n"
              "with make_executor(1, ray=%r) as ex:\n"
              "    for fn, items in ((parse_size, ['1MB', 'lots']), (operator.truediv, [1])):\n"
              "        try:\n"
              "            ex.map(fn, items)\n"
              "        except TopoOptError as e:\n"
              "            print(getattr(e, 'exit_code', 2), e)\n") % address
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    config, crash = res.stdout.strip().splitlines()[-2:]
    # parse_size raises a ConfigError: the same message as in a local run
    assert config == "2 size = 'lots': expected a size such as '2MB', '512KiB' or '1.5GB'"
    assert crash.startswith("1 Ray task truediv #0 on " + address) and "TypeError" in crash


def test_a_cluster_dying_mid_plan_is_one_line_exit_1(ray_cluster, tmp_path):
    # last in the module: it takes the second node down
    address, nodes = ray_cluster
    cfg = tmp_path / "tiny.toml"
    # chains that never agree (tolerance 0) and a budget they do not reach
    cfg.write_text(TINY_PLAN.replace("budget = 10", "budget = 1000000\ntolerance = 0.0"))
    out = tmp_path / "out"
    plan = subprocess.Popen([*TOPOOPT, "plan", str(cfg), "-o", str(out), "--quiet",
                             "--no-plots", "--no-report", "--ray", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        deadline = time.monotonic() + 300
        busy: list[int] = []
        while not busy and time.monotonic() < deadline and plan.poll() is None:
            time.sleep(0.5)
            busy = [p for n in nodes for p in n.processes()
                    if _cmdline(p).startswith("ray::search_one_fabric")]
        assert busy, f"no task started on the cluster (plan exit {plan.poll()})"
        nodes[-1].stop()                  # the second node: raylet, agents, workers
        for pid in busy:                  # and the head's busy workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, err = plan.communicate(timeout=300)
    finally:
        if plan.poll() is None:
            plan.kill()
            plan.wait()
    assert plan.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and address in lines[0] and "search_one_fabric" in lines[0]
    assert not out.exists()
