"""A folder of the model cache written whole or not at all.

A converted GGUF model and a format warm-up's weights are each built in a temporary
folder beside their final place and renamed into it with their record file last,
so a reader never sees half a folder, and two processes building the same folder
at once both end with the one that won the rename.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any


def default_cache_dir() -> str:
    """The model cache: ``$RAGEN_RLLIB_CACHE``, else ``~/.cache/ragen_rllib``."""
    return os.environ.get("RAGEN_RLLIB_CACHE") or os.path.expanduser("~/.cache/ragen_rllib")


def publish_folder(final: str, record_file: str, fill: Callable[[str], dict[str, Any]]) -> str:
    """Build ``final``: ``fill(tmp)`` writes the folder's files into ``tmp`` and returns
    the record saved as ``record_file``; the folder is then renamed to ``final``.
    A folder someone else renamed there first (a lost race) is kept as it is."""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        record = fill(tmp)
        with open(os.path.join(tmp, record_file), "w") as f:
            json.dump(record, f, indent=1, default=str)
        try:
            os.replace(tmp, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, record_file)):  # not a lost race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
