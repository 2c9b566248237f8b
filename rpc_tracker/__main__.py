"""`python -m rpc_tracker`: run a tracker (the same program as `tunefarm tracker`)."""

import sys

from .daemon import main

sys.exit(main())
