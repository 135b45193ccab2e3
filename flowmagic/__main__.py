"""`python -m flowmagic` is the `flowmagic` command."""

import sys

from .cli import main

sys.exit(main())
