"""StarPO's evaluation: success, pass@k and rewards on fixed initial states.

A mixin of :class:`~ragen_rllib.algorithms.starpo.starpo.StarPO`, called by its
training step every ``eval_interval`` iterations and by ``rllib evaluate``. The
states are the training env's (or a suite env's) seeds from ``eval_seed`` on, the
same at every call; the runner in the driver plays them, or the first healthy
remote runner.
"""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.sampling import RunnerFailure
from ragen_rllib.env_choice.eval_suites import EvalEnv, resolve_suites
from ragen_rllib.env_runner.metrics import mean_over_envs


class EvaluationMixin:
    """``evaluate_success`` and ``evaluate_suites`` (the algorithm's config, runners
    and ``_mix`` come from StarPO)."""

    def evaluate_success(
        self,
        num_states: int | None = None,
        temperature: float | None = None,
        first_seed: int | None = None,
        env: EvalEnv | None = None,
        trajectories: list | None = None,
    ) -> dict[str, float]:
        """Success, pass@k and rewards on fixed initial states of the training env, or
        of a suite's ``env`` (the paper's protocol by default). With a mixture: each
        env's metrics under its name, and their mean over the envs. The trajectories
        are appended to ``trajectories`` when it is given."""
        cfg = self.config
        if env is None and len(self._mix) > 1:
            kwargs = {
                "num_states": num_states,
                "temperature": temperature,
                "trajectories": trajectories,
            }
            per_env = {
                e.name: self.evaluate_success(first_seed=first_seed, env=e, **kwargs)
                for e in self._mix
            }
            return {**mean_over_envs(per_env), **per_env}
        args = (
            num_states or cfg.eval_num_states,
            cfg.eval_seed if first_seed is None else first_seed,
            cfg.eval_temperature if temperature is None else temperature,
            env,
            cfg.eval_samples_per_state,
            tuple(cfg.eval_pass_k),
        )
        keep = trajectories is not None
        if self.env_runner is not None:
            metrics, trajs = self.env_runner.evaluate(*args)
        else:

            def run(runner):  # the trajectories cross to the driver only when kept
                metrics, trajs = runner.evaluate(*args)
                return metrics, (trajs if keep else [])

            results = self.env_runner_group.foreach_env_runner(
                run,
                local_env_runner=False,
                remote_worker_ids=self._runner_ids()[:1],
            )
            if not results:
                raise RunnerFailure("the env runner chosen for evaluation failed; see its log")
            metrics, trajs = results[0]
        if keep:
            trajectories.extend(trajs)
        return metrics

    def evaluate_suites(
        self, suites: dict[str, list[EvalEnv]] | None = None, **kwargs
    ) -> dict[str, dict[str, dict[str, float]]]:
        """:meth:`evaluate_success` on every env of every suite (the configured
        ``eval_suites`` by default): suite -> env name -> metrics."""
        suites = resolve_suites(self.config) if suites is None else suites
        return {
            suite: {entry.name: self.evaluate_success(env=entry, **kwargs) for entry in envs}
            for suite, envs in suites.items()
        }

    def evaluate_all(self) -> dict:
        """The training env's and every suite's evaluation, as the training step logs it."""
        return {**self.evaluate_success(), **self.evaluate_suites()}
