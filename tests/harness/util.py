"""Small process helpers shared by the harness modules."""

from __future__ import annotations

import subprocess
import sys


def log(msg: str) -> None:
    print(f"harness: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, check: bool = True, capture: bool = False, quiet: bool = False,
        input: str | None = None) -> str:
    """Run a command; on failure raise with its output so the cause is visible."""
    proc = subprocess.run(
        cmd,
        input=input,
        text=True,
        stdout=subprocess.PIPE if (capture or quiet) else None,
        stderr=subprocess.PIPE if (capture or quiet) else None,
    )
    if check and proc.returncode != 0:
        detail = ((proc.stdout or "") + (proc.stderr or "")).strip()
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{detail[-4000:]}")
    return proc.stdout or ""
