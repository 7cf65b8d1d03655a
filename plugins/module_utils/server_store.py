"""The server's kept configurations on a node (`last-good`, `pending`): each a folder of the store holding the
unit, the env file and `server-args.json` as they were installed, and a manifest naming them and the image.

server_config writes them (and rolls back to them); server_state reads them for the plan. Standard library
only.
"""

from __future__ import annotations

import json
import os

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import read_bytes

PENDING = "pending"
LAST_GOOD = "last-good"
MANIFEST = "config.json"
KINDS = ("unit", "env", "args")


def load(store: str, name: str) -> dict | None:
    """The copy `name` in `store`: {"files": {kind: bytes}, "image": {...}, "kept": str}; None when it is not
    there whole (no manifest, an unreadable one, or a file it names missing)."""
    folder = os.path.join(store, name)
    text = read_bytes(os.path.join(folder, MANIFEST))
    if text is None:
        return None
    try:
        manifest = json.loads(text)
        files = {kind: read_bytes(os.path.join(folder, manifest["files"][kind])) for kind in KINDS}
    except (ValueError, KeyError, TypeError):
        return None
    if any(content is None for content in files.values()):
        return None
    return {"files": files, "image": manifest.get("image") or {}, "kept": manifest.get("kept", "")}


def installed_paths(module) -> dict:
    """The module's `files` option: where the unit, the env file and `server-args.json` are installed on the
    node ({unit, env, args}); the module fails naming any that is missing."""
    paths = module.params["files"] or {}
    missing = [kind for kind in KINDS if not paths.get(kind)]
    if missing:
        module.fail_json(msg=f"files needs the paths of {', '.join(missing)}")
    return paths
