"""``python -m mxcore COMMAND`` (the same as the ``mxcore`` console script)."""

import sys

from .tools.cli import main

sys.exit(main())
