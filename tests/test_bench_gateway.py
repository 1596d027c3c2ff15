"""bench/bench_gateway.py at a small size: both paths answer every turn (the bench
asserts no turn is lost) and every figure it prints is there and positive."""

from __future__ import annotations

from conftest import run_bench


def test_the_gateway_bench_runs(tmp_path):
    args = ("--agents", "4", "--turns", "2", "--single-turns", "2", "--max-tokens", "4")
    out = run_bench(tmp_path, "bench_gateway.py", *args)
    one, many = out["one_agent"], out["many_agents"]
    assert one["turns"] == 2 and one["direct_ms_per_turn"] > 0 and one["gateway_ms_per_turn"] > 0
    assert many["direct_s_per_turn"] > 0 and many["gateway_s_per_turn"] > 0
    # 2 warm-up turns, 2 single turns, 4 agents x 2 turns.
    assert many["requests_answered"] == 2 + 2 + 8
    assert 1 <= many["largest_batch"] <= 4


def test_the_connection_flood_bench_runs_and_the_gateway_holds(tmp_path):
    """bench/bench_gateway_attack.py at a small size, with the descriptor limit low
    enough that 300 stalled connections would exhaust it without the cap: none is
    held after the header deadline, the agent's request is answered during the flood,
    and the gateway logs next to nothing."""
    out = run_bench(
        tmp_path, "bench_gateway_attack.py", "--stalled", "300", "--nofile", "384", "--hold", "12"
    )
    assert out["stalled_opened"] == 300
    assert out["stalled_still_open_after_hold_s"] == 0
    assert 0 < out["gateway_fds_during"] < out["nofile"] // 2 + 40
    assert out["open_file_during"] and out["request_s_during"] > 0
    assert out["log_records_during"] <= 2
    assert out["gateway_counts"]["connections_evicted"] > 0


def test_the_agent_isolation_bench_runs_and_processes_leave_nothing(tmp_path):
    """bench/bench_agent_isolation.py at a small size: with worker processes the
    hung agents are killed and the runner's threads and descriptors do not grow; with
    threads they are left running, one thread per hung call."""
    out = run_bench(
        tmp_path, "bench_agent_isolation.py",
        "--batches", "2", "--batch", "6", "--hang-every", "2", "--timeout", "10",
    )  # fmt: skip
    proc, thread = out["process"], out["thread"]
    assert proc["agents_killed"] == proc["agent_timeouts"] == 6
    # 3 calls hung after the first batch: a thread each would be 3 more. The count is
    # the whole process's, where a lazily grown pool (an event loop's default executor,
    # say) may add one under load (a CI run read 11 -> 12), so: fewer than 3.
    grown = proc["after_last_batch"]["threads"] - proc["after_first_batch"]["threads"]
    assert grown <= 1, proc
    assert proc["after_last_batch"]["fds"] <= proc["after_first_batch"]["fds"]
    assert thread["agents_killed"] == 0 and thread["hung_threads_at_end"] == 6
