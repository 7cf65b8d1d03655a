"""What a test module could leave behind on a simulated node, to prove a shared pair came back unchanged.

Test modules that only read node state share one booted pair (tests/conftest.py). This is the
check that keeps that honest: a fingerprint of everything a later module could observe, taken
when the pair has booted and compared after each module that used it.

- files: the node's root is an overlay of the cached image; every file the node changed is in
  its upper directory. Each path ever there is described through the merged view (type, mode,
  owner, content digest or link target, or absent) and compared with what it was at boot (the
  image's own copy for a path the node had not touched yet). Paths the OS itself keeps changing
  (journal, systemd's timer stamps and caches, Ansible's remote temp directory) are left out.
- units: every unit that is active, in transition or failed, except login sessions, what
  the node's own timers start and mount units (the mounts themselves are compared below).
- mounts, addresses, links, routes and the nftables ruleset.
- processes, except the probe's own and SSH's per-connection ones.
- /tmp (a tmpfs inside the node, not in the overlay).

The stand-in knobs (/etc/spark-sim/node.json) are test controls, not node state: they are put
back as they were at boot before comparing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import cluster as sim

KNOBS = "etc/spark-sim/node.json"
# Paths (relative to /) the OS or the tools change by themselves on any node; not test state.
VOLATILE = (
    "var/log/",
    "var/lib/systemd/",
    "var/cache/",
    # The image's Prometheus (started at boot) writes its own write-ahead log as time passes.
    "var/lib/prometheus/",
    # The stand-in for /proc/sys/vm/drop_caches (tests/standins/README.md): a kernel switch, not a file, on DGX OS.
    "var/lib/spark-sim-proc/",
    # The stand-ins' own bytecode: the docker CLI stand-in is a module its shim imports, compiled at its first start.
    "usr/lib/spark-sim/__pycache__/",
    "root/.ansible/",
    "etc/ld.so.cache",
    "etc/.pwd.lock",
    "etc/.updated",
    "var/.updated",
)

# One SSH round trip per node; sections are split on the marker lines.
PROBE = r"""
echo '@@units'
systemctl list-units --state=active,activating,deactivating,reloading,failed --plain --no-legend --no-pager \
  | awk '{print $1, $3, $4}'
