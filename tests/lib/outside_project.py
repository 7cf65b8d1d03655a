"""The collection as a team gets it: the built tarball, installed into a clean virtualenv, used from a playbook
project of its own that holds only an inventory and a two-line playbook.

Nothing of the checkout reaches the runs but the tarball: the virtualenv has ansible-core alone (the pinned
version, from PyPI), the collection and its dependencies are installed into its site-packages, where Ansible
finds collections without any setting, and the runs get no ansible.cfg, no ANSIBLE_* variable and no
callback of the checkout's. The dependencies (ansible.posix, community.general, community.crypto) come from
the checkout's own copies, offline: Galaxy is not reachable from CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.lib.playbook import REPO

COLLECTION = "dgx_spark.llm_serving"
DEPENDENCIES = ("ansible/posix", "community/general", "community/crypto")
SITE = f"""---
- name: The DGX Spark site, from the installed collection
  ansible.builtin.import_playbook: {COLLECTION}.site
"""


def _pinned(package: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.lower().startswith(package + "=="):
            return line.strip()
    raise LookupError(f"{package} is not pinned in requirements.txt")


def build(into: Path) -> Path:
    """`ansible-galaxy collection build` of the checkout, as its README says a team builds it."""
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    done = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(into), str(REPO)],
                          capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (tarball,) = into.glob("dgx_spark-llm_serving-*.tar.gz")
    return tarball


@dataclass
class OutsideProject:
    root: Path
    venv: Path

    @property
    def inventory(self) -> Path:
        return self.root / "inventory"

    @property
    def installed(self) -> Path:
        purelib = sysconfig.get_path("purelib", vars={"base": str(self.venv), "platbase": str(self.venv)})
        return Path(purelib) / "ansible_collections" / "dgx_spark" / "llm_serving"

    def env(self) -> dict[str, str]:
        # What an operator's shell has: no setting of the checkout's, the virtualenv first on PATH.
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")}
        return {**keep, "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"}

    def run(self, tool: str, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.venv / "bin" / tool), *args], cwd=self.root, env=self.env(),
                              capture_output=True, text=True, check=False, timeout=timeout)


def create(root: Path, tarball: Path, inventory: Path) -> OutsideProject:
    """A clean virtualenv with the tarball installed, and a project beside it: `inventory` copied (the
    secrets the roles keep beside it included, so the site's API key stays the one it serves with) and
    site.yml importing the collection's site playbook."""
    project = OutsideProject(root=root / "project", venv=root / "venv")
    subprocess.run([sys.executable, "-m", "venv", str(project.venv)], check=True, timeout=300)
    pip = subprocess.run([str(project.venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", _pinned("ansible-core")],
                         capture_output=True, text=True, check=False, timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    project.root.mkdir(parents=True)
    shutil.copytree(inventory, project.inventory, symlinks=False)
    (project.root / "site.yml").write_text(SITE)
    # --no-deps: the dependencies are named here, from the checkout's copies, since Galaxy is out of reach.
    deps = [str(REPO / ".collections" / "ansible_collections" / d) for d in DEPENDENCIES]
    requirements = root / "requirements.yml"
    requirements.write_text("collections:\n" + "".join(f"  - {{name: {d}, type: dir}}\n" for d in deps)
                            + f"  - {{name: {tarball}, type: file}}\n")
    target = project.installed.parents[2]
    done = project.run("ansible-galaxy", "collection", "install", "--offline", "--no-deps",
                       "-r", str(requirements), "-p", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project.installed / "MANIFEST.json").is_file(), done.stdout
    return project


RECAP = re.compile(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP per host: {host: {changed, unreachable, failed}}."""
    return {m[1]: {"changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])} for m in RECAP.finditer(stdout)}
