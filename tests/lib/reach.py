"""Whether a TCP port answers, as a client on the nodes' network sees it: what the firewall tests assert.

A firewall's drop gets no answer at all, so it is known only when the attempt's timeout has run out;
`at_once` lets a test's independent attempts wait out their timeouts together instead of one after
another. An open or closed port answers (SYN-ACK or RST) within milliseconds on the harness's bridge.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

DROPPED = "dropped"


def connect(host: str, port: int, source: str | None = None, timeout: float = 3.0) -> str:
    """"open", "refused", or DROPPED (no answer within `timeout`: a firewall's drop), from this machine's
    address `source` when given."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        if source:
            sock.bind((source, 0))
        try:
            sock.connect((host, port))
        except TimeoutError:
            return DROPPED
        except ConnectionRefusedError:
            return "refused"
        return "open"


def at_once(*attempts) -> list:
    """The outcomes of independent attempts (callables), in order, all made at the same time."""
    with ThreadPoolExecutor(max_workers=len(attempts)) as pool:
        return [future.result() for future in [pool.submit(attempt) for attempt in attempts]]
