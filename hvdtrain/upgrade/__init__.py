"""``hvdtrain upgrade SCRIPT``: a Horovod TF2 script rewritten for hvdtrain on Keras 3, in
the spirit of TensorFlow's ``tf_upgrade_v2``.

It reads the script's syntax tree and splices the original text, so what it does not
change stays byte for byte: ``horovod.tensorflow[.keras]`` imports and uses become
``hvdtrain.tensorflow[.keras]`` (every name checked against what hvdtrain exports), and the
Keras 2 idioms Keras 3 rejects are rewritten where that is safe and reported with the
manual fix where it is not. It never imports TensorFlow, Keras or Horovod.

``rewrite.upgrade_source(text)`` is the function; ``command`` the command line;
``horovod_imports``, ``keras3`` and ``keras3_files`` the rules, over ``names`` (what a
script's names stand for), ``calls`` (edits in argument lists) and ``source`` (positions
and edits).
"""
