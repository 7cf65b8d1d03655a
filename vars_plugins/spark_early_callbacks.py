"""Sets up the file-copies callback before ansible-core parses the playbook; gives no variables.

ansible-core loads the callbacks only after it has parsed the playbook and every role that it imports
statically, so callback_plugins/spark_file_copies.py serves only the loads after that. The parse itself
deep-copies each role's defaults, vars, meta and argument specs at every load of the role (the site role
about a dozen times): 1.30 CPU-s to parse site.yml, 1.03 with the copies set up first. ansible-core imports the
vars plugins of its configured paths when it resolves a playbook's first import, before that parse; importing
this file sets the callback up there, through the callback loader (the same module the callbacks get later)
and by the callback's own code and option (SPARK_DEEP_COPY_FILES=true still gives ansible-core's copies).

As a vars plugin it must be enabled to run, and it is not: it gives no variables and costs no lookup.
"""

from __future__ import annotations

from ansible.plugins.loader import callback_loader
from ansible.plugins.vars import BaseVarsPlugin

DOCUMENTATION = """
    name: spark_early_callbacks
    short_description: sets up the file-copies callback before the playbook is parsed
    description:
      - Importing it sets up callback_plugins/spark_file_copies.py, with that callback's option, before
        ansible-core parses the playbook. It gives no variables and runs only if enabled, which it need not be.
"""

REQUIRES_ENABLED = True

_file_copies = callback_loader.get("spark_file_copies")
if _file_copies is not None:  # the callback is not on the callback path: ansible-core's own copies then
    _file_copies.set_options()


class VarsModule(BaseVarsPlugin):
    REQUIRES_ENABLED = True

    def get_vars(self, loader, path, entities, cache=True):
        return {}
