"""A plan as text: where each piece runs, each device's memory by phase, and what to
turn when a device does not fit or has room to spare (``rllib plan``, ``--dry-run``)."""

from __future__ import annotations

from ragen_rllib.planning.memory import fmt_bytes
from ragen_rllib.planning.placement import Device, Plan
from ragen_rllib.planning.shapes import ModelShape

#: A memory component -> the settings that make it smaller (what ``advice`` names).
SHRINK_ADVICE = {
    "weights (fp32 master)": "learner_strategy: fsdp with more learners (shards it), or lora_rank",
    "gradients (fp32)": "lora_rank (adapters only), or learner_strategy: fsdp",
    "AdamW moments (fp32)": "lora_rank (adapters only), or learner_strategy: fsdp",
    "activations (one micro-batch)": "gradient_checkpointing: true, or max_tokens_per_microbatch",
    "critic activations": "gradient_checkpointing: true, or max_tokens_per_microbatch",
    "LM head (one chunk)": "max_tokens_per_microbatch (fewer rows per pass)",
    "critic (weights, AdamW)": "a critic-free estimator (grpo, gigpo), or lora_rank",
    "critic gradients (fp32)": "a critic-free estimator (grpo, gigpo), or lora_rank",
    "KL reference (frozen)": "kl_coeff: 0 (StarPO-S), or lora_rank (the reference is free)",
    "engine KV cache": "vllm_kv_cache_gb, group_size or max_context_tokens",
    "engine KV buffer": "rollout_batch_size, max_context_tokens, env_groups x group_size "
    "(eval_num_states while evaluating)",
    "vLLM reservation": "vllm_gpu_memory_utilization",
    "engine weights": "engine_sleep_level: 2 (frees it during the update)",
}


def advice(dev: Device, most: int = 4) -> list[str]:
    """The knobs of the device's peak phase, its largest components first."""
    lines = sorted(dev.phases[dev.peak_phase()], key=lambda x: -x.bytes)
    out = [
        f"{line.component} ({fmt_bytes(line.bytes)}): {SHRINK_ADVICE[line.component]}"
        for line in lines
        if line.component in SHRINK_ADVICE and line.bytes
    ][:most]
    return out or ["use a smaller model or a larger GPU"]


def room(dev: Device, checkpointing: bool) -> str | None:
    """What a device with room to spare could spend it on: the faster setting its
    own lines name (activations without checkpointing), when that still fits."""
    if not dev.capacity or not dev.fits():
        return None
    spare = dev.capacity - dev.peak()
    if spare < 0.25 * dev.capacity:
        return None
    update = dev.phases.get("update", [])
    act = next((x for x in update if x.component == "activations (one micro-batch)"), None)
    if act is None or not checkpointing or act.other_checkpointing is None:
        return None
    without = act.other_checkpointing
    if sum(x.bytes for x in update) - act.bytes + without > dev.capacity:
        return None
    return (
        f"{fmt_bytes(spare)} to spare: gradient_checkpointing: false fits "
        f"(activations {fmt_bytes(without)}) and skips recomputing every layer"
    )


def render(p: Plan, shape: ModelShape) -> str:
    """The plan as text: placement, then each device's memory table."""
    hw = p.hardware
    gpus = (
        f"{hw.nodes} node(s) x {hw.gpus_per_node} GPU(s)"
        + (f" of {fmt_bytes(hw.gpu_bytes)}" if hw.gpu_bytes else "")
        if hw.gpus_per_node
        else "no GPU"
    )
    out = [
        f"  hardware   {gpus} ({hw.source})",
        f"  model      {shape.name}: {shape.params() / 1e6:,.1f}M parameters ({shape.source})",
        f"  layout     {p.layout}",
        "  placement",
    ]
    for piece in p.pieces:
        out.append(
            f"    {piece.name:<9} node {piece.node}  {piece.gpu:<14} {piece.holds:<22} {piece.why}"
        )
    out.append("  memory (estimated peak per device)")
    # Devices holding the same pieces (the learners of a group, say) are shown once.
    groups: dict[tuple, list[Device]] = {}
    for dev in p.devices:
        groups.setdefault((repr(dev.phases), dev.capacity), []).append(dev)
    for same in groups.values():
        dev = same[0]
        cap = f" of {fmt_bytes(dev.capacity)}" if dev.capacity else ""
        verdict = "fits" if dev.fits() else "DOES NOT FIT"
        label = dev.label if len(same) == 1 else f"{', '.join(d.label for d in same)} (each)"
        out.append(f"    {label}: {fmt_bytes(dev.peak())}{cap} ({dev.peak_phase()}): {verdict}")
        for phase, lines in dev.phases.items():
            if len(dev.phases) > 1:
                out.append(f"      during {phase}: {fmt_bytes(sum(x.bytes for x in lines))}")
            for line in lines:
                note = f"  ({line.note})" if line.note else ""
                out.append(f"        {line.component:<36} {fmt_bytes(line.bytes):>10}{note}")
        if not dev.fits():
            out.append("      to fit: the knobs of its largest parts")
            out += [f"        {line}" for line in advice(dev)]
        elif (spare := room(dev, p.checkpointing)) is not None:
            out.append(f"      room: {spare}")
    out += [f"  note: {n}" for n in p.notes]
    return "\n".join(out)
