"""``python -m ssmstate``: the same command line as the ``ssmstate`` script."""

import sys

from ssmstate.cli import main

sys.exit(main())
