"""``python -m app.cli``: the ``keyseed`` command."""

import sys

from app.cli import main

sys.exit(main())
