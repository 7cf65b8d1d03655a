"""Every module of the roles documents itself in YAML that parses, so `ansible-doc` can show it.

A colon followed by a space inside a plain scalar turns a sentence into a mapping key: ansible-doc
then refuses the module while everything that runs it still works, so nothing else would notice.
Inside a list item the YAML still parses (the item is a one-key mapping), so every description is
also held to what ansible-doc accepts: a string, or a list of strings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted((REPO / "plugins" / "modules").glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_documentation_examples_and_return_parse(path):
    source = path.read_text()
    blocks = dict(re.findall(r'^(DOCUMENTATION|EXAMPLES|RETURN) = r?"""(.*?)"""', source, re.S | re.M))
    assert "DOCUMENTATION" in blocks, f"{path} has no DOCUMENTATION"
    for name, text in blocks.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as e:
            pytest.fail(f"{path.relative_to(REPO)}: {name} does not parse: {e}")
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    assert doc.get("module") == path.stem
    where = path.relative_to(REPO)
    bad = _descriptions_not_text(doc, "DOCUMENTATION") + _descriptions_not_text(
        {"returned": yaml.safe_load(blocks.get("RETURN", "")) or {}}, "RETURN")
    assert bad == [], f"{where}: descriptions ansible-doc refuses (a ': ' in a list item?): {bad}"


def _descriptions_not_text(node, at: str) -> list[str]:
    """Where a `description` is neither a string nor a list of strings, searching every nested mapping."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and not (
                    isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
                found.append(f"{at}.description")
            elif isinstance(value, (dict, list)):
                found += _descriptions_not_text(value, f"{at}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _descriptions_not_text(value, f"{at}[{index}]")
    return found
