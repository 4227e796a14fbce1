"""Installing Horovod for hvdtrain: hvdtrain's source patches (:mod:`.patching`), the
CUDA/NCCL toolchain of a GPU build (:mod:`.toolchain`), and a cached, load-checked wheel in
any Python environment (:mod:`.builder`, :func:`~hvdtrain.horovod_build.builder.install_horovod`).

Used by ``hvdtrain install-horovod`` (:mod:`.command`) and ``scripts/install.sh``. Imports
neither TensorFlow nor Horovod: it runs before either works.
"""
