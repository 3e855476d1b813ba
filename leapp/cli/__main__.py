"""``python -m leapp.cli``: the ``leapp`` command without its console script."""

import sys

from leapp.cli import main

sys.exit(main())
