"""The typed ``[run]`` and ``[flower]`` settings: valid sections give typed values and the
defaults; a bad value, an unknown key or a missing one is refused in one line naming the key."""

import dataclasses
import subprocess
import sys

import pytest

from fedmcmc.runtime.settings import (MAX_STORED_DRAWS, ConfigError, FlowerSettings, RunSettings, Settings,
                                      check_schedule)


def test_a_run_section_gives_its_typed_values_and_the_defaults():
    run = RunSettings.from_section({"num_chains": 4, "num_iterations": 20})
    assert (run.seed, run.num_chains, run.num_iterations, run.burn_in, run.thinning) == (0, 4, 20, 0, 1)
    assert (run.chunk_size, run.devices, run.init, run.posterior_check) == (None, None, None, True)
    assert (run.max_stored_draws, run.whiten) == (MAX_STORED_DRAWS, "auto")
    run = RunSettings.from_section({"seed": 7, "num_chains": 2, "num_iterations": 40.0, "burn_in": 10, "thinning": 5,
                                    "chunk_size": 20, "devices": 2, "init": [[1, 2], [3, 4.5]],
                                    "posterior_check": False, "max_stored_draws": 0, "whiten": True})
    assert run.num_iterations == 40 and isinstance(run.num_iterations, int)  # an integral float, as an integer
    assert run.init == ((1, 2), (3, 4.5)) and RunSettings.from_section(
        {"num_chains": 1, "num_iterations": 1, "init": [0, 1]}).init == (0, 1)
    assert (run.seed, run.burn_in, run.chunk_size, run.devices, run.posterior_check, run.max_stored_draws,
            run.whiten) == (7, 10, 20, 2, False, 0, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 1


def test_a_flower_section_gives_its_typed_values_and_the_defaults():
    flower = FlowerSettings.from_section(None)
    assert flower == FlowerSettings() == FlowerSettings.from_section({})
    assert (flower.round_timeout, flower.max_upload_norm, flower.exact, flower.poll_interval, flower.hold,
            flower.secure_aggregation, flower.secure_min_clients) == (120.0, "auto", True, 0.1, False, False, 2)
    flower = FlowerSettings.from_section({"round_timeout": 30, "max_upload_norm": 5, "exact": False,
                                          "poll_interval": 1, "hold": True, "secure_aggregation": True,
                                          "secure_min_clients": 3})
    assert isinstance(flower.round_timeout, float) and isinstance(flower.poll_interval, float)
    assert (flower.round_timeout, flower.max_upload_norm, flower.exact, flower.poll_interval, flower.hold,
            flower.secure_aggregation, flower.secure_min_clients) == (30.0, 5, False, 1.0, True, True, 3)


def test_a_config_gives_both():
    settings = Settings.from_config({"run": {"num_chains": 1, "num_iterations": 2}, "flower": {"hold": True}})
    assert settings.run.num_iterations == 2 and settings.flower.hold
    assert Settings.from_config({"run": {"num_chains": 1, "num_iterations": 2}}).flower == FlowerSettings()
    with pytest.raises(ConfigError, match=r"config needs a \[run\] section"):
        Settings.from_config({"flower": {}})


RUN = {"num_chains": 2, "num_iterations": 10}


@pytest.mark.parametrize("key, value, message", [
    ("seed", 1.5, r"\[run\] seed must be an integer \(got 1.5\)"),
    ("seed", "0", r"\[run\] seed must be an integer \(got '0'\)"),
    ("num_chains", 0, r"\[run\] num_chains must be a positive integer \(got 0\)"),
    ("num_iterations", True, r"\[run\] num_iterations must be a positive integer \(got True\)"),
    ("thinning", 3, r"\[run\] num_iterations \(10\) must be a multiple of thinning \(3\)"),
    ("burn_in", 10, r"\[run\] burn_in must be an integer in \[0, num_iterations\) \(got 10\)"),
    ("chunk_size", "5", r"\[run\] chunk_size \(5\) must be a positive multiple of thinning"),
    ("devices", 0, r"\[run\] devices must be a positive integer, or unset .* \(got 0\)"),
    ("init", "middle", r"\[run\] init must be one of \('dispersed', 'mode', 'zeros'\) or a list of numbers "
                       r"\(got 'middle'\)"),
    ("init", [1, "a"], r"\[run\] init must be one of .* \(got \[1, 'a'\]\)"),
    ("init", [], r"\[run\] init must be one of .* \(got \[\]\)"),
    ("posterior_check", "yes", r"\[run\] posterior_check must be true or false \(got 'yes'\)"),
    ("max_stored_draws", -1, r"\[run\] max_stored_draws must be an integer >= 0 \(0 stores every draw; got -1\)"),
    ("whiten", "yes", r'\[run\] whiten must be "auto", true or false \(got \'yes\'\)'),
])
def test_a_bad_run_value_is_refused_in_one_line_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        RunSettings.from_section({**RUN, key: value})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=message):  # a direct construction is checked alike
        RunSettings(**{**RUN, key: value})


