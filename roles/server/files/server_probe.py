#!/usr/bin/python3
"""One readiness round on a node: this rank's unit and, on the head, /v1/models.

Prints one JSON object: {"unit": <systemctl is-active>, "ready": bool, "detail": str}.
Returns early when the unit stops being active (the caller then fails every rank)
or when the head lists the served model; without --url (a worker) it reads the
unit once. The API key is read from the rank's own key file so it never travels
on a command line.
"""

import argparse
import json
import subprocess
import time
import urllib.error
import urllib.request


def api_key(key_file):
    try:
        with open(key_file) as f:
            return f.read().strip()
    except OSError:
        return ""


def unit_state(unit):
    out = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def models(url, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - the rank's own HTTP endpoint
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - the rank's own HTTP endpoint
        return [m.get("id") for m in json.loads(resp.read()).get("data", [])]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--unit", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--url")
    p.add_argument("--model")
    p.add_argument("--key-file")
    a = p.parse_args()
    key = api_key(a.key_file) if a.key_file else ""
    deadline = time.monotonic() + a.seconds
    detail = f"{a.unit} is active"
    while True:
        state = unit_state(a.unit)
        if state != "active":
            print(json.dumps({"unit": state, "ready": False, "detail": f"{a.unit} is {state}"}))
            return
        if a.url:
            try:
                served = models(a.url, key)
                if a.model in served:
                    print(json.dumps({"unit": state, "ready": True, "detail": f"serving {served}"}))
                    return
                detail = f"/v1/models lists {served}, waiting for {a.model}"
            except (OSError, ValueError) as err:
                detail = f"{a.url}: {err}"
        if time.monotonic() >= deadline:
            print(json.dumps({"unit": state, "ready": False, "detail": detail}))
            return
        time.sleep(2)


main()
