"""``python -m interlock.contracts``: write or check ``contracts/`` (see :mod:`.gen`)."""

import sys

from interlock.contracts.gen import main

sys.exit(main())
