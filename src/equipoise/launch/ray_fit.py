"""Whether a Ray cluster can ever hold a job's placement group (the Ray launcher's check
before it asks Ray to place the job, ray_cluster.py)."""

from __future__ import annotations

import math


def infeasible(bundles: list[dict], strategy: str, nodes: list[dict]) -> str | None:
    """Why no placement of `bundles` (one per actor) under `strategy` can ever fit the
    cluster of `nodes` (each node's total resources), or None if one may: a total over
    the cluster, a bundle no node holds, STRICT_PACK's sum on no node, STRICT_SPREAD's
    bundles on fewer nodes than actors. (Whether free resources suffice now is Ray's to
    wait for.)"""
    totals: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    asked: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            asked[k] = asked.get(k, 0.0) + float(v)
    eps = 1e-9
    for k, v in sorted(asked.items()):
        if v > totals.get(k, 0.0) + eps:
            hint = ""
            if totals.get(k, 0.0) > 0:
                share = math.floor(100 * totals[k] / len(bundles)) / 100
                hint = (f" (at most {share:g} {k} per actor fits: worker_resources = {{{k} = {share:g}}} and "
                        f"server_resources = {{{k} = {share:g}}})")
            return (f"it asks for {v:g} {k} in all ({len(bundles)} actors) and the cluster has "
                    f"{totals.get(k, 0.0):g} {k} on {len(nodes)} node(s){hint}")

    def fits(bundle: dict, node: dict) -> bool:
        return all(node.get(k, 0.0) + eps >= v for k, v in bundle.items())

    for b in bundles:
        if not any(fits(b, n) for n in nodes):
            return f"no node holds one actor's {b} (nodes: {nodes})"
    if strategy == "STRICT_PACK" and not any(fits(asked, n) for n in nodes):
        return f"STRICT_PACK puts every actor on one node, and no node holds {asked}"
    if strategy == "STRICT_SPREAD" and len(bundles) > len(nodes):
        return f"STRICT_SPREAD puts every actor on a node of its own: {len(bundles)} actors, {len(nodes)} nodes"
    return None
