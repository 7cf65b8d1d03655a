"""The simulated Spark node image: a debootstrapped Debian with real systemd.

Built once and cached under the cache root, keyed by everything that goes
into it; a second build with the same inputs is a no-op.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from .util import log, run

# trixie: its netplan 1.1 applies inside a container; bookworm's 0.106 does not.
SUITE = "trixie"
MIRROR = os.environ.get("SPARK_SIM_MIRROR", "http://deb.debian.org/debian")

# What DGX OS nodes have that the roles rely on, and that a node without
# internet cannot install later.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "udev", "openssh-server", "openssh-client",
    "python3", "python3-apt", "python3-venv", "python3-pip",
    "netplan.io", "iproute2", "iputils-ping", "iperf3", "nftables", "rsync", "curl",
    "ca-certificates", "procps", "sudo", "less", "jq", "ethtool", "kmod",
    # The TLS proxy the server role installs with apt (server_tls): nodes have no mirror.
    "nginx",
    # Monitoring from the distribution's packages (the monitoring role installs them with apt):
    # Prometheus (with promtool) on the monitoring host, the node exporter on every node.
    "prometheus", "prometheus-node-exporter",
    # The guard role's earlyoom, which it installs with apt.
    "earlyoom",
]

# Clears the read-write /sys condition so udevd starts in the container;
# without udevd, `netplan apply` fails on its udev reload. The fix belongs to
# the test node, not to the roles, which run the same commands as on DGX OS.
UDEVD_DROPIN = "[Unit]\nConditionPathIsReadWrite=\n"

# Debian's sshd refuses root password logins but accepts keys; nothing else
# needs changing. Nodes have no DNS: skip reverse lookups.
SSHD_DROPIN = "UseDNS no\n"

# Node-side Python packages the roles install from a site's package index.
# Nodes have no internet, so the harness serves them from a local wheelhouse.
WHEELHOUSE_REQUIREMENTS = ["huggingface-hub==2.4.0"]

IMAGE_FORMAT = 6  # bump when the customisation below changes meaningfully


def image_key() -> str:
    material = json.dumps(
        {
            "suite": SUITE,
            "packages": sorted(PACKAGES),
            "udevd": UDEVD_DROPIN,
            "sshd": SSHD_DROPIN,
            "format": IMAGE_FORMAT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def wheelhouse_key(node_python: str) -> str:
    material = json.dumps({"reqs": WHEELHOUSE_REQUIREMENTS, "py": node_python}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _customise(rootfs: Path) -> None:
    dropin = rootfs / "etc/systemd/system/systemd-udevd.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "10-spark-sim.conf").write_text(UDEVD_DROPIN)
    (rootfs / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ssh/sshd_config.d/10-spark-sim.conf").write_text(SSHD_DROPIN)
    # Each node gets its own host keys and machine-id at creation.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "etc/machine-id").write_text("")
    # DGX OS renders netplan for systemd-networkd.
    run(["chroot", str(rootfs), "systemctl", "enable", "systemd-networkd.service"], quiet=True)
    # Debian's ssh host key generation would race the per-node keys.
    run(["chroot", str(rootfs), "systemctl", "mask", "ssh-keygen.service"], check=False, quiet=True)
    # Installed only so the server role's apt task finds it: like a node without the package, nothing
    # listens until the role starts nginx (server_tls).
    run(["chroot", str(rootfs), "systemctl", "disable", "nginx.service"], check=False, quiet=True)
    # The same for the monitoring packages: Debian enables them on install; a node the monitoring role
    # has not configured runs no Prometheus and no exporter.
    # earlyoom too: a node the guard role has not set up runs none.
    for unit in [*sorted((rootfs / "usr/lib/systemd/system").glob("prometheus*")), Path("earlyoom.service")]:
        run(["chroot", str(rootfs), "systemctl", "disable", unit.name], check=False, quiet=True)
    # Debian's housekeeping timers (dpkg-db-backup, apt-daily, fstrim, tmpfiles-clean) change a node on
    # the wall clock's schedule: at midnight dpkg-db-backup writes /var/backups/*.0 on every node, which
    # a shared pair's drift check then blames on whichever module ran. Nothing a test exercises needs them.
    timers = {p.name for p in (rootfs / "usr/lib/systemd/system").glob("*.timer")}
    for timer in sorted(timers):
        run(["chroot", str(rootfs), "systemctl", "mask", timer], check=False, quiet=True)
    (rootfs / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    # apt caches are dead weight in every overlay.
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


def ensure_image(cache_root: Path) -> Path:
    """Return the root filesystem for the current image key, building it if needed."""
    images = cache_root / "images"
    images.mkdir(parents=True, exist_ok=True)
    key = image_key()
    final = images / key / "rootfs"
    with open(images / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (images / key / "complete").exists():
            return final
        for tool in ("debootstrap", "systemd-nspawn"):
            if shutil.which(tool) is None:
                sys.exit(f"harness: {tool} is missing; run as root: apt-get install debootstrap systemd-container")
        staging = images / f"{key}.building"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        log(f"building node image {key} (Debian {SUITE}); this takes a few minutes once")
        run(
            [
                "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                SUITE, str(staging / "rootfs"), MIRROR,
            ],
            quiet=True,
        )
        _customise(staging / "rootfs")
        shutil.rmtree(images / key, ignore_errors=True)
        staging.rename(images / key)
        (images / key / "complete").write_text(key + "\n")
        _prune(images, keep=key)
        return final


def _prune(images: Path, keep: str) -> None:
    # An image a running node's overlay still reads from stays: deleting its files under a mounted
    # overlay breaks that node (another session's cluster, booted from an older image).
    try:
        mounted = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mounted = ""
    for old in images.iterdir():
        if old.is_dir() and old.name != keep and not (old / "in-use").exists() and f"lowerdir={old}/" not in mounted:
            shutil.rmtree(old, ignore_errors=True)


def node_python_version(rootfs: Path) -> str:
    out = run(
        ["chroot", str(rootfs), "python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture=True,
    )
    return out.strip()


def ensure_wheelhouse(cache_root: Path, rootfs: Path) -> Path:
    """Wheels for the node's Python, fetched on this machine (nodes have no internet)."""
    py = node_python_version(rootfs)
    house = cache_root / "wheels" / wheelhouse_key(py)
    house.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers boot clusters at the same time: one fetches, the others wait.
    with open(house.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (house / "complete").exists():
            return house
        house.mkdir(parents=True, exist_ok=True)
        log(f"fetching node wheelhouse for Python {py}")
        run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                "--only-binary=:all:", "--python-version", py, "--implementation", "cp",
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux_2_17_x86_64", "--platform", "linux_x86_64", "--platform", "any",
                "-d", str(house), *WHEELHOUSE_REQUIREMENTS,
            ],
            quiet=True,
        )
        (house / "complete").write_text(py + "\n")
        return house
