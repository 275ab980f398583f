"""Which Ray placements can never fit a cluster (refused at once, exit 2) and which may
(left to Ray to wait for free resources)."""

from equipoise.launch.ray_cluster import infeasible

NODE = {"CPU": 2.0, "memory": 1e9}


def test_more_cpus_than_the_cluster_has_is_never_held_and_a_fraction_is_suggested():
    # README's steps on a 2-core machine: 2 servers and 3 workers of 1 CPU each
    reason = infeasible([{"CPU": 1.0}] * 5, "SPREAD", [NODE])
    assert "5 CPU in all (5 actors)" in reason and "2 CPU on 1 node" in reason
    assert "worker_resources = {CPU = 0.4} and server_resources = {CPU = 0.4}" in reason
    assert infeasible([{"CPU": 0.4}] * 5, "SPREAD", [NODE]) is None


def test_a_bundle_no_node_holds_and_the_strict_strategies():
    nodes = [NODE, NODE]
    assert "no node holds" in infeasible([{"CPU": 3.0}], "PACK", nodes)  # 4 in all, but 2 a node
    assert "GPU" in infeasible([{"CPU": 1.0, "GPU": 1.0}], "SPREAD", nodes)
    assert "STRICT_PACK" in infeasible([{"CPU": 1.0}] * 3, "STRICT_PACK", nodes)
    assert infeasible([{"CPU": 1.0}] * 2, "STRICT_PACK", nodes) is None
    assert "STRICT_SPREAD" in infeasible([{"CPU": 0.5}] * 3, "STRICT_SPREAD", nodes)
    assert infeasible([{"CPU": 1.0}] * 4, "SPREAD", nodes) is None
