"""``python -m hvdtrain.horovod_build``: the same as ``hvdtrain install-horovod``."""
import sys

from hvdtrain.horovod_build.command import main

sys.exit(main())
