"""Starts SGLang's model gateway (smg) in this process, with the API key read from systemd's credentials.

`smg launch` takes the key only as --api-key, which /proc/<pid>/cmdline would show to every user of the
host. The unit hands the key (and the TLS files) over with LoadCredential=, and this launcher gives smg's
own argument parser the settings file's arguments with the key added in memory: the key is on no command
line, in no environment, in no file but the 0600 one. smg then renames the process (setproctitle) to
"smg::router"; the launcher's own command line holds only this file's and the settings file's paths.
"""

from __future__ import annotations

import json
import os
import sys

from smg.launch_router import launch_router, parse_router_args

CREDENTIAL = "cred:"


def resolve(value):
    """A "cred:NAME" value as the path of the credential systemd placed for this service."""
    if isinstance(value, str) and value.startswith(CREDENTIAL):
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            sys.exit(f"{value}: no CREDENTIALS_DIRECTORY - start the gateway through its systemd unit (LoadCredential=)")
        return os.path.join(directory, value[len(CREDENTIAL):])
    return value


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} SETTINGS.json")
    with open(resolve(sys.argv[1]), encoding="utf-8") as handle:
        settings = json.load(handle)
    args = [resolve(a) for a in settings["args"]]
    if settings.get("api_key"):
        path = resolve(settings["api_key"])
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
        if not key:
            sys.exit(f"{path} is empty: the gateway would serve without the heads' key")
        args += ["--api-key", key]
    launch_router(parse_router_args(args))


if __name__ == "__main__":
    main()
