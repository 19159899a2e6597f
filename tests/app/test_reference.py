"""docs/reference/config.md is what :mod:`fedmcmc.app.reference` generates from the code, and
every key the config check accepts is described there."""

from pathlib import Path

from fedmcmc.app import config, inputs, privacy, reference
from fedmcmc.runtime.messaging import settings
from fedmcmc.samplers import REGISTRY

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"


def test_committed_reference_is_generated():
    assert PAGE.read_text() == reference.markdown(), (
        "docs/reference/config.md is stale; regenerate it with "
        "`python -m fedmcmc.app.reference > docs/reference/config.md`")


def test_every_accepted_key_is_listed():
    text = reference.markdown()
    keys = set(config._RUN) | set(inputs.DATA_KEYS) | set(settings.DEFAULTS) | set(privacy.KEYS)
    keys |= {key for name in REGISTRY for key in config.sampler_keys(name)}
    assert not [key for key in keys if f"`{key}`" not in text]
