"""The start agreement's comparison (the collective itself is tested on real ranks in
tests/parallel/test_faults.py)."""
import keras
import pytest
import tensorflow as tf

from hvdtrain import options
from hvdtrain.trainer import agreement


def _description(**overrides):
    opts = options.parse("horovod", **{k: v for k, v in overrides.items()
                                       if k in ("batch_size", "checkpoint_dir", "nan_policy")})
    spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((), tf.int32))
    return agreement.describe(opts, optimizer=overrides.get("optimizer", "sgd"),
                              optimizer_args={"learning_rate": 0.1}, element_spec=spec,
                              model_given=False, validation=overrides.get("validation", False),
                              validation_func=False, can_stop=overrides.get("can_stop", False),
                              mixed_precision="float32")


def _gather(descriptions):
    return lambda mine: descriptions


def test_equal_settings_agree_and_rank_0_checkpoints_are_the_jobs():
    everyone = [_description(checkpoint_dir="/ckpt", can_stop=True), _description()]
    agreed = agreement.agree(everyone[1], _gather(everyone), rank=1)
    assert agreed.checkpoint["directory"] == "/ckpt"
    assert agreed.any_can_stop


def test_no_callback_that_can_stop_means_no_per_step_agreement():
    everyone = [_description(), _description()]
    assert not agreement.agree(everyone[0], _gather(everyone), rank=0).any_can_stop


def test_a_difference_names_the_setting_and_every_rank():
    everyone = [_description(batch_size=32), _description(batch_size=16),
                _description(batch_size=32)]
    with pytest.raises(ValueError, match=r"batch_size differs across ranks: ranks 0, 2 have 32, "
                                         r"rank 1 has 16"):
        agreement.agree(everyone[0], _gather(everyone), rank=0)


@pytest.mark.parametrize("key,a,b", [("nan_policy", "stop", "skip"), ("validation", True, False)])
def test_collective_deciding_settings_are_compared(key, a, b):
    problems = agreement.differences([_description(**{key: a}), _description(**{key: b})])
    assert len(problems) == 1 and problems[0].startswith(
        {"nan_policy": "nan_policy", "validation": "validation_dataset"}[key])


def test_checkpoint_dir_on_another_rank_only_is_refused():
    problems = agreement.differences([_description(), _description(checkpoint_dir="/ckpt")])
    assert problems and "checkpoint_dir is set on rank 1 but not on rank 0" in problems[0]


def test_optimizers_are_described_without_memory_addresses():
    a = agreement.stable(keras.optimizers.SGD(0.1))
    b = agreement.stable(keras.optimizers.SGD(0.1))
    assert a == b and "0x" not in repr(a)
    assert a != agreement.stable(keras.optimizers.SGD(0.2))
    schedule = keras.optimizers.schedules.CosineDecay(0.1, 100)
    assert agreement.stable({"learning_rate": schedule}) == agreement.stable(
        {"learning_rate": keras.optimizers.schedules.CosineDecay(0.1, 100)})
    assert agreement.stable(keras.optimizers.Adam).endswith(".Adam")
