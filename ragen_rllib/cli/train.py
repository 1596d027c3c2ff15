"""``rllib train file``: the experiments run through Ray Tune, with a short first screen.

Results (``result.json``, ``progress.csv``), TensorBoard event files and
checkpoints land in Tune's storage path (``--storage-path``, default
``~/ray_results``). The console shows a header per experiment (what runs where,
and where its results go), then one line per iteration.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
from pathlib import Path

from ragen_rllib.agents.hosts import is_loopback
from ragen_rllib.algorithms.starpo.checkpoint import (
    CorruptCheckpointError,
    OldLayoutCheckpointError,
    verify_checkpoint,
)
from ragen_rllib.cli.experiments import (
    UsageError,
    build_config,
    check_stop,
    json_arg,
    load_experiments,
    param_space,
)
from ragen_rllib.cli.plan import hardware_from, plan_text


def header(name: str, config, grid: dict, storage: str) -> str:
    """The lines printed before an experiment starts: what runs where, and where its
    results go (RLlib's full config is in each trial's ``params.json``)."""
    runners = config.num_env_runners
    learners = (
        f"{config.num_learners} learner actors ({config.learner_strategy})"
        if config.num_learners
        else "1, in the trial's process (num_learners=0)"
    )
    trials = len(list(itertools.product(*grid.values()))) if grid else 1
    where = os.path.join(storage, name)
    gateway_warning = None
    if config.agent:  # the agent decides its turns: each model call is one
        playing, turns = f"agent {config.agent}", "a turn per model call"
        if not is_loopback(config.agent_gateway_host):
            gateway_warning = (
                f"  WARNING    the agents' gateway listens on {config.agent_gateway_host}: "
                "anyone who can reach its port can connect; its per-trajectory keys are the "
                "only access control (docs/agents.md)"
            )
    else:
        playing, turns = config.env, f"K<={config.max_turns} turns"
    self_play = config.self_play_note()  # None when off; else on, and why
    lines = [
        f"== {name}: StarPO on {playing} ==",
        f"  model      {config.llm} ({config.dtype_note()})",
        f"  batch      P={config.env_groups} groups x N={config.group_size} rollouts, "
        f"{turns}; {config.advantage_estimator}, "
        f"filter {config.filter_strategy} {config.filter_value_used:g}",
        *([f"  self-play  {self_play}"] if self_play else []),
        f"  rollout    engine {config.engine} in "
        + (f"{runners} runner actor(s)" if runners else "the driver")
        + (", asynchronous" if config.async_rollouts else ""),
        f"  learners   {learners}",
        f"  learner    {config.learner_passes()}",
    ]
    if gateway_warning:
        lines.append(gateway_warning)
    if grid:
        lines.append(f"  sweep      {trials} trials over {', '.join(sorted(grid))}")
    lines += [
        f"  results    {where}",
        f"  curves     rllib report {where}"
        + ("" if importlib.util.find_spec("matplotlib") else '  (needs the ".[report]" extra)'),
    ]
    if importlib.util.find_spec("tensorboard") is not None:
        lines.append(f"             tensorboard --logdir {where}")
    return "\n".join(lines)


def eval_summary(evaluation: dict) -> str:
    """The progress line's evaluation part: the success on the fixed states and on each
    env of each evaluation suite (``eval_suites``), "" in an iteration that did not
    evaluate (``eval_interval``: the key is absent or NaN)."""
    success = evaluation.get("success_rate", float("nan"))
    if success != success:
        return ""
    parts = []
    for suite, envs in evaluation.items():
        if not isinstance(envs, dict):
            continue
        rates = [
            f"{name} {m['success_rate']:.3f}"
            for name, m in envs.items()
            if isinstance(m, dict) and isinstance(m.get("success_rate"), int | float)
        ]
        if rates:
            parts.append(f"{suite}: {', '.join(rates)}")
    suites = f" ({'; '.join(parts)})" if parts else ""
    return f" | eval success {success:.3f}{suites}"


def _print_progress():
    from ray import tune

    class Progress(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            r = result.get("rollout", {})
            learner = result.get("learners", {}).get("default_policy", {})
            ev = result.get("evaluation", {})
            line = (
                f"[{trial.trial_id}] iter {result.get('training_iteration')}: "
                f"success {r.get('success_rate', float('nan')):.3f} "
                f"reward {r.get('reward_mean', float('nan')):.3f} "
                f"group-std {r.get('in_group_reward_std', float('nan')):.3f} "
                f"entropy {learner.get('entropy', float('nan')):.3f} "
                f"time {result.get('time_total_s', 0):.0f}s"
            )
            # A mixture (env_mix): each env's success after the batch's.
            per_env = {
                name: m["success_rate"]
                for name, m in r.items()
                if isinstance(m, dict) and "success_rate" in m
            }
            if per_env:
                line += " (" + ", ".join(f"{n} {v:.2f}" for n, v in per_env.items()) + ")"
            # Evaluation runs every `eval_interval` iterations; between runs the
            # key is absent or NaN.
            line += eval_summary(ev)
            timing = result.get("timing", {})
            if timing:
                # Stage times: waiting for the sample, the update, the weight sync; the
                # idle shares of the runners and the learner; the policy lag trained on.
                line += (
                    f" | wait {timing.get('sample_wait_s', 0):.2f}s "
                    f"learn {timing.get('update_s', 0):.2f}s "
                    f"sync {timing.get('sync_s', 0):.2f}s "
                    f"idle runners {timing.get('runner_idle_share', 0):.0%} "
                    f"learner {timing.get('learner_idle_share', 0):.0%} "
                    f"lag {r.get('policy_lag_mean', 0):.1f}"
                )
            warned = result.get("collapse", {}).get("warning", 0)
            if warned and warned == result.get("training_iteration"):
                line += " | COLLAPSE WARNING (the trial's log says why)"
            print(line, flush=True)

    return Progress()


def check_dashboard_installed() -> None:
    """The dashboard needs Ray's "default" extra; say so before Ray starts without it.

    Ray decides by importing its own list of the dashboard's modules
    (``ray.dashboard.optional_deps``), so the check imports the same list: a partly
    installed extra (one module left over) fails here, not in Ray's log."""
    import importlib

    try:
        importlib.import_module("ray.dashboard.optional_deps")
    except ImportError as err:
        raise UsageError(
            f"--dashboard needs Ray's dashboard packages (missing: {err.name or err}); "
            "install them with: pip install -c constraints.txt 'ragen-rllib[dashboard]' "
            "(or 'ray[default]' at the installed ray version)"
        ) from None


