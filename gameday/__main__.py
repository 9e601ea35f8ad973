"""Entry point of `python -m gameday`."""

import sys

from gameday.cli import main

sys.exit(main())
