"""An LLM plan's TopologyFinder runs spread over an executor give the same plan."""

import json

from topoopt.cluster import Cluster, Job
from topoopt.executor import make_executor
from topoopt.planners.llm import plan_llm
from topoopt.plans.llm import llm_plan_to_json

CLUSTER = Cluster(servers=8, nics=4, link_bandwidth=100e9, gpus_per_server=4)
JOB = Job("llama3-8b", 2, "bf16", size={"layers": 4, "seq": 512})


def test_the_process_pool_gives_the_serial_plan():
    serial = plan_llm(CLUSTER, JOB, top=3)
    with make_executor(2) as pool:
        pooled = plan_llm(CLUSTER, JOB, top=3, executor=pool)
    assert [f.tried for f in pooled.fabrics] == [f.tried for f in serial.fabrics]
    assert json.dumps(llm_plan_to_json(pooled), sort_keys=True) == \
        json.dumps(llm_plan_to_json(serial), sort_keys=True)
