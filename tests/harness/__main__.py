"""Command line of the simulated Spark node harness.

    python -m tests.harness image                 # build or reuse the node image
    python -m tests.harness up [-i NAME] [-n 2]   # boot N nodes, print the inventory path
    python -m tests.harness knob -i NAME spark-1 '{"gpu": {"present": false}}'
    python -m tests.harness down [-i NAME]        # remove every trace of the instance
    python -m tests.harness power-cycle -i NAME [--off-seconds S] (--all | NODE...)
    python -m tests.harness power-off -i NAME (--all | NODE...)   # pull the plug, keep the disk
    python -m tests.harness power-on -i NAME (--all | NODE...)    # boot the same disk again
    python -m tests.harness status                # instances, nodes on or off, leftovers
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
    up.add_argument("--site-rails", type=int, choices=(1, 2), default=2,
                    help="rails the inventory names (the nodes always have two): 1 is a one-rail site")
    up.add_argument("--tp-groups", type=int, default=1,
                    help="make that many TP groups of the nodes (replica_a, ...) in the inventory")
    up.add_argument("--hub", action="store_true",
                    help="serve the synthetic checkpoint from a hub emulator on the bridge and point the inventory at it")
    up.add_argument("--ring", action="store_true",
                    help="cable the nodes (three or four) in a ring without a switch, one TP group")
    recable = sub.add_parser("recable", help="cable a ring again in the order of the nodes named")
    recable.add_argument("-i", "--instance", default="sim")
    recable.add_argument("nodes", nargs="+", metavar="NODE")
    recable.add_argument("--open", action="store_true", help="leave the cable from the last node to the first out")
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
    regroup = sub.add_parser("regroup", help="write the inventory again for another number of TP groups; the nodes keep "
                                             "their state")
    regroup.add_argument("-i", "--instance", default="sim")
    regroup.add_argument("tp_groups", type=int)
    power = {
        "power-cycle": "power nodes off together (no shutdown), then on; root filesystems, host keys and network kept",
        "power-off": "pull the nodes' plugs: killed at once, no shutdown; their disks stay",
        "power-on": "boot nodes that are off with the disks and network they had; returns when sshd answers",
    }
    for name, text in power.items():
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("-i", "--instance", default="sim")
        if name == "power-cycle":
            cmd.add_argument("--off-seconds", type=float, default=0.0, help="how long the nodes stay off")
        cmd.add_argument("--all", action="store_true", help="every node of the instance")
        cmd.add_argument("nodes", nargs="*", metavar="NODE")
    sub.add_parser("status", help="list instances, their nodes' power and anything left behind")
    args = p.parse_args(argv)
    if args.cmd in power and bool(args.all) == bool(args.nodes):
        p.error(f"{args.cmd}: name the nodes or give --all (not both)")

    if args.cmd == "image":
        rootfs = image.ensure_image(cluster.CACHE_ROOT)
        image.ensure_wheelhouse(cluster.CACHE_ROOT, rootfs)
        print(rootfs)
    elif args.cmd == "up":
        c = cluster.up(args.instance, args.nodes, json.loads(args.knobs), hub=args.hub, site_rails=args.site_rails,
                       tp_groups=args.tp_groups, ring=args.ring)
        print(c.inventory)
    elif args.cmd == "recable":
        cluster.recable(args.instance, args.nodes, closed=not args.open)
    elif args.cmd == "down":
        cluster.down(args.instance)
    elif args.cmd == "knob":
        cluster.set_knobs(args.instance, args.node, json.loads(args.json))
    elif args.cmd == "regroup":
        print(cluster.regroup(args.instance, args.tp_groups).inventory)
    elif args.cmd == "reinstall":
        cluster.reinstall(args.instance, args.node, json.loads(args.knobs))
    elif args.cmd == "power-cycle":
        cluster.power_cycle(args.instance, args.nodes or None, args.off_seconds)
    elif args.cmd == "power-off":
        for node in args.nodes or [n.name for n in cluster.instance_nodes(args.instance)]:
            cluster.power_off(args.instance, node)
    elif args.cmd == "power-on":
        for node in args.nodes or [n.name for n in cluster.instance_nodes(args.instance)]:
            cluster.power_on(args.instance, node)
    elif args.cmd == "status":
        for c in cluster.instances():
            print(f"{c.instance}: " + ", ".join(f"{n.name}={n.mgmt_ip} ({cluster.power_state(c.instance, n.name)})"
                                                for n in c.nodes))
        for item in cluster.leftovers():
            print(f"present: {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
