"""``python -m ragen_rllib.cli``: the ``rllib`` command without its console script."""

import sys

from ragen_rllib.cli import main

sys.exit(main())
