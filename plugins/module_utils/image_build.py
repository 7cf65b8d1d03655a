"""A derived engine image: the build context's rules and the build's identity, the same on the controller (the plan
checks the operator's context before any change) and on the head (which checks its copy again before it builds).

A context is a directory holding a Dockerfile and the files it copies, every one pinned by sha256 in the
inventory. The Dockerfile builds on the site's engine image, handed to it as the build argument BASE_ARG, so the
base is the image the inventory pins and the build's identity follows from it: the base's image ID (what the head
pulled) and the pinned files. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re

BASE_ARG = "SPARK_BASE_IMAGE"
LABEL = "org.spark-llm.build"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def context_files(root: str) -> tuple[dict[str, str], list[str]]:
    """({relative path: sha256} of every regular file under root, [entries that are neither file nor folder]).

    A symlink is never followed: it could bring a file from outside the pinned context into the build."""
    files, odd = {}, []
    for folder, dirs, names in os.walk(root):
        for name in list(dirs):
            if os.path.islink(os.path.join(folder, name)):
                odd.append(os.path.relpath(os.path.join(folder, name), root))
                dirs.remove(name)
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path) or not os.path.isfile(path):
                odd.append(rel)
                continue
            files[rel] = file_sha256(path)
    return files, sorted(odd)


def pin_problems(files: dict[str, str], odd: list[str], pins: dict) -> list[str]:
    """What keeps the context from being the pinned one: each sentence names the file."""
    problems = [f"{rel} is a symlink or special file (the context holds regular files only)" for rel in odd]
    for rel in sorted(files):
        want = pins.get(rel)
        if want is None:
            problems.append(f"{rel} has no sha256 pin")
        elif not isinstance(want, str) or not SHA256.match(want):
            problems.append(f"{rel}'s pin is not 64 lowercase hex digits")
        elif want != files[rel]:
            problems.append(f"{rel} has sha256 {files[rel]}, not the pinned {want}")
    problems += [f"{rel} is pinned but not in the context" for rel in sorted(set(map(str, pins)) - set(files))]
    return problems


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical Dockerfile line: continuations joined, comments and blank lines dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        match = _INSTRUCTION.match(line)
        if match and not line.lstrip().startswith("#"):
            out.append((match.group(1).upper(), match.group(2).strip()))
    return out


def base_problem(dockerfile_text: str) -> str:
    """Why this Dockerfile does not build on the site's engine image ('' when it does): its first FROM must be
    the build argument, declared before it, so the base is the image the inventory pins."""
    declared = False
    for word, rest in instructions(dockerfile_text):
        if word == "ARG" and rest.split("=", 1)[0].strip() == BASE_ARG:
            declared = True
        elif word == "FROM":
            image = rest.split()[0] if rest.split() else ""
            if image not in (f"${BASE_ARG}", f"${{{BASE_ARG}}}"):
                return (f"its first FROM is {image!r}, not the site's engine image: write ARG {BASE_ARG} and FROM "
                        f"${{{BASE_ARG}}} (the role passes server_image, pinned, as that argument)")
            if not declared:
                return f"FROM ${{{BASE_ARG}}} comes before ARG {BASE_ARG}: declare the argument first"
            return ""
    return "it has no FROM line"


def build_id(base_image_id: str, pins: dict) -> str:
    """The build's identity: the base image's ID and every pinned file. The same on every run and node until
    the base's digest or a file changes."""
    digest = hashlib.sha256(f"{base_image_id}\n".encode())
    for rel in sorted(map(str, pins)):
        digest.update(f"{rel}\0{pins[rel]}\n".encode())
    return digest.hexdigest()


def derived_tag(engine: str, identity: str) -> str:
    """The derived image's name on every node: the engine's, and the build it came from."""
    return f"spark-llm/{engine}-derived:{identity[:16]}"
