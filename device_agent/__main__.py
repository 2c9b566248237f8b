"""`python -m device_agent --tracker HOST:PORT --key KEY`: run a device agent (see device_agent.cli)."""

import sys

from device_agent.cli import main

sys.exit(main())
