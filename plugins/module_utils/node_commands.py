"""Commands a module runs on a node beyond AnsibleModule.run_command, which runs one command and waits for it.

The doctor's probe reads many things at once from a thread pool, each with its own timeout, and a tool that
is not there must read as the shell says it (127), not fail the probe: run_concurrently. The checkpoint
sync keeps processes running while it works (the rsync daemon, the streams whose progress it reads as they
go): start, whose child dies with the module however the module ends. Standard library only.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess


def run_concurrently(argv: list[str], timeout: float = 120) -> dict:
    """A read's result ({rc, stdout, stderr, cmd}); safe from any thread; never raises: a command that is not
    there or does not end in `timeout` seconds answers rc 127 with the reason in stderr."""
    try:
        proc = subprocess.run(argv, capture_output=True, check=False, timeout=timeout)  # noqa: S603 - fixed argv
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc), "cmd": argv}
    return {"rc": proc.returncode, "cmd": argv,
            "stdout": proc.stdout.decode("utf-8", errors="replace").rstrip("\r\n"),
            "stderr": proc.stderr.decode("utf-8", errors="replace").rstrip("\r\n")}


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when the module's process ends, however it ends (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start(argv: list[str], **popen: object) -> subprocess.Popen:
    """A child the module manages while it works, killed by the kernel when the module's process ends.

    Start it from the module's main thread before any other thread exists: the parent-death signal follows
    the thread that forks, and a fork beside running threads is unsafe. `popen` goes to subprocess.Popen.
    """
    return subprocess.Popen(argv, preexec_fn=die_with_parent, **popen)  # noqa: S603, PLW1509 - see the docstring


def pipe(producer: list[str], consumer: list[str], timeout: float) -> tuple[int, int, str]:
    """`producer | consumer`, without a shell: (producer's rc, consumer's rc, what either said on stderr, the
    consumer's stdout when it said nothing there). Both are killed when the pipeline outlives `timeout`
    (rc -9 for both)."""
    left = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # noqa: S603 - fixed argv
    right = subprocess.Popen(consumer, stdin=left.stdout, stdout=subprocess.PIPE,  # noqa: S603 - fixed argv
                             stderr=subprocess.PIPE)
    left.stdout.close()  # the consumer holds the read end: the producer sees EPIPE if it goes away
    try:
        out, err = right.communicate(timeout=timeout)
        left_err = left.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        left.kill()
        right.kill()
        left.wait()
        right.wait()
        return -9, -9, f"did not finish within {timeout:g} s"
    said = (left_err or err).decode("utf-8", errors="replace").strip() or out.decode("utf-8", errors="replace").strip()
    return left.returncode, right.returncode, said
