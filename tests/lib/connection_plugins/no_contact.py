"""A connection that refuses to reach any host, for tests of refusals that must come before any contact.

An inventory whose hosts use `ansible_connection: no_contact` can run the project's playbooks: tasks
that stay on the controller (assert, set_fact, include_role, delegated to localhost) work, and the
first task that would touch a node fails loudly with "no_contact", instead of reaching an address.
"""

from __future__ import annotations

DOCUMENTATION = """
name: no_contact
short_description: Refuse every connection (tests only)
description:
  - Instantiates like any connection; connecting, running, putting or fetching raises.
author: spark-glm53 maintainers
"""

from ansible.errors import AnsibleConnectionFailure  # noqa: E402
from ansible.plugins.connection import ConnectionBase  # noqa: E402


class Connection(ConnectionBase):
    transport = "no_contact"
    has_pipelining = False

    def _refuse(self, *_args, **_kwargs):
        raise AnsibleConnectionFailure(f"no_contact: the test forbids contacting {self._play_context.remote_addr}")

    _connect = exec_command = put_file = fetch_file = _refuse

    def close(self):
        self._connected = False
