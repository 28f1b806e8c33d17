"""``python -m mxcore COMMAND`` (the same as the ``mxcore`` console script)."""

import sys

from .cli import main

sys.exit(main())
