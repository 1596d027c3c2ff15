"""``rllib export <checkpoint> <dir>``: the checkpoint's actor as a Hugging Face model.

The folder loads with ``AutoModelForCausalLM.from_pretrained`` and with vLLM
(:mod:`ragen_rllib.algorithms.starpo.export` says what is in it); a checkpoint
whose files do not match its manifest is refused before anything is read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen_rllib.algorithms.starpo.checkpoint import CorruptCheckpointError
from ragen_rllib.cli.experiments import UsageError


def export(args: argparse.Namespace) -> int:
    from ragen_rllib.algorithms.starpo.export import (
        export_module,
        load_module,
        training_settings,
    )

    path = Path(args.checkpoint).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is not a directory")
    try:
        module = load_module(path)
        files = export_module(
            module,
            Path(args.dir).expanduser(),
            with_critic=args.with_critic,
            dtype=args.dtype,
            settings=training_settings(path),
        )
    except (CorruptCheckpointError, FileExistsError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err
    print(json.dumps({"exported": str(Path(args.dir).expanduser()), "files": files}, indent=2))
    return 0
