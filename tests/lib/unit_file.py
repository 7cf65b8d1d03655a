"""Read a systemd unit's Exec lines as systemd splits them: the one parser the tests use.

A setting continues onto the next line while its line ends in a backslash;
comment lines (`#`, `;`) inside a continuation are skipped, as systemd skips
them; the words are split with shell quoting. The prefixes systemd reads off
the command (`-`, `@`, `:`, `+`, `!`) are dropped.
"""

from __future__ import annotations

import shlex

EXEC_PREFIXES = "-@:+!"


def setting(unit_text: str, key: str) -> str | None:
    """The value of the first `key=` line with its continuation lines joined, or None."""
    lines = iter(unit_text.splitlines())
    for line in lines:
        if not line.startswith(f"{key}="):
            continue
        parts = []
        current = line[len(key) + 1:]
        while current.endswith("\\"):
            parts.append(current[:-1])  # systemd reads the backslash as a space
            current = next((x for x in lines if not x.lstrip().startswith(("#", ";"))), "")
        parts.append(current)
        return " ".join(parts)
    return None


def exec_words(unit_text: str, key: str = "ExecStart") -> list[str]:
    """The command of the first `key=` line (ExecStart, ExecStartPre, ExecStop...) as words."""
    value = setting(unit_text, key)
    if value is None:
        raise KeyError(f"{key}= is not in the unit")
    return shlex.split(value.lstrip(EXEC_PREFIXES))


def exec_lines(unit_text: str, keys=("ExecStartPre", "ExecStart", "ExecStop")) -> dict[str, list[str]]:
    """Each of `keys` mapped to its command's words."""
    return {key: exec_words(unit_text, key) for key in keys}


def launch_args(words_or_unit: list[str] | str) -> list[str]:
    """The engine's arguments of the server's ExecStart (or of a command's words).

    SGLang's unit runs `python3 -m sglang.launch_server ARGS`, or with an API key
    `python3 -c "<launcher>" KEY_FILE ARGS`; vLLM's replaces the image's entrypoint:
    `--entrypoint vllm IMAGE serve ARGS`, or `--entrypoint python3 IMAGE -c "<launcher>" KEY_FILE ARGS` (a
    launcher's own argument is the key file's path in the container). The arguments follow it.
    """
    words = exec_words(words_or_unit) if isinstance(words_or_unit, str) else words_or_unit
    if "--entrypoint" in words:
        at = words.index("--entrypoint")
        entrypoint, rest = words[at + 1], words[at + 3:]
        if entrypoint == "vllm" and rest[:1] == ["serve"]:
            return rest[1:]
        if entrypoint.rsplit("/", 1)[-1].startswith("python") and rest[:1] == ["-c"]:
            return rest[3:]
        raise ValueError(f"no vllm serve or python3 -c launcher after --entrypoint in {words}")
    for i, word in enumerate(words[:-2]):
        if word.rsplit("/", 1)[-1].startswith("python") and words[i + 1] in ("-m", "-c"):
            if words[i + 1] == "-m" and words[i + 2] != "sglang.launch_server":
                continue
            return words[i + 3:] if words[i + 1] == "-m" else words[i + 4:]
    raise ValueError(f"no python3 -m sglang.launch_server or -c launcher in {words}")
