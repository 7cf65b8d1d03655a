"""Logs (issue 18): what doctor.yml makes of a journal that kept the previous boot, and the journald drop-in.

With the monitoring role's persistent journal, `journalctl -u` returns the rank's starts of the previous boot too:
the doctor lists them among the earlier starts and says how many boots the journal holds; a volatile journal is
named as holding this boot only.
"""

from __future__ import annotations

import json

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin

doctor = filter_plugin("doctor")


def line(t, message, inv, pid1=False):
    record = {"__REALTIME_TIMESTAMP": str(int(t * 1e6)), "MESSAGE": message}
    record["INVOCATION_ID" if pid1 else "_SYSTEMD_INVOCATION_ID"] = inv
    return json.dumps(record)


def probe_output(boots):
    journal = [
        # Yesterday's boot: a start that the power cut ended.
        line(1000.0, "Started spark-llm.service - SGLang rank 0 of 2", "a" * 32, pid1=True),
        line(1001.0, "The server is fired up and ready to roll!", "a" * 32),
        # This boot.
        line(5000.0, "Started spark-llm.service - SGLang rank 0 of 2", "b" * 32, pid1=True),
        line(5001.0, "Init torch distributed begin.", "b" * 32),
    ]
    return "\n".join(["--- journal", *journal, "--- kernel", "--- events", "--- container", "--- boots", *boots,
                      "--- now", "5010"])


def evidence(boots):
    results = {"unit": {"status": {"ActiveState": "active", "SubState": "running", "InvocationID": "b" * 32}},
               "journal": {"stdout": probe_output(boots), "rc": 0}}
    return doctor.evidence(results, "enp1s0f1np1", None)


def test_the_previous_boots_start_is_an_earlier_start_and_the_boots_are_counted():
    ev = evidence([" -1 1111111111111111111111111111111 Sun 2026-11-29 10:00:00 UTC Sun 2026-11-29 23:59:00 UTC",
                   "  0 2222222222222222222222222222222 Mon 2026-11-30 08:00:00 UTC Mon 2026-11-30 15:00:00 UTC"])
    assert ev["facts"]["journal_boots"] == 2
    assert ev["facts"]["current_invocation"] == "b" * 32
    assert [r["id"] for r in ev["earlier"]] == ["a" * 32]
    assert "The server is fired up and ready to roll!" in [e["msg"] for e in ev["earlier"][0]["entries"]]


def test_a_journal_of_this_boot_only_is_told():
    ev = evidence(["  0 2222222222222222222222222222222 Mon 2026-11-30 08:00:00 UTC Mon 2026-11-30 15:00:00 UTC"])
    assert ev["facts"]["journal_boots"] == 1
    analyse = (REPO / "roles" / "doctor" / "tasks" / "analyse.yml").read_text()
    assert "journal of {{ __doctor_facts.journal_boots" in analyse and "(this boot only)" in analyse
    probe = (REPO / "plugins" / "modules" / "doctor_probe.py").read_text()
    assert "journalctl --no-pager --list-boots" in probe


def test_the_journald_drop_in_keeps_the_journal_on_disk_within_its_cap():
    template = (REPO / "roles" / "monitoring" / "templates" / "journald.conf.j2").read_text()
    assert "[Journal]\nStorage=persistent\nSystemMaxUse={{ monitoring_journal_max_use }}" in template
