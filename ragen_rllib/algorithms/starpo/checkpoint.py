"""Checkpoint integrity: a manifest of every file's size and hash, checked before a restore.

A run killed while it wrote a checkpoint, a copy cut short, or a flipped byte
would otherwise surface as an unpickling error deep inside Ray. ``StarPO``
writes :data:`MANIFEST` after each save; :func:`verify_checkpoint` names the
first file that is missing, truncated or altered.

It also refuses, with a message saying so, a checkpoint written before the
package was laid out by role (version 0.1's flat modules such as
``ragen_rllib.config``): its pickles name classes at module paths that no longer
exist, which would otherwise fail as an import error inside Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

MANIFEST = "ragen_checkpoint_manifest.json"
#: Module paths of the flat layout, as pickles name them: a name ending there (not
#: continued by "." or more letters, as "ragen_rllib.algorithms.starpo" is).
_OLD_LAYOUT = re.compile(
    rb"ragen_rllib\.(config|algorithm|context|env_runner|learner|rl_module|connectors|buffer)"
    rb"(?![._A-Za-z])"
)

#: Modules that moved within version 0.2 (old path -> new path), as a pickle names them: a
#: checkpoint naming an old path was written before the move and cannot be restored.
MOVED_MODULES = {
    "ragen_rllib.env_choice.opponents": "ragen_rllib.env_runner.self_play.seats",
    "ragen_rllib.env_runner.opponents": "ragen_rllib.env_runner.self_play.snapshots",
    "ragen_rllib.env_runner.self_play": "ragen_rllib.env_runner.self_play.games",
    "ragen_rllib.connectors.learner": "ragen_rllib.learner.connectors",
    "ragen_rllib.models.builtin": "ragen_rllib.builtin.model",
    "ragen_rllib.models.warmup": "ragen_rllib.warmup.format_warmup",
    **{
        f"ragen_rllib.models.{name}": f"ragen_rllib.builtin.{name}"
        for name in ("build", "pretraining", "quality", "spec", "tokenizer", "transcripts")
    },
}
_MOVED = re.compile(
    rb"(" + b"|".join(re.escape(m.encode()) for m in MOVED_MODULES) + rb")(?![._A-Za-z])"
)


class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated or corrupt."""


class OldLayoutCheckpointError(CorruptCheckpointError):
    """A checkpoint written by version 0.1 (the flat package layout)."""


def check_layout(root: Path) -> None:
    """Raise OldLayoutCheckpointError when a pickle of the checkpoint names a module
    of the flat layout, or one that has moved since (:data:`MOVED_MODULES`)."""
    for path in sorted(root.glob("*.pkl")):
        blob = path.read_bytes()
        moved = _MOVED.search(blob)
        if moved:
            old = moved.group(0).decode()
            raise OldLayoutCheckpointError(
                f"checkpoint {str(root)!r} was written before the module {old!r} (named in "
                f"{path.name}) moved to {MOVED_MODULES[old]!r}; it cannot be restored here. "
                "Restore it with the version it was trained with, or train again"
            )
        match = _OLD_LAYOUT.search(blob)
        if match:
            raise OldLayoutCheckpointError(
                f"checkpoint {str(root)!r} was written by ragen-rllib 0.1, whose flat "
                f"modules (here {match.group(0).decode()!r}, in {path.name}) this version "
                "replaced by one package per RLlib role; it cannot be restored here. "
                "Restore it with ragen-rllib 0.1 (the commit it was trained with), or "
                "train again with this version"
            )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST and ".tmp" not in p.name
    )


def write_manifest(checkpoint_dir: str | os.PathLike) -> None:
    root = Path(checkpoint_dir)
    entries = {
        p.relative_to(root).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in _files(root)
    }
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    os.replace(tmp, root / MANIFEST)


def verify_checkpoint(checkpoint_dir: str | os.PathLike) -> None:
    """Raise CorruptCheckpointError naming the first bad file.

    A checkpoint without a manifest (written before manifests existed, or by
    an interrupted save) is checked for its RLlib state file only.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise CorruptCheckpointError(f"checkpoint {str(root)!r} is not a directory")
    manifest = root / MANIFEST
    if not manifest.is_file():
        if not any(root.glob("*state.pkl")) and not any(root.glob("*state.msgpack")):
            raise CorruptCheckpointError(
                f"checkpoint {str(root)!r} has neither {MANIFEST} nor an RLlib state file: "
                "the save was interrupted, or this is not a checkpoint directory"
            )
        check_layout(root)
        return
    try:
        entries = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(
            f"checkpoint file {str(manifest)!r} is corrupt: {err}"
        ) from err
    for name, want in entries.items():
        path = root / name
        if not path.is_file():
            raise CorruptCheckpointError(f"checkpoint file {str(path)!r} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise CorruptCheckpointError(
                f"checkpoint file {str(path)!r} is truncated or altered: {size} bytes, "
                f"{want['bytes']} when it was written"
            )
        if _sha256(path) != want["sha256"]:
            raise CorruptCheckpointError(
                f"checkpoint file {str(path)!r} is corrupt: its sha256 differs from the "
                "one recorded when it was written"
            )
    check_layout(root)
