"""`ansible-doc` shows every module and every role entry point of the collection by FQCN, and says nothing
about our content while it does (a warning there is a page an operator cannot read, as with a module
whose constants its reader skipped).

One call per plugin type, for all of them at once, through the checkout's link in .collections
(scripts/bootstrap), as for an installed copy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = Path(sys.executable).with_name("ansible-doc")
COLLECTION = "dgx_spark.llm_serving"
# ansible-core 2.21.5 warns about its own internal collection (ansible._protomatter, which has no manifest)
# whenever ansible-doc lists roles, whatever the roles are: not ours to fix, and the only line let through.
CORE_OWN_WARNING = re.compile(r"^\[WARNING\]: Collection at '[^']*/ansible/_internal/ansible_collections/ansible/"
                              r"_protomatter' does not have a MANIFEST\.json file, nor has it galaxy\.yml: "
                              r"cannot detect version\.$")


def ansible_doc(kind: str, names: list[str]) -> tuple[str, list[str]]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0"}
    run = subprocess.run([str(ANSIBLE_DOC), "-t", kind, *names], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # Without colour, ansible-doc marks what it would print in bold with asterisks.
    warnings = [line for line in run.stderr.splitlines() if line.strip() and not CORE_OWN_WARNING.match(line)]
    return run.stdout.replace("*", ""), warnings


def test_every_module_has_its_page_and_no_warning():
    modules = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
    assert modules, "no module found: the layout moved and this test reads nothing"
    out, warnings = ansible_doc("module", [f"{COLLECTION}.{m}" for m in modules])
    assert warnings == []
    shown = re.findall(r"^> MODULE (\S+)", out, re.M)
    assert shown == [f"{COLLECTION}.{m}" for m in modules]


def test_every_role_entry_point_has_its_page_and_no_warning():
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
    out, warnings = ansible_doc("role", [f"{COLLECTION}.{r}" for r in roles])
    assert warnings == []
    pages = re.split(r"^> ROLE: ", out, flags=re.M)[1:]
    by_role = {page.split()[0]: set(re.findall(r"^ENTRY POINT: (\S+)", page, re.M)) for page in pages}
    for role in roles:
        specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        assert by_role.get(f"{COLLECTION}.{role}") == set(specs), role
