"""The supervisor's view of the TP group, from the inventory, and the check of its settings."""

from __future__ import annotations

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs

# The supervisor's numeric settings: (variable, smallest value, what it is, an example). Whole
# seconds or counts: the role hands them to the program through `| int`, which would turn a value
# that does not parse into 0 without a word.
NUMBERS = (
    ("supervisor_interval", 1, "seconds between two checks", "30"),
    ("supervisor_failures", 1, "failed generations in a row before a group restart", "3"),
    ("supervisor_probe_timeout", 1, "seconds the one-token generation may take", "20"),
    ("supervisor_max_restarts", 0, "group restarts in a row that do not reach stable service before it "
     "gives up", "3"),
    ("supervisor_stable_after", 1, "seconds of healthy generations after which a restart no longer counts",
     "600"),
    ("supervisor_backoff_initial", 1, "seconds of back-off before the second attempt of a failing streak",
     "60"),
    ("supervisor_backoff_max", 1, "the largest back-off, in seconds", "900"),
    ("supervisor_window_max_restarts", 0, "group restarts of any cause per window at which it alerts", "20"),
    ("supervisor_window", 1, "the alert's window, in seconds", "21600"),
    ("supervisor_gpu_release_timeout", 1, "seconds a stopped rank's GPU may take to be free", "180"),
    ("supervisor_node_wait_report", 1, "seconds between two reports while a node does not answer", "600"),
    ("supervisor_readiness_timeout", 1, "seconds a group restart may take to serve", "3600"),
)


def _whole(value):
    """A whole number given as one (or as its digits, e.g. -e on the command line); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def supervisor_plan(ctx):
    """Check the supervisor's settings of one host: {errors}. Each error names the variable, the
    value, why it cannot be used and the fix. Nothing but the switch is checked while it is off."""
    errors = []
    enabled = inputs.switch(ctx.get("supervisor_enabled"))
    if enabled is None:
        errors.append(inputs.not_a_switch("supervisor_enabled", ctx.get("supervisor_enabled")))
    if not enabled:
        return {"errors": errors}
    values = {}
    for var, low, what, example in NUMBERS:
        raw = ctx.get(var)
        number = _whole(raw)
        if number is None or number < low:
            errors.append(f"{var} = {inputs.shown(raw)}: must be a whole number >= {low} ({what}). Fix: e.g. {var}: {example}.")
        else:
            values[var] = number
    initial = values.get("supervisor_backoff_initial")
    cap = values.get("supervisor_backoff_max")
    if initial is not None and cap is not None and cap < initial:
        errors.append(f"supervisor_backoff_max = {cap}: below supervisor_backoff_initial ({initial}); the "
                      "back-off starts at the one and doubles up to the other. Fix: set supervisor_backoff_max "
                      f">= {initial}, or lower supervisor_backoff_initial.")
    command = ctx.get("supervisor_alert_command")
    if command is not None and not isinstance(command, str):
        errors.append(f"supervisor_alert_command = {inputs.shown(command)}: must be a shell command string (it gets "
                      "the give-up's JSON on stdin). Fix: e.g. \"curl -fsS -X POST --data-binary @- https://hooks."
                      "example/sglang\", or \"\" for none.")
    return {"errors": errors}


def supervisor_nodes(nodes, hostvars, head):
    """Every rank in rank order with the address the supervisor reaches it on (its fabric address)."""
    return [{"name": n, "address": str(hostvars[n]["spark_fabric_ip"]), "local": n == head} for n in nodes]


class FilterModule:
    def filters(self):
        return {"supervisor_nodes": supervisor_nodes, "supervisor_plan": supervisor_plan}
