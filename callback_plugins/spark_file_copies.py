"""Hands out the copies of a parsed file that ansible-core gives each caller by unpickling, not deep-copying.

DataLoader.load_from_file parses a YAML file once per run and keeps it, then gives every caller a deep copy,
so that no caller can change what the next one gets. Every load of a role copies its defaults, vars, meta and
argument specs that way, and the site role, on which every other role depends, is loaded about a dozen times
in one server.yml. copy.deepcopy walks the tagged values (each string carries where it came from) in Python:
11 ms for the site role's vars alone, about a tenth of the CPU of a run that the inventory check refuses.
Unpickling a pickle taken once gives an equal and independent copy, with the same tags (ansible-core pickles
these values between its processes anyway), in a sixth of the time.

Only the loads after the callbacks are loaded benefit: ansible-core parses the playbook, and the roles it
imports statically, before it loads any callback. A value that does not survive pickling as it is (an
encrypted one, or one pickle refuses) is deep-copied as before, and so is every file once this plugin's
option turns it off.
"""

from __future__ import annotations

import copy
import pickle

from ansible.parsing import dataloader
from ansible.plugins.callback import CallbackBase

try:
    from ansible.parsing.vault import EncryptedString
except ImportError:  # another ansible-core: nothing of that type to keep away from pickle
    EncryptedString = ()

DOCUMENTATION = """
    name: spark_file_copies
    type: aggregate
    short_description: copies of parsed files by unpickling, not deep-copying
    description:
      - ansible-core deep-copies a parsed YAML file for every caller (each role load). This plugin gives each
        caller an equal, independent copy made from a pickle taken once per file and run.
      - Has no output and changes nothing on any host; it needs no enabling.
    options:
      deep_copy:
        description:
          - Copy as ansible-core does (copy.deepcopy), at its cost.
        type: bool
        default: false
        env:
          - name: SPARK_DEEP_COPY_FILES
        ini:
          - section: spark_file_copies
            key: deep_copy
"""

_original_load_from_file = dataloader.DataLoader.load_from_file
# id of a parsed file's kept data -> (that data, its pickle or None where pickle must not be used). The data is
# held so that its id cannot be reused by another object during the run.
_pickles: dict[int, tuple[object, bytes | None]] = {}


def _has_encrypted(value, depth: int = 0) -> bool:
    if isinstance(value, EncryptedString):  # () where ansible-core has no such type: never
        return True
    if depth > 50:  # deeper than any role file: copy it as ansible-core does
        return True
    if isinstance(value, dict):
        return any(_has_encrypted(k, depth + 1) or _has_encrypted(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return any(_has_encrypted(v, depth + 1) for v in value)
    return False


def _pickled(parsed) -> bytes | None:
    entry = _pickles.get(id(parsed))
    if entry is None or entry[0] is not parsed:
        data = None
        if not _has_encrypted(parsed):
            try:
                data = pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - whatever pickle refuses is deep-copied instead
                data = None
        entry = _pickles[id(parsed)] = (parsed, data)
    return entry[1]


def load_from_file(self, file_name, cache="all", unsafe=False, json_only=False, trusted_as_template=False):  # noqa: PLR0917 - ansible-core's signature
    """DataLoader.load_from_file with the same answers: the kept data itself where the caller asked for it
    (unsafe), else a copy of it that shares nothing with it."""
    if unsafe or cache != "all":
        return _original_load_from_file(self, file_name, cache=cache, unsafe=unsafe, json_only=json_only,
                                        trusted_as_template=trusted_as_template)
    parsed = _original_load_from_file(self, file_name, cache=cache, unsafe=True, json_only=json_only,
                                      trusted_as_template=trusted_as_template)
    if not isinstance(parsed, (dict, list)):
        return copy.deepcopy(parsed)
    data = _pickled(parsed)
    return copy.deepcopy(parsed) if data is None else pickle.loads(data)  # noqa: S301 - our own pickle, this run


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_file_copies"
    CALLBACK_NEEDS_ENABLED = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # Set in the main process before any task: the roles included at run time are loaded there.
        dataloader.DataLoader.load_from_file = (_original_load_from_file if self.get_option("deep_copy")
                                                else load_from_file)
