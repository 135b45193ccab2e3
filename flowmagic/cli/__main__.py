"""`python -m flowmagic.cli` is the `flowmagic` command."""

import sys

from . import main

sys.exit(main())
