"""The chat completions gateway's cost per turn against calling the engine in-process.

One HF engine (the built-in model, ``--threads`` torch threads) answers the
same conversations two ways, side by side in one process, alternating:

- ``direct``: the ids from :class:`~ragen_rllib.agents.conversation.ConversationRecorder`
  handed to ``engine.generate`` (what an env runner's own loop costs);
- ``gateway``: the same conversation as an agent would hold it, through the
  ``openai`` client over HTTP to the gateway on 127.0.0.1 (JSON, the chat
  template, the recorder, the batcher).

Two loads: one agent alone (``--turns`` turns; the overhead per turn is the
difference of the medians), and ``--agents`` agents at once, each ``--turns``
turns, against the same prompts generated as one batch per turn directly
(wall time per turn of the whole group). Answers are ``--max-tokens`` long at
most. Prints JSON:

    python bench/bench_gateway.py
    python bench/bench_gateway.py --agents 64 --turns 3 --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--single-turns", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import openai
    import torch
    from transformers import AutoTokenizer

    from ragen_rllib.agents.conversation import ConversationRecorder
    from ragen_rllib.agents.gateway import Gateway, GatewayLimits
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import HFEngine
    from ragen_rllib.models.resolve import resolve_model
    from ragen_rllib.records.trajectory import Trajectory

    torch.set_num_threads(args.threads)
    path = resolve_model("builtin")
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    limits = GatewayLimits(
        model="builtin", temperature=1.0, top_p=1.0, max_new_tokens=args.max_tokens,
        max_context_tokens=2048, batch_wait_s=0.005,
    )  # fmt: skip
    gateway = Gateway(engine, tok, limits, seed=0)
    base_url = gateway.serve()
    params = SamplingParams(1.0, 1.0, args.max_tokens)

    def user(turn: int) -> dict:
        return {"role": "user", "content": f"Turn {turn}: you stand on a frozen lake. Move."}

    def direct_turns(n_agents: int, turns: int, seed: int) -> list[float]:
        """Per turn, the wall time of generating every agent's answer in one call."""
        recs = [ConversationRecorder(tok, Trajectory("bench", 0, g)) for g in range(n_agents)]
        history = [[user(0)] for _ in range(n_agents)]
        times = []
        for turn in range(turns):
            start = time.perf_counter()
            prompts = [r.prompt_ids(h) for r, h in zip(recs, history, strict=True)]
            out = engine.generate(prompts, params, seed=seed + turn)
            for r, h, g in zip(recs, history, out, strict=True):
                text = tok.decode(g.ids, skip_special_tokens=True)
                reply = {"role": "assistant", "content": text}
                r.record_answer(g.ids, g.behaviour_logp, 0, ended_with_eos=g.ended_with_eos,
                                reply=reply)  # fmt: skip
                h += [reply, user(turn + 1)]
            times.append(time.perf_counter() - start)
        return times

    def gateway_turns(n_agents: int, turns: int) -> list[float]:
        """Per turn, the wall time until every agent has its answer over HTTP."""
        keys = [gateway.open(Trajectory("bench", 0, g)) for g in range(n_agents)]
        clients = [openai.OpenAI(base_url=base_url, api_key=k, max_retries=0) for k in keys]
        history = [[user(0)] for _ in range(n_agents)]
        times = []
        for turn in range(turns):

            def ask(i: int, turn: int = turn) -> None:
                out = clients[i].chat.completions.create(model="builtin", messages=history[i])
                history[i] += [out.choices[0].message.model_dump(), user(turn + 1)]

            start = time.perf_counter()
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(n_agents)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            times.append(time.perf_counter() - start)
        for k in keys:
            trajectory, answered = gateway.close(k)
            assert answered == turns and len(trajectory.turn_spans) == turns, "lost a turn"
        return times

    try:
        gateway_turns(1, 2)  # warm-up: the server, the client, the engine
        direct_turns(1, 2, seed=0)
        single_direct, single_gateway = [], []
        for rep in range(2):  # alternate, so that drift hits both sides
            single_direct += direct_turns(1, args.single_turns // 2, seed=rep)
            single_gateway += gateway_turns(1, args.single_turns // 2)
        many_direct = direct_turns(args.agents, args.turns, seed=7)
        many_gateway = gateway_turns(args.agents, args.turns)
        batches = gateway._batcher.batches
    finally:
        gateway.shutdown()
    med = statistics.median
    out = {
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "one_agent": {
            "turns": len(single_direct),
            "direct_ms_per_turn": round(1e3 * med(single_direct), 2),
            "gateway_ms_per_turn": round(1e3 * med(single_gateway), 2),
            "overhead_ms_per_turn": round(1e3 * (med(single_gateway) - med(single_direct)), 2),
        },
        "many_agents": {
            "agents": args.agents,
            "turns": args.turns,
            "direct_s_per_turn": round(med(many_direct), 3),
            "gateway_s_per_turn": round(med(many_gateway), 3),
            "gateway_over_direct": round(med(many_gateway) / med(many_direct), 2),
            "largest_batch": max(batches),
            "requests_answered": gateway.counts["requests"],
        },
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
