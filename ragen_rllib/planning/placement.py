"""Where each piece of a run goes, and what each device holds at its peak.

RLlib asks Ray for one placement group per trial: a bundle for the driver
(which is also the learner when ``num_learners`` is 0, and holds the rollout
engine when ``num_env_runners`` is 0), one per remote env runner and one per
remote learner. :func:`plan` lays those bundles on the described hardware the
way Ray's PACK strategy does (fill a node before the next, share a GPU between
fractional bundles), says why each piece is where it is, and totals the memory
of every device from :mod:`~ragen_rllib.planning.memory`
(:mod:`~ragen_rllib.planning.render` prints it).

Three layouts come out of the config:

- **colocated**: ``num_learners: 0``, ``num_env_runners: 0`` and a GPU for the
  learner: the learner and the engine share that GPU in one process; the engine
  releases its memory while the learner updates (``engine_sleep_level``);
- **split**: runner actors on their own GPUs (``num_gpus_per_env_runner``),
  learners (DDP or FSDP) on theirs; rollouts and updates may overlap
  (``async_rollouts``);
- **cpu**: no GPU asked for.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ragen_rllib.planning.memory import (
    CPU_RUNTIME_BYTES,
    GIB,
    GPU_RUNTIME_BYTES,
    RAY_HEAD_BYTES,
    Line,
    engine_lines,
    learner_lines,
    workload,
)
from ragen_rllib.planning.shapes import ModelShape

RAY_HEAD_NOTE = "raylet, GCS, dashboard, agents, workers"
#: What ``engine_sleep_level`` does to the engine's memory during the update.
RESIDENT = {"weights (fp32 master)", "weights (frozen base)", "weights (LoRA adapters, fp32)"}
# Between updates the gradients are freed (the actor's and the critic's alike).
RESIDENT |= {"AdamW moments (fp32)", "critic (weights, AdamW)", "KL reference (frozen)"}


@dataclass(frozen=True)
class Hardware:
    """GPUs per node, their memory and how many nodes (described or seen here)."""

    nodes: int = 1
    gpus_per_node: int = 0
    gpu_bytes: int | None = None
    source: str = "this machine"
    cpu_bytes: int | None = None


@dataclass
class Piece:
    name: str
    node: int
    gpu: str
    holds: str
    why: str


@dataclass
class Device:
    label: str
    capacity: int | None
    phases: dict[str, list[Line]] = field(default_factory=dict)

    def peak(self) -> int:
        return max((sum(x.bytes for x in lines) for lines in self.phases.values()), default=0)

    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(x.bytes for x in self.phases[p]))

    def fits(self) -> bool:
        return self.capacity is None or self.peak() <= self.capacity


@dataclass
class Plan:
    layout: str
    hardware: Hardware
    pieces: list[Piece]
    devices: list[Device]
    notes: list[str]
    checkpointing: bool = False  # the config's gradient_checkpointing

    def fits(self) -> bool:
        return all(d.fits() for d in self.devices)


class PlacementError(ValueError):
    """The config asks for more than the hardware has."""


def local_hardware() -> Hardware:
    """The GPUs this process sees (torch), and this machine's memory."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if count else None
    try:
        cpu_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        cpu_bytes = None
    return Hardware(1, count, gpu_bytes, "this machine", cpu_bytes)


def sleep_level_used(config, colocated: bool, on_gpu: bool) -> int:
    """engine_sleep_level, with null resolved: 2 when the engine shares a GPU with the
    learner, else 0."""
    level = config.engine_sleep_level
    if level is None:
        return 2 if colocated and on_gpu else 0
    return int(level)


def beside_learner(config) -> bool:
    """Whether this process's engine shares its process (and device) with the learner:
    the runner in the driver (num_env_runners 0) with the learner there too."""
    return config.num_env_runners == 0 and config.num_learners == 0


def vllm_memory_share(config, model_path: str) -> float:
    """vllm_gpu_memory_utilization, with null resolved: 0.85 of a GPU of its own, or
    beside the learner what its weights and the P x N trajectories' KV cache need
    (the memory planner's estimate plus 1 GiB of workspace)."""
    if config.vllm_gpu_memory_utilization is not None:
        return float(config.vllm_gpu_memory_utilization)
    import torch

    if not (beside_learner(config) and torch.cuda.is_available()):
        return 0.85
    from ragen_rllib.planning.shapes import load_shape

    sequences = config.env_groups * config.group_size
    need = sum(
        x.bytes for x in engine_lines(config, load_shape(model_path), sequences, None, False)
    )
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return min(0.9, (need + GIB) / total)


