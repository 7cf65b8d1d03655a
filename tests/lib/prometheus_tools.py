"""Prometheus's own tools for the tests, from the distribution's packages, without installing anything.

promtool (package `prometheus`) checks and unit-tests the alert rules; the node exporter (package
`prometheus-node-exporter`) shows which metric names it serves. Neither is installed on the test
machine: the package is fetched with `apt-get download` (the machine's Debian mirror, no service is
started, no package database touched) and unpacked with `dpkg-deb -x` into a cache directory, once.
A binary already on PATH is used as it is.

Also a reader of Prometheus's text exposition format, enough for the metric names, labels and values
the tests compare.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("SPARK_TOOLS_CACHE")
             or ("/var/cache/spark-sim/tools" if os.geteuid() == 0 else Path.home() / ".cache" / "spark-sim" / "tools"))


def debian_binary(package: str, binary: str) -> Path:
    """`binary` from Debian's `package`: on PATH, else unpacked from the package into the cache."""
    found = shutil.which(binary)
    if found:
        return Path(found)
    target = CACHE / package / "usr" / "bin" / binary
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{package}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            fetched = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True,
                                     check=False)
            debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
            if fetched.returncode != 0 or not debs:
                raise RuntimeError(
                    f"cannot fetch Debian's {package} for its {binary} (apt-get download {package}: "
                    f"{(fetched.stderr or fetched.stdout).strip()[-400:]}). Fix: refresh the package lists "
                    f"(apt-get update, as root), or put {binary} on PATH.")
            unpacked = Path(tmp) / "root"
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
            shutil.rmtree(CACHE / package, ignore_errors=True)
            unpacked.rename(CACHE / package)
    return target


def promtool() -> Path:
    return debian_binary("prometheus", "promtool")


def node_exporter() -> Path:
    return debian_binary("prometheus-node-exporter", "prometheus-node-exporter")


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def prometheus_api(address: str, path: str, **params) -> dict:
    """The data of Prometheus's HTTP API at `address` (its port 9090), as an allowed client asks it."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://{address}:9090/api/v1/{path}{query}", timeout=10) as resp:  # noqa: S310 - a simulated node
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def parse_exposition(text: str) -> dict:
    """{families: {name: type}, samples: [(name, {label: value}, float)]} of a text exposition."""
    families, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind.strip()
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            if not match:
                raise ValueError(f"not a sample line: {line!r}")
            labels = dict(LABEL.findall(match.group("labels") or ""))
            samples.append((match.group("name"), labels, float(match.group("value"))))
    return {"families": families, "samples": samples}


def sample(parsed: dict, metric: str, /, **labels) -> float | None:
    """The value of the sample `metric` whose labels include `labels`, else None."""
    for found, have, value in parsed["samples"]:
        if found == metric and all(have.get(k) == str(v) for k, v in labels.items()):
            return value
    return None
