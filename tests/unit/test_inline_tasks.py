"""callback_plugins/spark_inline_tasks.py: tasks that reach no node run in the main process, with a worker's results.

Two hosts on the local connection. Which process ran a task shows in the parent of the shell a pipe lookup
starts: one process for both hosts is the main process; a worker per host gives two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INVENTORY = """
all:
  hosts:
    node-a: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}", side: a}
    node-b: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}", side: b}
"""
PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Decide on the controller
      ansible.builtin.set_fact:
        decided_in: "{{ lookup('ansible.builtin.pipe', 'echo $PPID') }}"
        own_side: "side {{ side }}"
    - name: Decide on the controller, retried
      ansible.builtin.set_fact:
        retried_in: "{{ lookup('ansible.builtin.pipe', 'echo $PPID') }}"
      until: true
      retries: 1
      delay: 0
    - name: Skipped on node-b only
      ansible.builtin.command: "echo {{ lookup('ansible.builtin.pipe', 'echo $PPID') }}"
      when: side == 'a'
      register: only_a
      changed_when: false
    - name: Skipped for every host
      ansible.builtin.command: echo never
      when: side == 'c'
      register: never
    - name: True only with the connection's variables a worker adds
      ansible.builtin.command: "echo {{ lookup('ansible.builtin.pipe', 'echo $PPID') }}"
      when: ansible_timeout is defined
      register: magic
      changed_when: false
    - name: Refused on node-b, ignored
      ansible.builtin.assert:
        that: side == 'a'
        fail_msg: "side {{ side }} is not a"
      ignore_errors: true
      register: refusal
    - name: Included
      ansible.builtin.include_tasks: included.yml
    - name: Report
      ansible.builtin.debug:
        msg: "{{ {'decided_in': decided_in, 'retried_in': retried_in, 'own_side': own_side,
                  'only_a': only_a.skipped | default(false), 'never': never.skipped,
                  'magic_in': magic.stdout | default('skipped'), 'refusal': refusal.failed,
                  'refusal_msg': refusal.msg | default(''), 'included': included_side} | to_json }}"
"""
INCLUDED = """
- name: Set in the included file
  ansible.builtin.set_fact:
    included_side: "{{ side }}"
"""


def run(tmp_path: Path, **env: str) -> dict[str, dict]:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "included.yml").write_text(INCLUDED)
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.yml", "play.yml"],
                         capture_output=True, text=True, cwd=tmp_path, check=False,
                         env={**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
                              "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
                              "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"), "ANSIBLE_NOCOLOR": "1",
                              "ANSIBLE_FORKS": "5", **env})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    (play,) = report["plays"]
    (task,) = [t for t in play["tasks"] if t["task"]["name"] == "Report"]
    return {host: json.loads(res["msg"]) for host, res in task["hosts"].items()}


def test_tasks_that_reach_no_node_run_in_the_main_process_with_the_results_a_worker_gives(tmp_path):
    reports = run(tmp_path)
    a, b = reports["node-a"], reports["node-b"]
    # One process decided for both hosts; a task that may wait (until) still has a worker per host.
    assert a["decided_in"] == b["decided_in"]
    assert a["retried_in"] != b["retried_in"]
    # Each host got its own templated values: the task run for node-a left nothing of its own in the task
    # node-b's copy started from.
    assert (a["own_side"], b["own_side"], a["included"], b["included"]) == ("side a", "side b", "a", "b")
    assert (a["only_a"], b["only_a"], a["never"], b["never"]) == (False, True, True, True)
    # ansible_timeout is a connection variable the worker adds: the condition is left to a worker per host,
    # and is true there.
    assert "skipped" not in (a["magic_in"], b["magic_in"]) and a["magic_in"] != b["magic_in"]
    assert (a["refusal"], b["refusal"], b["refusal_msg"]) == (False, True, "side b is not a")


def test_the_option_forks_every_task_as_ansible_core_does(tmp_path):
    reports = run(tmp_path, SPARK_FORK_EVERY_TASK="true")
    a, b = reports["node-a"], reports["node-b"]
    assert a["decided_in"] != b["decided_in"]
    assert (a["own_side"], b["own_side"], a["only_a"], b["only_a"]) == ("side a", "side b", False, True)
    assert "skipped" not in (a["magic_in"], b["magic_in"])
