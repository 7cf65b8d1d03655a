"""The settings a vLLM site on the simulated nodes needs for its derived image: the recipe's sparse-MLA kernel
fix on top of vLLM's image, as an operator's build context (vLLM's upstream image cannot start on GB10). What
its RUN step would change the stand-in cannot run, so a label tells the docker stand-in that the image carries
the fix (tests/standins/README.md, docker). test_vllm.py's site and the benchmark's vLLM pair both deploy it."""

from __future__ import annotations

import hashlib
from pathlib import Path

DOCKERFILE = ("ARG SPARK_BASE_IMAGE\nFROM ${SPARK_BASE_IMAGE}\nCOPY sparse-mla-sm121.patch /opt/spark/\n"
              "LABEL org.spark-sim.vllm='{\"sparse_mla_sm121\": true}'\n")


def sm121_fix_build(context: Path) -> dict:
    """Write the build context into `context` (an empty directory); the server role's settings that build it."""
    (context / "Dockerfile").write_text(DOCKERFILE)
    (context / "sparse-mla-sm121.patch").write_text("sm_121 build of the sparse-MLA kernels\n")
    return {"server_image_build_context": str(context),
            "server_image_build_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                          for p in sorted(context.iterdir())}}
