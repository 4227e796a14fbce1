"""Installing Horovod for hvdtrain: hvdtrain's source patches, the CUDA/NCCL toolchain of
a GPU build, and a cached, load-checked wheel in any Python environment.

Used by ``hvdtrain install-horovod`` and ``scripts/install.sh``. Imports neither
TensorFlow nor Horovod: it runs before either works.
"""
from hvdtrain.horovod_build.builder import (FLAVOURS, HOROVOD_VERSION, TOOLKITS, BuildError,
                                            install_horovod)

__all__ = ["BuildError", "FLAVOURS", "HOROVOD_VERSION", "TOOLKITS", "install_horovod"]
