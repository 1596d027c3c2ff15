"""StarPO's config: every knob declared once, in the file of the room that reads it
(``knobs_<room>.py``: default, rule, one line of documentation; ``knobs`` gathers them
into ``KNOBS``), the rules between keys (``checks``, ``env_checks``), the reading of an
experiment file's ``config:`` mapping (``yaml_front``) and the config class
(``starpo_config``)."""
