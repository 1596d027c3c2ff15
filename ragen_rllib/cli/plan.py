"""``rllib plan <yaml>``: where each piece of each experiment runs, and whether it fits.

Reads the experiment file and the model's ``config.json`` (never its weights),
lays every piece on the GPUs this machine has, or on the ones described with
``--gpus``, ``--nodes`` and ``--gpu-memory``, and prints the placement and an
estimated memory table per device, with the knob to turn where a device does
not fit. ``rllib train file <yaml> --dry-run`` prints the same. Exit status 0
when everything fits, 1 when a device does not, 2 for a bad file or flag.
"""

from __future__ import annotations

import argparse
import itertools
import re

from ragen_rllib.cli.experiments import UsageError, build_config, json_arg, load_experiments

_UNITS = {"gib": 1 << 30, "g": 1 << 30, "gb": 10**9, "mib": 1 << 20, "m": 1 << 20, "mb": 10**6}


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '24G' -> bytes (G and GiB are 2**30, GB is 10**9)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise UsageError(
            f"--gpu-memory {text!r} is invalid; allowed: a size such as 24GiB, 80GB or 40G"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def add_hardware_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, help="GPUs in all (default: this machine's)")
    parser.add_argument("--nodes", type=int, default=None, help="nodes the GPUs are spread over")
    parser.add_argument("--gpu-memory", help="memory of each GPU, e.g. 24GiB or 80GB")
    parser.add_argument(
        "--trajectory-tokens",
        type=int,
        help="tokens of one training sequence (default: max_context_tokens, the worst case)",
    )


def hardware_from(args: argparse.Namespace):
    """The hardware to plan for: described by the flags, else this machine's."""
    from ragen_rllib.planning.placement import Hardware, local_hardware

    here = local_hardware()
    described = args.gpus is not None or args.nodes is not None or args.gpu_memory
    if not described:
        return here
    gpus = here.gpus_per_node if args.gpus is None else args.gpus
    nodes = 1 if args.nodes is None else args.nodes
    if gpus < 0 or nodes < 1 or (gpus and gpus % nodes):
        raise UsageError(
            f"--gpus {gpus} --nodes {nodes} is invalid; allowed: --nodes >= 1 and --gpus a "
            "multiple of it (the same GPUs on every node)"
        )
    memory = parse_size(args.gpu_memory) if args.gpu_memory else here.gpu_bytes
    if gpus and memory is None:
        raise UsageError("--gpus needs --gpu-memory here (this machine has no GPU to read it from)")
    source = f"--gpus {gpus}" + (f" --nodes {nodes}" if nodes > 1 else "")
    return Hardware(nodes, gpus // nodes, memory, source, None)


def plan_text(name: str, config, grid: dict, hardware, trajectory_tokens: int | None):
    """(text, fits) for one experiment: the first grid point's plan."""
    from ragen_rllib.planning.placement import PlacementError, plan
    from ragen_rllib.planning.render import render
    from ragen_rllib.planning.shapes import load_shape

    if trajectory_tokens is not None and trajectory_tokens < 1:
        raise UsageError(f"--trajectory-tokens {trajectory_tokens} is invalid; allowed: >= 1")
    points = len(list(itertools.product(*grid.values()))) if grid else 1
    head = f"== {name}: StarPO on {config.env}, {config.llm} ({config.model_dtype_used}) =="
    if points > 1:
        head += f"\n  ({points} grid points over {', '.join(sorted(grid))}; the first one's plan)"
    try:
        shape = load_shape(config.llm)
        laid = plan(config, shape, hardware, trajectory_tokens)
    except PlacementError as err:
        raise UsageError(f"experiment {name!r}: {err}") from None
    text = f"{head}\n{render(laid, shape)}"
    tree = tree_note(config)
    return (text + f"\n  {tree}" if tree else text), laid.fits()


def tree_note(config) -> str | None:
    """What the learner's prefix tree saves per iteration, estimated from the run's first
    prompts (None without shared prefixes, for an agent, or without a local tokenizer)."""
    from ragen_rllib.env_runner.context_budget import shared_prompt_tokens
    from ragen_rllib.models.resolve import resolve_model
    from ragen_rllib.planning.memory import tree_tokens

    if not (config.pack_sequences and config.share_prefixes) or config.agent:
        return None
    try:
        prompts = shared_prompt_tokens(config, resolve_model(config.llm))
    except (OSError, ValueError):
        return None
    if prompts is None:
        return None
    common, first = prompts
    rows, encoded = tree_tokens(config, common, first)
    return (
        f"prefix tree: an update of {config.env_groups} x {config.group_size} trajectories of "
        f"{config.max_turns} turns trains up to {rows:,} row tokens and encodes about "
        f"{encoded:,} ({1 - encoded / rows:.0%} saved): every first prompt begins with "
        f"the same {common} tokens (system message, instructions), encoded once a pass, "
        f"and a group's first prompt ({first} tokens at most) once for its N first turns"
    )


def plan_command(args: argparse.Namespace) -> int:
    experiments = load_experiments(args.file)
    overrides = json_arg(args.config, "--config")
    hardware = hardware_from(args)
    fits = True
    for name, exp in experiments.items():
        config, grid = build_config(exp, overrides, name=name, hardware=hardware, model=False)
        text, ok = plan_text(name, config, grid, hardware, args.trajectory_tokens)
        print(text, flush=True)
        fits = fits and ok
    return 0 if fits else 1
