"""The seed's load-bearing flags, written out from deployment-facts.md.

"The field-tested launch command", in its order, each flag with its value
(None for a bare switch). --model-path and --tp-size are derived from the
inventory and checked apart. Tests compare what the roles produce with this
list, which is deliberately NOT read from the role's flag model: a test that
read the model could not catch the model drifting from the field-tested set.
"""

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
