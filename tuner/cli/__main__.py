"""`python -m tuner.cli ...` is `tunefarm ...`."""

import sys

from . import main

sys.exit(main())
