"""The chain-scaling benchmark runs (its figures are never asserted)."""

import pytest

from fedmcmc.app.bench import chains

pytestmark = pytest.mark.slow


def test_chain_scaling_measures_the_reference():
    """(``cases`` checks that every registered sampler has a case.)"""
    out = chains.chain_scaling(rounds_scale=0.005, repeats=1, names=[])
    rates = out["chain_iterations_per_second"]
    assert set(rates) == {chains.REFERENCE}
    assert all(rate > 0 for rate in rates[chains.REFERENCE].values())
