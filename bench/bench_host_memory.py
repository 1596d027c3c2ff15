"""Resident memory of one training run with and without trimming the C heap, side by side.

Runs ``bench_train_cpu.py`` on the same example twice at the same time, one torch
thread each, the two arms alike but for ``RAGEN_RLLIB_TRIM_HEAP`` (``1``: the runners
and learners hand glibc's free memory back after every batch and update, the
default; ``0``: they do not, the baseline). Prints each arm's resident memory
(its whole process tree) every minute, then its peak, the iterations it ran and the
median seconds an iteration, and whether the two arms trained alike (their
per-iteration rewards: trimming must not change what is learnt; with
asynchronous sampling, ``max_policy_lag`` above 0, they may differ by timing
alone).

    python bench/bench_host_memory.py tuned_examples/tictactoe_selfplay_smollm2_cpu.yaml \\
        --minutes 14 --config '{"rollout_batch_size": 64}'

The arms' logs, figures and per-iteration curves are kept in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train_cpu import tree_rss_bytes  # noqa: E402

ARMS = {"trimmed": "1", "untrimmed": "0"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="experiment YAML (its first experiment is run)")
    parser.add_argument("--minutes", type=float, default=12.0, help="each arm's wall time")
    parser.add_argument("--config", default="{}", help="JSON object merged into the config")
    parser.add_argument("--out", default=None, help="folder for the arms' logs (default: temp)")
    args = parser.parse_args(argv)
    json.loads(args.config)  # a bad one stops here, not in both arms
    out = Path(args.out or tempfile.mkdtemp(prefix="host_memory_"))
    out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("bench_train_cpu.py")
    procs, logs = {}, {}
    peak = dict.fromkeys(ARMS, 0)
    try:
        for arm, flag in ARMS.items():
            logs[arm] = open(out / f"{arm}.log", "w")  # noqa: SIM115 - closed below
            command = [sys.executable, str(script), args.file, "--minutes", str(args.minutes)]
            command += ["--threads", "1", "--config", args.config]
            command += ["--json", str(out / f"{arm}.json")]
            command += ["--curve", str(out / f"{arm}_curve.jsonl")]
            env = {**os.environ, "RAGEN_RLLIB_TRIM_HEAP": flag}
            procs[arm] = subprocess.Popen(
                command, stdout=logs[arm], stderr=subprocess.STDOUT, env=env
            )
        print(f"two arms of {args.file}, {args.minutes:g} min each; logs in {out}", flush=True)
        print("minute  " + "  ".join(f"{arm:>9} GiB" for arm in ARMS), flush=True)
        start, next_row = time.monotonic(), 60.0
        while any(p.poll() is None for p in procs.values()):
            now = {a: tree_rss_bytes(p.pid) if p.poll() is None else 0 for a, p in procs.items()}
            peak = {arm: max(peak[arm], now[arm]) for arm in ARMS}
            if time.monotonic() - start >= next_row:
                row = "  ".join(f"{now[arm] / 2**30:13.2f}" for arm in ARMS)
                print(f"{next_row / 60:6.0f}  {row}", flush=True)
                next_row += 60.0
            time.sleep(2.0)
    finally:  # interrupted: no arm goes on training on its own
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait()
        for log in logs.values():
            log.close()
    for arm, p in procs.items():
        print(
            f"{arm:>9}: peak {peak[arm] / 2**30:.2f} GiB (sampled every 2 s), exit {p.returncode}"
        )
    failed = [arm for arm, p in procs.items() if p.returncode != 0]
    if failed:
        print(f"arm(s) {failed} failed: see {out}/<arm>.log", file=sys.stderr)
        return 1
    curves = {}
    for arm in ARMS:
        figures = json.loads((out / f"{arm}.json").read_text())
        lines = (out / f"{arm}_curve.jsonl").read_text().splitlines()
        curves[arm] = [json.loads(line)["reward_mean"] for line in lines]
        print(
            f"{arm:>9}: peak {figures['peak_rss_gib']} GiB (bench_train_cpu's, every 0.5 s), "
            f"{figures['iterations']} iterations, median {figures.get('iteration_s_median')} s "
            "an iteration"
        )
    shared = min(len(c) for c in curves.values())
    alike = curves["trimmed"][:shared] == curves["untrimmed"][:shared]
    print(f"rewards of the {shared} iterations both ran: {'the same' if alike else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
