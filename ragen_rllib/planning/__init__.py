"""Before launch: where each piece of a run goes and what memory each device needs.

:mod:`~ragen_rllib.planning.shapes` reads a model's shape from its config.json,
:mod:`~ragen_rllib.planning.memory` estimates every component's bytes, and
:mod:`~ragen_rllib.planning.placement` lays the run on the hardware and totals
each device, and :mod:`~ragen_rllib.planning.render` writes that as text with the
knobs to turn. ``rllib plan`` and ``rllib train file --dry-run`` print it.
"""
