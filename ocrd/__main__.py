"""`python -m ocrd` is the same as the `ocrd` command."""

import sys

from .cli import main

sys.exit(main())
