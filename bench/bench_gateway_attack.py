"""The agents' gateway under a connection flood: what keyless clients can hold.

Starts a gateway (the built-in model on the HF engine) in this process with its
file descriptors capped at ``--nofile`` (as ``ulimit -n`` would), then, from a
second process, opens ``--stalled`` connections that send half a request
header and never finish it, with no key. After ``--hold`` seconds it measures,
while they are still being held by the attacker:

- how many of the stalled connections the gateway still keeps open;
- the gateway process's open file descriptors, and whether it can still open a
  file (``open()`` of the model's config, as reading weights would);
- one legitimate agent's request (the ``openai`` client with a key): its
  latency, against the same request before the flood;
- the log lines the gateway process wrote during the flood (Python logging,
  asyncio's and uvicorn's included).

Prints JSON. The numbers before and after a change come from running the same
script against each version of the package:

    python bench/bench_gateway_attack.py --stalled 2000 --nofile 512
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time

_ATTACKER = r"""
import resource, socket, sys, time
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own limit is not ours
host, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks, failed = [], 0
for _ in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    except OSError:
        failed += 1
print(f"opened {len(socks)} failed {failed}", flush=True)
time.sleep(hold)
open_now = 0
for s in socks:
    s.setblocking(False)
    try:
        open_now += s.recv(1) != b""  # data (an answer) also means open
    except BlockingIOError:
        open_now += 1  # nothing to read: the server still holds it
    except OSError:
        pass
print(f"still_open {open_now}", flush=True)
sys.stdin.readline()  # hold them until told
"""


class _Count(logging.Handler):
    """Counts each log record once, on whichever of the watched loggers it reaches."""

    LOGGERS = ("", "asyncio", "uvicorn", "uvicorn.error", "ragen_rllib")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.add(id(record))

    def attach(self, on: bool) -> None:
        for name in self.LOGGERS:
            (logging.getLogger(name).addHandler if on else logging.getLogger(name).removeHandler)(
                self
            )


def _fds() -> int:
    """This process's open descriptors (-1: none left to even list them)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalled", type=int, default=2000)
    parser.add_argument("--nofile", type=int, default=512)
    parser.add_argument("--hold", type=float, default=20.0)
    args = parser.parse_args(argv)

    import openai
    from transformers import AutoTokenizer

    from ragen_rllib.agents.gateway import Gateway, GatewayLimits
    from ragen_rllib.engines.hf_engine import HFEngine
    from ragen_rllib.models.resolve import resolve_model
    from ragen_rllib.records.trajectory import Trajectory

    path = resolve_model("builtin")
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    limits = GatewayLimits(
        model="builtin", temperature=1.0, top_p=1.0, max_new_tokens=8, max_context_tokens=400
    )
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))  # as `ulimit -n` would
    gateway = Gateway(engine, tok, limits, seed=0)
    base_url = gateway.serve()
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])

    def request() -> float:
        """Seconds for one completion; -1 timed out, -2 refused or failed, -3 the
        client could not even be made (no file descriptor left)."""
        key = gateway.open(Trajectory(env_id="agent", seed=0, group=0))
        start = time.perf_counter()
        try:
            client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
        except OSError:
            gateway.close(key)
            return -3.0
        try:
            client.chat.completions.create(
                model="builtin", messages=[{"role": "user", "content": "Go."}], max_tokens=8
            )
            return time.perf_counter() - start
        except Exception as err:  # noqa: BLE001 - what the flood does to it is the figure
            return -1.0 if "timed out" in str(err).lower() else -2.0
        finally:
            gateway.close(key)

    request()  # warm
    before = sorted(request() for _ in range(3))[1]
    fds_before = _fds()

    counter = _Count()
    counter.attach(True)
    attacker = subprocess.Popen(
        [sys.executable, "-c", _ATTACKER, "127.0.0.1", str(port), str(args.stalled),
         str(args.hold)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    opened = attacker.stdout.readline().split()
    during = request()
    try:
        with open(os.path.join(path, "config.json")) as f:
            can_open = bool(f.read(1))
    except OSError:
        can_open = False
    fds_during = _fds()
    still_open = int(attacker.stdout.readline().split()[1])
    attacker.stdin.write("\n")
    attacker.stdin.flush()
    attacker.wait(timeout=60)
    after = request()
    counter.attach(False)
    print(json.dumps({
        "stalled_opened": int(opened[1]), "stalled_failed": int(opened[3]),
        "stalled_still_open_after_hold_s": still_open, "hold_s": args.hold,
        "gateway_fds_before": fds_before, "gateway_fds_during": fds_during,
        "nofile": args.nofile, "open_file_during": can_open,
        "request_s_before": round(before, 3), "request_s_during": round(during, 3),
        "request_s_after": round(after, 3), "log_records_during": len(counter.seen),
        "gateway_counts": dict(gateway.counts),
    }))  # fmt: skip
    gateway.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
