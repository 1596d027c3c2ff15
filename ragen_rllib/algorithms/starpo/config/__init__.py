"""StarPO's config: every knob declared once (``knobs_*.py``: default, rule, one line
of documentation), the rules between keys (``checks``, ``env_checks``), the reading
of an experiment file's ``config:`` mapping (``yaml_front``) and the config class
(``starpo_config``)."""
