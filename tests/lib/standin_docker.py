"""The docker stand-in (tests/standins/bin/docker) run on this machine against a root of its own, as the
server modules' unit tests drive it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DOCKER = Path(__file__).resolve().parents[1] / "standins" / "bin" / "docker"


def docker(root, *args, check=True):
    """`docker args...` of the stand-in whose state lives under `root`; its stdout, stripped."""
    proc = subprocess.run([sys.executable, str(DOCKER), *args], env={**os.environ, "SPARK_SIM_ROOT": str(root)},
                          capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {args}: {proc.stderr}")
    return proc.stdout.strip()


def node_root(base: Path, monkeypatch) -> Path:
    """A node's root for the stand-ins under `base` (no knobs set), made the one the modules run against."""
    root = base / "node"
    (root / "etc" / "spark-sim").mkdir(parents=True)
    (root / "etc" / "spark-sim" / "node.json").write_text("{}")
    monkeypatch.setenv("SPARK_SIM_ROOT", str(root))
    return root
