"""A client that keeps asking while a change runs, counting what was answered and what failed: the gateway tests'
and the gateway bench's measure of "no failed request" (tests/integration/test_groups.py, benchmarks/gateway.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LoopingClient(threading.Thread):
    """Calls `ask` (True when a request was answered) until stopped, counting `ok` and `failed`; `watch` is called
    between two requests. A client's pace, not a load test: the run under test shares the machine's two cores."""

    def __init__(self, ask: Callable[[], bool], watch: Callable[[], None] | None = None, pause: float = 0.05):
        super().__init__(daemon=True)
        self.ask, self.watch, self.pause = ask, watch, pause
        self.ok, self.failed = 0, 0
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            if self.ask():
                self.ok += 1
            else:
                self.failed += 1
            if self.watch:
                self.watch()
            self.stopping.wait(self.pause)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        self.join(timeout=120)