@pytest.mark.parametrize("key, value, message", [
    ("round_timeout", 0, r"\[flower\] round_timeout must be a positive number of seconds \(got 0\)"),
    ("round_timeout", "60", r"\[flower\] round_timeout must be a positive number of seconds \(got '60'\)"),
    ("max_upload_norm", -1, r'\[flower\] max_upload_norm must be "auto" or a positive number \(got -1\)'),
    ("max_upload_norm", True, r'\[flower\] max_upload_norm must be "auto" or a positive number \(got True\)'),
    ("exact", 1, r"\[flower\] exact must be true or false \(got 1\); the default is true"),
    ("poll_interval", 11, r"\[flower\] poll_interval must be in \(0, 10\] seconds \(got 11\); the default is 0.1"),
    ("hold", "no", r"\[flower\] hold must be true or false \(got 'no'\); the default is false"),
    ("secure_aggregation", 1, r"\[flower\] secure_aggregation must be true or false \(got 1\)"),
    ("secure_min_clients", 1, r"\[flower\] secure_min_clients must be an integer >= 2 \(got 1\): the sum of one "
                              r"client is its upload"),
])
def test_a_bad_flower_value_is_refused_in_one_line_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        FlowerSettings.from_section({key: value})
    assert "\n" not in str(err.value)


def test_unknown_and_missing_keys_are_refused():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['chains'\] in \[run\]; allowed: \['burn_in', "):
        RunSettings.from_section({**RUN, "chains": 2})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['timeout'\] in \[flower\]; allowed: \['exact', "):
        FlowerSettings.from_section({"timeout": 2})
    for key in RUN:
        with pytest.raises(ConfigError, match=rf"\[run\] needs {key}$"):
            RunSettings.from_section({k: v for k, v in RUN.items() if k != key})


def test_the_config_check_and_the_cli_error_are_the_settings_ones():
    """``fedmcmc.app.config.ConfigError`` is this one (a ValueError: the CLI's one line, exit 2), and
    the config check refuses a bad ``[flower]`` value where the config is read."""
    from fedmcmc.app import config

    assert config.ConfigError is ConfigError and issubclass(ConfigError, ValueError)
    cfg = {"problem": {"name": "heterogeneous-gaussian"}, "sampler": {"name": "sgld", "step_size": 1e-3},
           "run": dict(RUN)}
    assert config.validate(cfg) == Settings(RunSettings(**RUN))
    with pytest.raises(ConfigError, match=r"\[flower\] poll_interval must be in \(0, 10\]"):
        config.validate({**cfg, "flower": {"poll_interval": 0}})


def test_the_schedule_check_is_the_simulators():
    from fedmcmc.runtime import simulator

    assert simulator.check_schedule is check_schedule
    assert check_schedule(25_000, 1, 0, 1, None) == 6_250


def test_the_settings_import_no_jax():
    """A ClientApp process that relays to a node worker reads ``[flower]`` with this module, without JAX."""
    code = ("import sys\nfrom fedmcmc.runtime.settings import Settings\n"
            "Settings.from_config({'run': {'num_chains': 1, 'num_iterations': 1}})\n"
            "print('jax' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
