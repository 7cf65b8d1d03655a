"""Every module of the roles documents itself in YAML that parses, so `ansible-doc` can show it.

A colon followed by a space inside a plain scalar turns a sentence into a mapping key: ansible-doc
then refuses the module while everything that runs it still works, so nothing else would notice.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(REPO.glob("roles/*/library/*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
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
