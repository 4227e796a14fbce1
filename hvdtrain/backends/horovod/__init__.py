"""The Horovod backend: the only package of hvdtrain that imports Horovod."""
