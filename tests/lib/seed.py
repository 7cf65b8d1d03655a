"""The seed's load-bearing flags, written out from deployment-facts.md: the one copy the tests use.

"The field-tested launch command", in its order, each flag with its value
(None for a bare switch). --model-path and --tp-size are derived from the
inventory and checked apart. Tests compare what the roles produce with this
list, which is deliberately NOT read from the role's flag model: a test that
read the model could not catch the model drifting from the field-tested set.
`facts_launch_args()` reads the facts file itself, so that the list is checked
against it wherever the file is beside the checkout.
"""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FACTS = REPO.parent / "shared" / "reference" / "deployment-facts.md"

SEED_FLAGS = [
    ("--trust-remote-code", None),
    ("--attention-backend", "dsa"),
    ("--dsa-prefill-backend", "tilelang"),
    ("--dsa-decode-backend", "tilelang"),
    ("--moe-runner-backend", "flashinfer_cutlass"),
    ("--kv-cache-dtype", "bfloat16"),
    ("--disable-shared-experts-fusion", None),
    ("--reasoning-parser", "glm45"),
    ("--tool-call-parser", "glm47"),
    ("--mem-fraction-static", "0.84"),
    ("--context-length", "65536"),
    ("--max-running-requests", "2"),
]


def flatten(pairs) -> list[str]:
    """(flag, value) pairs as the words of a command line."""
    return [word for flag, value in pairs for word in ((flag,) if value is None else (flag, value))]


def seed_args(without=()) -> list[str]:
    """The seed flags as command-line words, in order, leaving out the flags named in `without`."""
    unknown = set(without) - {flag for flag, _ in SEED_FLAGS}
    if unknown:
        raise ValueError(f"not seed flags: {sorted(unknown)}")
    return flatten((flag, value) for flag, value in SEED_FLAGS if flag not in without)


# The seed as one command line's words (flags and values), e.g. for a rank started by hand.
SEED_ARGS = seed_args()

# What the roles add to the seed by default, after its flags and before the multi-node ones: SGLang's
# Prometheus endpoint, which the monitoring role scrapes (issue 18). Not field-tested load-bearing
# flags, so not part of the seed; an operator may drop it (`enable-metrics: false`).
ADDED_FLAGS = [("--enable-metrics", None)]
# The seed plus those: what a rank runs with the role defaults, before the topology flags.
DEFAULT_FLAGS = SEED_FLAGS + ADDED_FLAGS
DEFAULT_ARGS = flatten(DEFAULT_FLAGS)


def facts_launch_args() -> list[str]:
    """The words after `python3 -m sglang.launch_server` in the facts file's field-tested command."""
    block = FACTS.read_text().split("python3 -m sglang.launch_server", 1)[1].split("\n\n", 1)[0]
    return shlex.split(block.replace("\\\n", " "))
