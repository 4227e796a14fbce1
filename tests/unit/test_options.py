"""Unit tests of hvdtrain.options: one place that validates and groups the Trainer's options,
and one table of what each backend supports."""
import math

import pytest

from hvdtrain import checks
from hvdtrain import options


def test_parse_groups_the_options():
    opts = options.parse("horovod", batch_size=8, checkpoint_dir="ckpt", save_checkpoint_steps=5,
                         log_step_size=3, lr_scaling="sqrt", warmup_steps=2, compression="fp16",
                         nan_policy="skip")
    assert opts.backend == "horovod"
    assert (opts.data.batch_size, opts.data.max_iteration) == (8, math.inf)
    assert (opts.checkpoint.directory, opts.checkpoint.every_steps) == ("ckpt", 5)
    assert opts.logging.log_step_size == 3
    assert (opts.learning_rate.rule, opts.learning_rate.warmup_steps) == ("sqrt", 2)
    assert (opts.reduction.compression, opts.reduction.nan_policy) == ("fp16", "skip")
    assert options.parse("horovod", scaling_learning_rate=False).learning_rate.rule == "none"
    assert options.DataOptions(max_iteration=10).steps_per_worker(4) == 2


@pytest.mark.parametrize("backend", ["mirrored", "multi_worker_mirrored", "parameter_server"])
def test_every_horovod_only_option_is_refused_elsewhere_with_one_message(backend):
    for name, (default, backends) in options.BACKEND_ONLY.items():
        if backend in backends:
            continue
        value = "x" if default is None else not default if isinstance(default, bool) else 7
        with pytest.raises(ValueError, match=rf"^{name} only work\(s\) with strategy='"
                                             rf".*strategy='{backend}' does not support them"):
            options.check_supported(backend, {name: value})
        options.check_supported(backend, {name: default})  # the default is always fine


def test_cluster_options_are_for_parameter_servers_only():
    with pytest.raises(ValueError, match="connect_timeout, task_spec only work.*'parameter_server'"):
        options.check_supported("horovod", {"task_spec": object(), "connect_timeout": 5})
    options.check_supported("parameter_server", {"task_spec": object(), "connect_timeout": 5})


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
    (dict(num_epochs=1.5), "num_epochs must be a positive integer"),
    (dict(prefetch_size=-1), "prefetch_size must be None or an integer >= 0"),
    (dict(max_iteration=0), "max_iteration must be a positive number"),
    (dict(seed="1"), "seed must be None or an integer"),
    (dict(save_checkpoint_steps=0), "save_checkpoint_steps must be None or a positive integer"),
    (dict(save_checkpoint_secs=-1), "save_checkpoint_secs must be None or a positive number"),
    (dict(keep_checkpoint_max=0), "keep_checkpoint_max must be a positive integer"),
    (dict(log_step_size=0), "log_step_size must be a positive integer"),
    (dict(lr_scaling="cubic"), "lr scaling rule must be one of"),
    (dict(warmup_steps=-1), "warmup_steps must be an integer >= 0"),
    (dict(warmup_epochs=-1), "warmup_epochs must be a number >= 0"),
    (dict(nan_policy="maybe"), "nan_policy must be 'stop', 'skip' or 'ignore'"),
    (dict(connect_timeout=0), "connect_timeout must be a positive number"),
])
def test_bad_values_name_the_argument(kwargs, match):
    strategy = "parameter_server" if "connect_timeout" in kwargs else "horovod"
    with pytest.raises(ValueError, match=match):
        options.parse(strategy, **kwargs)


def test_unknown_arguments_and_strategies_are_named():
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['colour'\]"):
        options.parse("horovod", colour=1)
    with pytest.raises(ValueError, match="strategy must be one of 'horovod', 'mirrored'"):
        options.backend_name("mirroed")
    with pytest.raises(TypeError, match="strategy must be a name or a tf.distribute.Strategy"):
        options.backend_name(3)


def test_warmup_epochs_need_a_known_epoch_length():
    lr = options.LearningRateOptions(warmup_epochs=0.5)
    assert lr.warmup_in_steps(10) == 5
    with pytest.raises(ValueError, match="warmup_epochs needs a training_dataset of known"):
        lr.warmup_in_steps(None)


def test_backend_settings_objects_equal_the_flat_keywords():
    import hvdtrain

    grouped = options.parse(hvdtrain.Horovod(bucket_mb=4, compression="fp16", jit_compile=True,
                                             steps_per_execution=2), batch_size=8)
    flat = options.parse("horovod", batch_size=8, bucket_mb=4, compression="fp16",
                         jit_compile=True, steps_per_execution=2)
    assert grouped == flat and grouped.strategy == "horovod"
    assert (grouped.reduction.bucket_mb, grouped.steps_per_execution) == (4.0, 2)
    ps = options.parse(hvdtrain.ParameterServer(connect_timeout=5))
    assert ps.backend == "parameter_server" and ps.cluster.connect_timeout == 5
    # a keyword that repeats no setting of the object joins it
    assert options.parse(hvdtrain.Horovod(bucket_mb=4), nan_policy="skip").reduction \
        == options.parse("horovod", bucket_mb=4, nan_policy="skip").reduction


def test_backend_settings_are_checked_when_made_and_given_once():
    with pytest.raises(ValueError, match="nan_policy must be 'stop', 'skip' or 'ignore'"):
        options.Horovod(nan_policy="maybe")
    with pytest.raises(ValueError, match="bucket_mb must be a positive number"):
        options.Horovod(bucket_mb=0)
    with pytest.raises(ValueError, match="connect_timeout must be a positive number"):
        options.ParameterServer(connect_timeout=0)
    with pytest.raises(TypeError, match=r"bucket_mb given both in strategy=Horovod\(\.\.\.\) "
                                        r"and as Trainer keyword"):
        options.parse(options.Horovod(bucket_mb=4), bucket_mb=8)
    with pytest.raises(ValueError, match="task_spec only work"):
        options.parse(options.Horovod(), task_spec=object())


@pytest.mark.parametrize("call, match", [
    (lambda: checks.positive_int(True, "n"), "n must be a positive integer, got True"),
    (lambda: checks.integer(-1, "k", minimum=0), "k must be an integer >= 0, got -1"),
    (lambda: checks.integer(1.0, "seed", optional=True), "seed must be None or an integer"),
    (lambda: checks.positive_number(False, "t", of="seconds"),
     "t must be a positive number of seconds, got False"),
])
def test_one_wording_for_integers_and_positive_numbers_bools_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    assert checks.integer(None, "seed", optional=True) is None
    assert checks.positive_number(2, "t") == 2.0
