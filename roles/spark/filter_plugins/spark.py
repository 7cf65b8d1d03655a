"""Names the site derives once and every role reads.

The checkpoint role keeps its record, verified-stamp and partial files beside
the model directory and named after it; the server, the doctor and the day-2
verbs read them, for this host and (under --limit, by delegation) for others.
"""

from __future__ import annotations

import posixpath


def spark_checkpoint_paths(model_dir):
    """Return {record, stamp, partial_dir, rsync_partial_dir} for a model directory."""
    model_dir = str(model_dir)
    parent, name = posixpath.split(model_dir)
    partial = posixpath.join(parent, f".{name}.partial")
    return {
        "model_dir": model_dir,
        "record": posixpath.join(parent, f"{name}.record.json"),
        "stamp": posixpath.join(parent, f"{name}.verified"),
        "partial_dir": partial,
        "rsync_partial_dir": posixpath.join(partial, "rsync"),
    }


class FilterModule:
    def filters(self):
        return {"spark_checkpoint_paths": spark_checkpoint_paths}