def gpus_asked(config) -> float:
    """The GPUs RLlib asks Ray for: the driver's (the learner's, with num_learners 0),
    each remote learner's and each remote runner's."""
    learners = config.num_learners if config.num_learners else 1
    return (
        config.num_gpus_per_learner * learners
        + config.num_gpus_per_env_runner * config.num_env_runners
    )


def _layout(config) -> str:
    learner_gpu = config.num_gpus_per_learner > 0
    if config.num_env_runners == 0 and config.num_learners == 0 and learner_gpu:
        return "colocated"
    if learner_gpu or (config.num_env_runners and config.num_gpus_per_env_runner > 0):
        return "split"
    return "cpu"


class _Slots:
    """Free GPU share per (node, gpu), filled in PACK order."""

    def __init__(self, hw: Hardware):
        self.hw = hw
        self.free = [[1.0] * hw.gpus_per_node for _ in range(hw.nodes)]

    def take(self, need: float, what: str) -> tuple[int, str]:
        if need <= 0:
            return 0, "-"
        whole = math.ceil(need - 1e-9) if need >= 1 else 0
        for node, gpus in enumerate(self.free):
            if whole:
                idle = [i for i, f in enumerate(gpus) if f >= 1.0 - 1e-9][:whole]
                if len(idle) == whole:
                    for i in idle:
                        gpus[i] = 0.0
                    return node, ", ".join(f"GPU {i}" for i in idle)
            else:
                for i, f in enumerate(gpus):
                    if f >= need - 1e-9:
                        gpus[i] = f - need
                        return node, f"GPU {i} ({need:g})"
        total = self.hw.nodes * self.hw.gpus_per_node
        raise PlacementError(
            f"{what} needs {need:g} GPU(s) and none is left: the run asks for more than the "
            f"{total} GPU(s) of {self.hw.nodes} node(s) x {self.hw.gpus_per_node} "
            f"({self.hw.source}); lower num_learners / num_env_runners or their "
            "num_gpus_per_*, or give --gpus / --nodes for the cluster you will run on"
        )


