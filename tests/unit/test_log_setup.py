"""hvdtrain's logging plays with the user's: each case runs in a fresh Python process, so
the logging module starts unconfigured."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import logging
import hvdtrain
from hvdtrain.reporting import setup_logging
log = logging.getLogger("hvdtrain")
"""


def run(code: str, level: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the prelude then ``code`` in a fresh interpreter, ``HVDTRAIN_LOG_LEVEL`` set to
    ``level`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "HVDTRAIN_LOG_LEVEL"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if level is not None:
        env["HVDTRAIN_LOG_LEVEL"] = level
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_without_configuration_lines_go_to_stderr_with_the_prefix():
    proc = run("""
        setup_logging(0)
        log.info("step 1: loss=0.5")
        log.debug("not shown")
        setup_logging(0)  # again: still one handler
        log.info("once")
    """)
    assert "[hvdtrain] step 1: loss=0.5" in proc.stderr.splitlines()
    assert proc.stderr.count("[hvdtrain] once") == 1 and "not shown" not in proc.stderr


def test_basic_config_after_setup_takes_the_lines_off_stderr(tmp_path):
    path = tmp_path / "user.log"
    proc = run(f"""
        setup_logging(0)
        log.info("before config")
        logging.basicConfig(filename={str(path)!r}, level=logging.INFO,
                            format="%(levelname)s %(name)s %(message)s")
        log.info("step 20: loss=0.1")
    """)
    assert "INFO hvdtrain step 20: loss=0.1" in path.read_text().splitlines()
    assert "step 20" not in proc.stderr and "[hvdtrain] before config" in proc.stderr
    assert "before config" not in path.read_text()


def test_basic_config_before_setup_gets_the_lines_once():
    proc = run("""
        logging.basicConfig(level=logging.INFO, format="USER %(name)s %(message)s")
        setup_logging(0)
        log.info("step 3")
    """)
    assert proc.stderr.splitlines().count("USER hvdtrain step 3") == 1
    assert "[hvdtrain]" not in proc.stderr


def test_an_implicit_root_handler_from_absl_does_not_change_the_lines():
    """absl's logging calls a bare ``logging.basicConfig()`` when TensorFlow logs first."""
    proc = run("""
        setup_logging(0)
        from absl import logging as absl_logging
        absl_logging.warning("absl speaks")
        log.info("step 5")
    """)
    assert proc.stderr.splitlines().count("[hvdtrain] step 5") == 1
    assert "INFO:hvdtrain" not in proc.stderr


def test_debug_level_from_the_environment_on_rank_0_only():
    code = """
        setup_logging({rank})
        log.debug("a debug line")
        log.info("an info line")
        log.warning("a warning")
    """
    rank0 = run(code.format(rank=0), level="DEBUG")
    assert "[hvdtrain] a debug line" in rank0.stderr and "[hvdtrain] an info line" in rank0.stderr
    rank1 = run(code.format(rank=1), level="debug")
    assert "debug line" not in rank1.stderr and "info line" not in rank1.stderr
    assert "[hvdtrain rank 1] a warning" in rank1.stderr


def test_error_level_and_numbers_apply_to_every_rank():
    code = """
        setup_logging({rank})
        log.warning("a warning")
        log.error("an error")
        print(log.level)
    """
    for rank in (0, 1):
        proc = run(code.format(rank=rank), level="ERROR")
        assert "a warning" not in proc.stderr and "an error" in proc.stderr
        assert proc.stdout.split() == ["40"]
    assert run(code.format(rank=0), level="15").stdout.split() == ["15"]
    assert run(code.format(rank=1), level="15").stdout.split() == ["30"]


def test_a_bad_level_is_a_value_error_naming_the_variable_and_value():
    proc = run("setup_logging(0)", level="bogus", check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: HVDTRAIN_LOG_LEVEL='bogus' is not a log level")
    assert "DEBUG, INFO, WARNING, ERROR" in last and "number" in last


def test_a_level_the_user_set_is_kept():
    proc = run("""
        log.setLevel(logging.WARNING)
        setup_logging(0)
        log.info("an info line")
        log.warning("a warning")
        setup_logging(1)
        print(log.level)
    """, level="DEBUG")
    assert "info line" not in proc.stderr and "[hvdtrain rank 1]" not in proc.stderr
    assert "[hvdtrain] a warning" in proc.stderr and proc.stdout.split() == ["30"]


def test_a_new_rank_after_an_elastic_change_updates_level_and_prefix():
    proc = run("""
        setup_logging(1)
        log.info("hidden")
        log.warning("as rank 1")
        setup_logging(0)
        log.info("as rank 0")
    """)
    lines = proc.stderr.splitlines()
    assert "[hvdtrain rank 1] as rank 1" in lines and "[hvdtrain] as rank 0" in lines
    assert "hidden" not in proc.stderr
