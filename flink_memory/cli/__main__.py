"""`python -m flink_memory.cli`: the same commands as the `flink-memory` script."""

import sys

from flink_memory.cli import main

sys.exit(main())
