"""A node's local images as the docker CLI reports them: a pull that says whether it brought a newer image, and
the ID and platform of an image (the server role's probe and its derived-image build both decide from these).
Standard library only."""

from __future__ import annotations

import json


def pull(module, docker: str, ref: str, where: str = "") -> tuple[bool, str]:
    """`docker pull ref`: (whether a newer image came down, the CLI's output); fails the module naming `ref`."""
    rc, out, err = module.run_command([docker, "pull", ref])
    if rc != 0:
        module.fail_json(msg=f"docker pull {ref} failed{where}: {err.strip() or out.strip()}", rc=rc, stdout=out,
                         stderr=err)
    return "Downloaded newer image" in out, out


def inspect(module, docker: str, ref: str) -> dict:
    """{Id, Os, Architecture, rc, stderr} of the local image `ref` (empty values and rc != 0 when it is not there
    or the output cannot be read)."""
    rc, out, err = module.run_command([docker, "image", "inspect", ref])
    image = {"rc": rc, "stderr": err.strip(), "Id": "", "Os": "", "Architecture": ""}
    if rc == 0:
        try:
            info = (json.loads(out) or [{}])[0]
            image.update(Id=info.get("Id") or "", Os=info.get("Os") or "", Architecture=info.get("Architecture") or "")
        except (ValueError, IndexError, AttributeError):
            image.update(rc=1, stderr=f"unreadable docker image inspect output: {out[:200]}")
    return image
