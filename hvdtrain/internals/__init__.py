"""The private APIs of Keras and TensorFlow that hvdtrain relies on, one module per
dependency, each use with its reason; ``tests/unit/test_private_apis.py`` fails loudly
when an upgrade changes one. (Horovod's live in ``hvdtrain.horovod.horovod_private``,
inside the only package that imports Horovod.)"""
