"""StarPOLearnerGroup: RLlib's LearnerGroup, with state gathered from FSDP learners.

A shard is not a weight: the actor's weights for the rollout engines and the
module's state in a checkpoint are gathered to full tensors, which is a
collective call that every learner must make. RLlib asks one learner for the
state; this group asks all of them and keeps the first answer, and saves a
checkpoint's learner state through that gathered state (not through one learner
actor, as RLlib would). Restoring hands every learner the full state, and each
keeps its shard (:mod:`ragen_rllib.distributed.fsdp`). Imports nothing of the
project.
"""

from __future__ import annotations

from ray.rllib.core import COMPONENT_LEARNER
from ray.rllib.core.learner.learner_group import LearnerGroup


class StarPOLearnerGroup(LearnerGroup):
    """RLlib's LearnerGroup, except that with FSDP learners the state is gathered
    by all of them together (each call is a collective), and the first answer kept."""

    @property
    def _gathering(self) -> bool:
        return not self.is_local and self.config.learner_strategy == "fsdp"

    def get_checkpointable_components(self):
        # RLlib saves a remote learner through one actor, which alone cannot gather
        # its shards: with FSDP the learner's state goes into this group's own state.
        return [] if self._gathering else super().get_checkpointable_components()

    def get_state(self, components=None, *, not_components=None, **kwargs):
        if not self._gathering:
            return super().get_state(components, not_components=not_components, **kwargs)
        state = {}
        if self._check_component(COMPONENT_LEARNER, components, not_components):
            comps = self._get_subcomponents(COMPONENT_LEARNER, components)
            not_comps = self._get_subcomponents(COMPONENT_LEARNER, not_components)
            results = self.foreach_learner(
                lambda learner: learner.get_state(comps, not_components=not_comps, **kwargs)
            )
            answers = []
            for result in results:
                if not result.ok:
                    raise result.get()
                answers.append(result.get())
            state[COMPONENT_LEARNER] = answers[0]
        return state


def build_learner_group(
    config, *, env=None, spaces=None, rl_module_spec=None, placement_group=None
):
    """``AlgorithmConfig.build_learner_group`` with :class:`StarPOLearnerGroup`."""
    if rl_module_spec is None:
        rl_module_spec = config.get_multi_rl_module_spec(env=env, spaces=spaces)
    return StarPOLearnerGroup(
        config=config.copy(), module_spec=rl_module_spec, placement_group=placement_group
    )
