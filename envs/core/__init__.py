"""What every env shares: the text env base class, the answer parser, and the base of
the free-text envs (AnswerEnv)."""
