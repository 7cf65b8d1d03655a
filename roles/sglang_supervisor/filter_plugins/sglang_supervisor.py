"""The supervisor's view of the TP group, from the inventory."""

from __future__ import annotations


def sglang_supervisor_nodes(nodes, hostvars, head):
    """Every rank in rank order with the address the supervisor reaches it on (its fabric address)."""
    return [{"name": n, "address": str(hostvars[n]["spark_fabric_ip"]), "local": n == head} for n in nodes]


class FilterModule:
    def filters(self):
        return {"sglang_supervisor_nodes": sglang_supervisor_nodes}
