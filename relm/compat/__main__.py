"""`python -m relm.compat ...`, the same as `relm compat ...`."""

import sys

from relm.compat.cli import main

sys.exit(main())
