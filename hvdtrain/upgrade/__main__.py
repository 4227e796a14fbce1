"""``python -m hvdtrain.upgrade``: the same as ``hvdtrain upgrade``."""
import sys

from hvdtrain.upgrade.command import main

sys.exit(main())
