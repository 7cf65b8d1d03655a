"""Reading an engine's flag model (spark_flag_models in the site role's vars) and the launch arguments it made.

The tune and the benchmark work on the two capacity flags whatever the engine calls them: the flag model
marks them `capacity: context` (a request's tokens) and `capacity: concurrency` (requests at once).
"""

from __future__ import annotations

CAPACITY_ROLES = ("context", "concurrency")


def capacity_flag(model, role):
    """The model's spec of its context or concurrency flag; a model without one is a defect of the model."""
    spec = next((f for f in (model or {}).get("flags", []) if f.get("capacity") == role), None)
    if spec is None:
        raise ValueError(f"the flag model of {(model or {}).get('label', '?')} has no flag with capacity: {role}")
    return spec


SPECULATIVE_SETTINGS = ("steps_flag", "topk_flag", "draft_tokens_flag")


def speculative_flags(model):
    """The flags of the model's `speculative` section: {algorithm, draft, settings: [steps, topk, draft tokens]}, the
    names the server plan judges and the tune compares a running rank by; empty names where the model has none."""
    spec = (model or {}).get("speculative") or {}
    return {"algorithm": spec.get("algorithm_flag"), "draft": spec.get("draft_flag"),
            "settings": [spec.get(key) for key in SPECULATIVE_SETTINGS]}


def flag_names(spec):
    """The flag's name, then its aliases: every key an override or a profile may set it by."""
    return [spec["name"], *spec.get("aliases", [])]


def launch_flags(args):
    """{flag without dashes: value, or True for a bare switch} of a launch argument list (server-args.json, or a
    unit's command line from the model on), also in the `--flag=value` form."""
    values = {}
    args = args if isinstance(args, list) else []
    i = 0
    while i < len(args):
        token = str(args[i])
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            if eq:
                values[name] = inline
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                values[name] = str(args[i + 1])
                i += 1
            else:
                values[name] = True
        i += 1
    return values