def dashboard_line(url: str) -> str:
    """The console's line for ``--dashboard``: the URL and, where Ray turned on token
    authentication (its default for the local cluster it starts), how to get the token
    the page asks for. Ray's page takes it only in its login dialog (no URL carries
    it), and printing the token itself would put it in every saved console log."""
    line = f"Ray dashboard: http://{url}"
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
    except ImportError:  # another Ray: the same advice, in case its page asks
        return line + " (if it asks for a token: paste what `ray get-auth-token` prints)"
    if is_token_auth_enabled():
        line += (
            " (it asks for a token: paste what `ray get-auth-token` prints, run as this user"
            " in this environment)"
        )
    return line


def check_resumable(path: str, name: str) -> None:
    """Fail before Ray starts when there is nothing to resume or a checkpoint is damaged."""
    from ray import tune

    if not tune.Tuner.can_restore(path):
        raise UsageError(
            f"--resume: no experiment {name!r} to resume under {path}; check --storage-path, "
            "or run without --resume to start it"
        )
    for trial in sorted(Path(path).glob("*/")):
        checkpoints = sorted(trial.glob("checkpoint_*"))
        if checkpoints:  # Tune resumes each trial from its newest checkpoint
            try:
                verify_checkpoint(checkpoints[-1])
            except OldLayoutCheckpointError as err:  # then so is every checkpoint of the run
                raise UsageError(f"--resume: {err}") from err
            except CorruptCheckpointError as err:
                raise UsageError(
                    f"--resume: {err}. Delete that checkpoint folder to resume from the one "
                    "before it."
                ) from err


def wandb_callbacks(project: str | None, group: str) -> list:
    """Tune's own W&B logger for ``--wandb PROJECT``: every trial a W&B run in the
    experiment's group (``WANDB_MODE=offline`` logs to disk without an account)."""
    if not project:
        return []
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise UsageError(
            "--wandb needs the wandb package: pip install -c constraints.txt 'ragen-rllib[wandb]'"
        )
    from ray.air.integrations.wandb import WandbLoggerCallback

    return [WandbLoggerCallback(project=project, group=group, log_config=True)]


def check_runner_hosts(configs: dict[str, tuple]) -> None:
    """Fail now, not as a trial whose runner actors wait forever for a node that has
    what each asks for (custom_resources_per_env_runner, GPUs, CPUs)."""
    from ragen_rllib.distributed.cluster import no_runner_host

    for name, (config, _) in configs.items():
        problem = no_runner_host(config) if config.num_env_runners else None
        if problem:
            raise UsageError(
                f"experiment {name!r} asks for num_env_runners={config.num_env_runners}, "
                f"but {problem}"
            )


