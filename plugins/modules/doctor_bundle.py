#!/usr/bin/python
"""Write the doctor's diagnostics bundle (already redacted files) as one 0600 tar.gz, in one module call."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: doctor_bundle
short_description: Write the doctor's diagnostics bundle as one tar.gz
description:
  - For the doctor role's internal use (its C(bundle.yml), on the controller); options and return values may
    change with the role.
  - Packs the given files, whose contents the role has already redacted, under one top directory into
    O(dest) (mode 0600, its directory created 0700), in one call instead of one task per file.
  - The role's action plugin of the same name runs this in the controller's own process (no module
    interpreter is started); this module does the same where it runs as a module.
version_added: "1.1.0"
author: LLM serving maintainers (@dgx-spark)
options:
  dest:
    description: Path of the C(.tar.gz) to write; its base name without C(.tar.gz) is the top directory inside.
    type: path
    required: true
  files:
    description: The files, each C({path, content}) with C(path) relative to the top directory.
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is written; it reports the change it would make.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Write the bundle
  dgx_spark.llm_serving.doctor_bundle:
    dest: /srv/reports/doctor-20261130T120000Z.tar.gz
    files:
      - path: spark-0/journal.log
        content: "..."
  delegate_to: localhost
"""

RETURN = r"""
dest:
  description: The bundle written.
  returned: always
  type: str
count:
  description: How many files it holds.
  returned: always
  type: int
"""

import io
import os
import tarfile
import time

from ansible.module_utils.basic import AnsibleModule


def invalid(files):
    """Why the files cannot be bundled (a path that leaves the bundle), or None."""
    for item in files:
        path = str(item.get("path", ""))
        if not path or path.startswith("/") or ".." in path.split("/"):
            return f"bundle file path {path!r} must be relative and stay inside the bundle"
    return None


def write(dest, files):
    """Pack the files under the top directory named by dest into dest (0600, its directory 0700), atomically."""
    top = os.path.basename(dest)
    top = top[: -len(".tar.gz")] if top.endswith(".tar.gz") else top
    os.makedirs(os.path.dirname(dest) or ".", mode=0o700, exist_ok=True)
    now = time.time()
    tmp = f"{dest}.part"
    # The bundle holds diagnostics only the operator should read.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        dirs = sorted({os.path.dirname(str(i["path"])) for i in files} - {""})
        for name in [top] + [f"{top}/{d}" for d in dirs]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for item in files:
            data = str(item.get("content", "")).encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{item['path']}")
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, dest)


def main():
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    files = module.params["files"]
    problem = invalid(files)
    if problem:
        module.fail_json(msg=problem)
    if not module.check_mode:
        write(dest, files)
    module.exit_json(changed=True, dest=dest, count=len(files))


if __name__ == "__main__":
    main()