def plan(config, shape: ModelShape, hw: Hardware, trajectory_tokens: int | None = None) -> Plan:
    """Place the run's pieces on ``hw`` and total each device's memory."""
    layout = _layout(config)
    learners = max(1, config.num_learners)
    runners = config.num_env_runners
    slots = _Slots(hw)
    load = workload(config, learners, trajectory_tokens)
    notes: list[str] = []
    pieces: list[Piece] = []
    devices: dict[str, Device] = {}
    on_gpu = layout != "cpu"
    runtime = Line("runtime", GPU_RUNTIME_BYTES if on_gpu else CPU_RUNTIME_BYTES, "per process")

    def device(node: int, gpu: str, fallback: str) -> Device:
        label = f"node {node} {gpu.split(' (')[0]}" if gpu != "-" else fallback
        capacity = hw.gpu_bytes if gpu != "-" else hw.cpu_bytes
        return devices.setdefault(label, Device(label, capacity))

    learn = learner_lines(config, shape, learners, load)
    resident = [x for x in learn if x.component in RESIDENT]
    level = sleep_level_used(config, layout == "colocated", on_gpu)
    engine = engine_lines(config, shape, load.sequences, hw.gpu_bytes, shares_weights=False)
    asleep = {0: engine, 1: [], 2: []}[level]

    # The driver: the learner when num_learners is 0, the engine when num_env_runners is 0.
    driver_gpu = config.num_gpus_per_learner if config.num_learners == 0 else 0
    node, gpu = slots.take(driver_gpu, "the driver (the learner, num_learners 0)")
    holds = []
    if config.num_learners == 0:
        holds.append("learner")
    if runners == 0:
        holds.append(f"engine ({config.engine})")
    why = "the algorithm's process (Tune trial)"
    if layout == "colocated":
        why += (
            f"; learner and engine share one GPU, the engine sleeps (level {level}) during "
            "each update and reloads the new weights after it"
        )
    elif runners == 0 and config.num_learners > 0:
        why += "; it has no GPU, so rollouts run on its CPU"
        notes.append(
            "rollouts run on the driver's CPU: set num_env_runners >= 1 and "
            "num_gpus_per_env_runner to give the engine a GPU"
        )
    pieces.append(Piece("driver", node, gpu, " + ".join(holds) or "coordination", why))
    dev = device(node, gpu, f"node {node} driver (CPU memory)")
    # On CPU memory, what a process-tree RSS of the run reads holds Ray's own processes.
    ray = [] if gpu != "-" else [Line("Ray (head node)", RAY_HEAD_BYTES, RAY_HEAD_NOTE)]
    evaluating = None
    if load.evaluation_rows:
        evaluating = engine_lines(
            config, shape, load.evaluation_rows, hw.gpu_bytes, shares_weights=False
        )
    if config.num_learners == 0:
        if runners == 0:
            dev.phases["rollout"] = [runtime, *ray, *resident, *engine]
            dev.phases["update"] = [runtime, *ray, *learn, *asleep]
            if evaluating:
                dev.phases["evaluation"] = [runtime, *ray, *resident, *evaluating]
        else:
            dev.phases["update"] = [runtime, *ray, *learn]
    elif runners == 0:
        dev.phases["rollout"] = [runtime, *ray, *engine]
        if evaluating:
            dev.phases["evaluation"] = [runtime, *ray, *evaluating]
    else:
        dev.phases["coordination"] = [runtime, *ray]

    for i in range(config.num_learners):
        node, gpu = slots.take(config.num_gpus_per_learner, f"learner {i}")
        strategy = config.learner_strategy if config.num_learners > 1 else "one learner"
        pieces.append(
            Piece(f"learner {i}", node, gpu, "learner", f"remote learner actor ({strategy})")
        )
        dev = device(node, gpu, f"node {node} learner {i} (CPU memory)")
        dev.phases.setdefault("update", []).extend([runtime, *learn])
    per_runner = -(-config.env_groups // max(1, runners)) * config.group_size
    for i in range(runners):
        node, gpu = slots.take(config.num_gpus_per_env_runner, f"env runner {i}")
        pieces.append(
            Piece(
                f"runner {i + 1}",
                node,
                gpu,
                f"engine ({config.engine})",
                f"remote rollout actor, {per_runner} of the {load.sequences} trajectories",
            )
        )
        lines = engine_lines(config, shape, per_runner, hw.gpu_bytes, shares_weights=False)
        if gpu != "-" and config.engine == "vllm" and hw.gpu_bytes:
            util = config.vllm_gpu_memory_utilization or 0.85
            share = config.num_gpus_per_env_runner if config.num_gpus_per_env_runner < 1 else 1
            lines = [Line("vLLM reservation", int(util * hw.gpu_bytes), f"{util:g} of the card")]
            if util > share + 1e-9:
                notes.append(
                    f"runner {i + 1} has {share:g} of a GPU but vLLM takes "
                    f"vllm_gpu_memory_utilization={util:g} of it: lower it to <= {share:g}"
                )
        dev = device(node, gpu, f"node {node} runner {i + 1} (CPU memory)")
        dev.phases.setdefault("rollout", []).extend([runtime, *lines])
        if load.evaluation_rows and not (gpu != "-" and config.engine == "vllm"):
            share = -(-load.evaluation_rows // runners)
            evaluation = engine_lines(config, shape, share, hw.gpu_bytes, shares_weights=False)
            dev.phases.setdefault("evaluation", []).extend([runtime, *evaluation])
    if hw.nodes > 1 and config.learner_strategy == "fsdp" and config.num_learners > 1:
        spanned = {p.node for p in pieces if p.name.startswith("learner")}
        if len(spanned) > 1:
            notes.append(
                f"the FSDP learners span nodes {sorted(spanned)}: every layer's all-gather "
                "crosses the network; keep a FSDP group within a node when it fits"
            )
    if config.async_rollouts and layout == "colocated":
        notes.append("async_rollouts needs runner actors; a colocated run is synchronous")
    checkpointing = bool(config.gradient_checkpointing)
    return Plan(layout, hw, pieces, list(devices.values()), notes, checkpointing)
