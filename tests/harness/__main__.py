"""Command line of the simulated Spark node harness.

    python -m tests.harness image                 # build or reuse the node image
    python -m tests.harness up [-i NAME] [-n 2]   # boot N nodes, print the inventory path
    python -m tests.harness knob -i NAME spark-1 '{"gpu": {"present": false}}'
    python -m tests.harness down [-i NAME]        # remove every trace of the instance
    python -m tests.harness status                # instances and leftovers
"""

from __future__ import annotations

import argparse
import json
import sys

from . import cluster, image


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image", help="build or reuse the cached node image and wheelhouse")
    up = sub.add_parser("up", help="create and boot an instance")
    up.add_argument("-i", "--instance", default="sim")
    up.add_argument("-n", "--nodes", type=int, default=2)
    up.add_argument("--knobs", default="{}", help='JSON {"spark-1": {"gpu": {...}}}')
    up.add_argument("--hub", action="store_true",
                    help="serve the synthetic checkpoint from a hub emulator on the bridge and point the inventory at it")
    down = sub.add_parser("down", help="tear an instance down completely")
    down.add_argument("-i", "--instance", default="sim")
    knob = sub.add_parser("knob", help="change a node's stand-in knobs")
    knob.add_argument("-i", "--instance", default="sim")
    knob.add_argument("node")
    knob.add_argument("json")
    again = sub.add_parser("reinstall", help="re-provision one node with a fresh OS (new host keys), the others keep running")
    again.add_argument("-i", "--instance", default="sim")
    again.add_argument("node")
    again.add_argument("--knobs", default="{}", help='JSON {"gpu": {...}} for the fresh node')
    sub.add_parser("status", help="list instances and anything left behind")
    args = p.parse_args(argv)

    if args.cmd == "image":
        rootfs = image.ensure_image(cluster.CACHE_ROOT)
        image.ensure_wheelhouse(cluster.CACHE_ROOT, rootfs)
        print(rootfs)
    elif args.cmd == "up":
        c = cluster.up(args.instance, args.nodes, json.loads(args.knobs), hub=args.hub)
        print(c.inventory)
    elif args.cmd == "down":
        cluster.down(args.instance)
    elif args.cmd == "knob":
        cluster.set_knobs(args.instance, args.node, json.loads(args.json))
    elif args.cmd == "reinstall":
        cluster.reinstall(args.instance, args.node, json.loads(args.knobs))
    elif args.cmd == "status":
        for c in cluster.instances():
            print(f"{c.instance}: " + ", ".join(f"{n.name}={n.mgmt_ip}" for n in c.nodes))
        for item in cluster.leftovers():
            print(f"present: {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