def train(args: argparse.Namespace) -> int:
    experiments = load_experiments(args.file)
    stop_override = check_stop(json_arg(args.stop, "--stop"), "--stop")
    config_override = json_arg(args.config, "--config")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UsageError(f"--num-cpus {args.num_cpus} is invalid; allowed: an integer >= 1")
    # Every experiment (every grid point, and its GPUs when Ray is local) is checked
    # before Ray starts.
    hardware = hardware_from(args) if args.dry_run else None
    described = args.dry_run and (args.gpus is not None or args.nodes or args.gpu_memory)
    configs = {
        # A plan for described hardware (another machine) reads only the model's shape.
        name: build_config(exp, config_override, name=name, hardware=hardware, model=not described)
        for name, exp in experiments.items()
    }
    storages = {
        name: os.path.abspath(
            os.path.expanduser(args.storage_path or exp.get("storage_path") or "~/ray_results")
        )
        for name, exp in experiments.items()
    }
    if args.resume and args.wandb:
        # Tune's restore keeps the run's own callbacks and takes no new ones.
        raise UsageError("--wandb cannot be added on --resume: start the run with it")
    if args.resume:
        for name in experiments:
            check_resumable(os.path.join(storages[name], name), name)
    extra_callbacks = {name: wandb_callbacks(args.wandb, name) for name in experiments}
    if args.dry_run:
        fits = True
        for name, (config, grid) in configs.items():
            text, ok = plan_text(name, config, grid, hardware, args.trajectory_tokens)
            points = len(list(itertools.product(*grid.values())))
            print(f"{text}\nexperiment {name!r}: OK ({points} config(s) checked)", flush=True)
            if described:  # a plan for another machine: the model was not loaded here
                try:
                    config.check_model()
                except FileNotFoundError as err:
                    print(
                        f"experiment {name!r}: the model does not load on this machine, so "
                        f"the machine that runs it must have it: {err}",
                        flush=True,
                    )
            if not ok:
                print(f"experiment {name!r}: a device does not fit (see 'to fit' above)")
            fits = fits and ok
        return 0 if fits else 1

    # Tune snapshots its experiment state (trial statuses, their newest checkpoints,
    # result.json) into the storage path every few seconds by default; a run killed
    # between two snapshots would resume from an older checkpoint and lose the rows of
    # the iterations since. Snapshot on every step of Tune's loop instead: it writes a
    # small JSON file and copies the trial logs, cheap next to an LLM iteration.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # A short first screen: our header and one line per iteration replace Tune's
    # tables, and no process draws a progress bar for every model it loads (Ray's
    # workers inherit these settings).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import ray
    from ray import tune

    from ragen_rllib import register_with_tune

    register_with_tune()
    if not ray.is_initialized():
        if args.dashboard:
            check_dashboard_installed()
        context = ray.init(
            include_dashboard=args.dashboard,
            dashboard_host="127.0.0.1",  # this machine only; tunnel it to look from elsewhere
            num_cpus=args.num_cpus,
            log_to_driver=True,
        )
        if args.dashboard:
            print(dashboard_line(context.dashboard_url), flush=True)
    check_runner_hosts(configs)
    status = 0
    for name, exp in experiments.items():
        ckpt = exp.get("checkpoint_config") or {}
        storage = storages[name]
        if args.resume:
            # Tune's own restore: finished trials stay finished, the others go on from
            # their newest checkpoint (weights, optimizer, counters, RNG states).
            tuner = tune.Tuner.restore(
                os.path.join(storage, name),
                trainable=exp["run"],
                param_space=param_space(*configs[name]),
                resume_unfinished=True,
                resume_errored=True,
            )
        else:
            print(header(name, *configs[name], storage), flush=True)
            tuner = tune.Tuner(
                exp["run"],  # resolved through Tune's registry, like any registered trainable
                param_space=param_space(*configs[name]),
                # An agent's trials are named after it (Tune would name the unused env).
                tune_config=tune.TuneConfig(
                    trial_name_creator=_agent_trial_dir, trial_dirname_creator=_agent_trial_dir
                )
                if configs[name][0].agent
                else None,
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage,
                    stop={**(exp.get("stop") or {}), **stop_override},
                    checkpoint_config=tune.CheckpointConfig(
                        checkpoint_frequency=int(ckpt.get("checkpoint_frequency", 0)),
                        checkpoint_at_end=bool(ckpt.get("checkpoint_at_end", True)),
                        num_to_keep=ckpt.get("num_to_keep"),
                    ),
                    callbacks=[_print_progress(), *extra_callbacks[name]],
                    # Our header and one line per iteration, instead of Tune's tables
                    # (the full config is in each trial's params.json).
                    verbose=0,
                ),
            )
        results = tuner.fit()
        for result in results:
            if result.error:
                print(f"experiment {name!r} failed: {result.error}", file=sys.stderr)
                status = 1
            else:
                print(f"experiment {name!r}: results in {result.path}")
                if result.checkpoint:
                    print(f"  checkpoint: {result.checkpoint.path}")
    return status


def _agent_trial_dir(trial) -> str:
    """``StarPO_agent-<module>-<function>_<trial id>``: a trial (its folder, and its name
    in Tune's log lines) named after its agent (``search_agent.py:run`` ->
    ``agent-search_agent-run``)."""
    where, _, function = str(trial.config.get("agent", "")).rpartition(":")
    module = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
    return f"{trial.trainable_name}_agent-{module}-{function}_{trial.trial_id}"
