"""Reading an operator's values and showing them back, for the filters that check a site's settings on the
controller and for the modules that check their arguments on a node.

A value from an inventory arrives as YAML typed it: an int, or a string when it was quoted or templated
("30000"), a bool where a number was meant (`yes`). A message about it shows it the way it was typed, so the
operator can find it: a string quoted, true, false and null as YAML writes them.
"""

from __future__ import annotations

import math
import re

_SIGNED = re.compile(r"\s*[+-]?[0-9]+\s*")
_UNSIGNED = re.compile(r"\s*[0-9]+\s*")


def shown(value) -> str:
    """The value as the operator typed it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def whole_number(value, *, signed: bool = True, integral_float: bool = True):
    """The int the operator meant (7, "7", " 7 ", 7.0), or None: a bool is not a number, nor "7.5" or "seven".

    `signed=False` refuses a sign in a string; `integral_float=False` refuses 7.0.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if integral_float and value.is_integer() else None
    if isinstance(value, str) and (_SIGNED if signed else _UNSIGNED).fullmatch(value):
        return int(value)
    return None


def decimal(value):
    """The finite number the operator meant (1.05, "1.05", 2), or None: a bool is no number, nor "fast" or inf."""
    if isinstance(value, bool):
        return None
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def switch(value):
    """The bool the operator meant (true, "yes", "0", ...), or None for anything else."""
    if isinstance(value, bool):
        return value
    return {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(str(value).strip().lower())


def not_a_switch(name, value) -> str:
    """The refusal of a switch (`name`) whose value is not a boolean, with its fix."""
    return f"{name} = {shown(value)}: must be true or false. Fix: a YAML boolean."


def port(value):
    """A TCP or UDP port, 1 to 65535, as an int; None for anything else."""
    number = whole_number(value, signed=False, integral_float=False)
    return number if number is not None and 1 <= number <= 65535 else None