echo '@@timers'
systemctl list-timers --all --plain --no-legend --no-pager | awk '{print $NF}'
echo '@@mounts'
findmnt -rn -o TARGET,FSTYPE,SOURCE,OPTIONS
echo '@@links'
ip -o link show | sed -E 's/^[0-9]+: //; s/ qlen [0-9]+//'
echo '@@addresses'
# Not the IPv6 link-local addresses the kernel gives every link that is up, a second or two after it came up
# (a snapshot taken right after boot may be early): the links' state is compared above.
ip -o addr show | sed -E 's/^[0-9]+: //' | grep -v ' proto kernel_ll '
echo '@@routes'
# Not the kernel's routes for those link-local addresses and for IPv6 multicast, which follow the same timing.
ip route show table all | grep -vE '^(local fe80::|fe80::/64 |multicast ff00::/8 ).* proto kernel'
echo '@@nft'
nft list ruleset 2>&1
echo '@@processes'
ps -e -o sid=,cgroup:400=,args:1000= | awk -v me="$(ps -o sid= -p $$)" '$1 != me + 0 {$1 = ""; print substr($0, 2)}'
echo '@@tmp'
find /tmp -mindepth 1 -not -path '/tmp/systemd-private-*' -printf '%y %m %u %s %P\n'
"""
# Processes that come and go on their own: SSH sessions (Ansible's persistent connections too), the workers
# systemd-udevd forks for device events (a link's MTU or state changed) and reaps once they have been idle a while,
# and the `ip` reads the RoCE stand-in runs for each link or address event (a CI run caught one in flight); the
# stand-in's daemon itself is still compared.
TRANSIENT_PROCESSES = ("sshd-session", "sshd: ", "(sd-pam)", "systemd --user", "(udev-worker)",
                       "/system.slice/spark-sim-roce.service ip ")


def _describe(path: Path):
    """What a later reader of `path` would find (None: nothing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return None  # an overlay whiteout: deleted
    kind = stat.S_IFMT(st.st_mode)
    base = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return (*base, digest.hexdigest())
    if stat.S_ISLNK(st.st_mode):
        return (*base, os.readlink(path))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return (*base, st.st_rdev)
    return base


def _upper_paths(upper: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(upper):
        rel = os.path.relpath(dirpath, upper)
        for name in dirnames + filenames:
            path = name if rel == "." else f"{rel}/{name}"
            if not path.startswith(VOLATILE) and path + "/" not in VOLATILE:
                out.add(path)
    return out


def _lower_dirs(merged: Path) -> list[Path]:
    """The overlay's read-only layers, from the mount table."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(merged) and fields[2] == "overlay":
            for option in fields[3].split(","):
                if option.startswith("lowerdir="):
                    return [Path(p) for p in option[len("lowerdir="):].split(":")]
    raise RuntimeError(f"{merged} is not an overlay mount")


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = out.setdefault(line[2:], [])
        elif current is not None and line.strip():
            current.append(line)
    return out


@dataclass
class NodeState:
    """One node's fingerprint; `diff` names what changed since `self` was taken."""

    name: str
    files: dict[str, object]
    live: dict[str, list[str]]
    lower: list[Path] = field(default_factory=list)

    def diff(self, now: NodeState) -> list[str]:
        out = []
        for path in sorted(set(self.files) | set(now.files)):
            before = self.files[path] if path in self.files else _from_lower(self.lower, path)
            after = now.files[path] if path in now.files else _from_lower(self.lower, path)
            if before != after:
                out.append(f"{self.name}: /{path}: {_show(before)} -> {_show(after)}")
        ignored = {line for line in self.live.get("timers", [])} | {line for line in now.live.get("timers", [])}
        for section in ("units", "mounts", "links", "addresses", "routes", "nft", "processes", "tmp"):
            keep = _filter(section, ignored)
            before, after = keep(self.live.get(section, [])), keep(now.live.get(section, []))
            for line in sorted(set(after) - set(before)):
                out.append(f"{self.name}: {section}: + {line}")
            for line in sorted(set(before) - set(after)):
                out.append(f"{self.name}: {section}: - {line}")
        return out


def _from_lower(lower: list[Path], path: str):
    for layer in lower:
        found = _describe(layer / path)
        if found is not None or os.path.lexists(layer / path):
            return found
    return None


def _show(description) -> str:
    if description is None:
        return "absent"
    kind = {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFLNK: "link"}.get(description[0], "special")
    return f"{kind} mode {description[1]:o} owner {description[2]}:{description[3]}" + (
        f" {str(description[4])[:12]}" if len(description) > 4 else "")


def _filter(section: str, timer_units: set[str]):
    def keep(lines: list[str]) -> list[str]:
        if section == "units":
            # Not the mount units: systemd makes one for a mount it sees in the mount table, which it may do only
            # well after boot for mounts made early in it (the RoCE stand-in's sysfs overlay: a CI run found 30 of
            # them "added" after a module that mounted nothing). The mounts section compares the mounts themselves.
            return [line for line in lines if not line.startswith(("session-", "user@", "user-runtime-dir@"))
                    and line.split()[0] not in timer_units and not line.split()[0].endswith(".mount")]
        if section == "processes":
            return [line for line in lines if not any(t in line for t in TRANSIENT_PROCESSES)]
        return lines
    return keep


def snapshot(cluster: sim.Cluster) -> list[NodeState]:
    """The fingerprint of every node of `cluster`."""
    out = []
    for n in cluster.nodes:
        merged = Path(n.dir) / "merged"
        paths = _upper_paths(Path(n.dir) / "upper")
        files = {path: _describe(merged / path) for path in paths}
        out.append(NodeState(n.name, files, _sections(sim.ssh(n, PROBE, timeout=60)), _lower_dirs(merged)))
    return out


def changes(baseline: list[NodeState], cluster: sim.Cluster) -> list[str]:
    """What differs on `cluster`'s nodes from `baseline` (empty: nothing a later module could see)."""
    now = {s.name: s for s in snapshot(cluster)}
    found = []
    for before in baseline:
        found += before.diff(now[before.name])
    return found


def knobs_of(cluster: sim.Cluster) -> dict[str, bytes]:
    return {n.name: (Path(n.dir) / "merged" / KNOBS).read_bytes() for n in cluster.nodes}


def restore_knobs(cluster: sim.Cluster, saved: dict[str, bytes]) -> None:
    """Put the stand-in knobs back as they were (and nvidia-smi back in place if a test removed it)."""
    for n in cluster.nodes:
        merged = Path(n.dir) / "merged"
        (merged / KNOBS).write_bytes(saved[n.name])
        sim.set_knobs_in(merged, {})
