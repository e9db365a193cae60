"""``python -m lakestream.demo``."""

import sys

from lakestream.demo.job import main

sys.exit(main())
