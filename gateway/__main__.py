"""``python -m gateway``: same as the ``gateway`` command."""

import sys

from gateway.app.cli import main

sys.exit(main())
