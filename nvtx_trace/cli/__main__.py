"""``python -m nvtx_trace.cli``: the same as the ``nvtx-trace`` console script."""

import sys

from nvtx_trace.cli import main

sys.exit(main())
