"""A right posterior on a user's own files with only ``[data]``, ``[model]`` and ``step_size =
"auto"``: the cases where it went wrong, each against the exact posterior of linear regression with
unknown noise (:func:`fedmcmc.models.linear.unknown_noise_posterior`, quadrature over ``log
sigma``), and each guard both ways.

* the birth weights of ``fedmcmc example birth-weights`` (target about 120 ounces, features in
  days, pounds, inches), four clinics split by sorting on the response: standardised by the
  config (the target too), and in their own units (``standardise = false``), where only the
  whitening at the mode makes one scalar step fit every parameter;
* the diamonds of ``fedmcmc example diamonds``: 24 features, powers of the carat weight
  correlated above 0.99 even standardised (a posterior of condition 1e6).

Tolerances are Monte-Carlo errors from the draws' ESS (4 of them) plus the 2% inflation of a
marginal standard deviation that the automatic step allows (fedmcmc.samplers.steps).
"""

import functools
import tomllib

import numpy as np
import pytest

from fedmcmc.app import config, inputs
from fedmcmc.evaluation import diagnostics
from fedmcmc.models.linear import unknown_noise_posterior
from fedmcmc.runtime import io
from fedmcmc.samplers.steps import STD_INFLATION

pytestmark = pytest.mark.slow

Z = 4.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from fedmcmc.app.examples import birth_weights, diamonds

    folder = tmp_path_factory.mktemp("no-tuning")
    birth_weights(folder / "births")
    diamonds(folder / "diamonds")
    return folder


def _run(folder, example, name, sampler, data="", run="", iterations=4000):
    text = (folder / example / f"{example}.toml").read_text().split("[sampler]")[0]
    text = text.replace("[data]\n", f"[data]\n{data}\n")
    path = folder / example / f"{name}.toml"
    path.write_text(f"{text}[sampler]\n{sampler}\nstep_size = \"auto\"\n\n[run]\nseed = 0\nnum_chains = 4\n"
                    f"num_iterations = {iterations}\nburn_in = 500\nmax_stored_draws = 500\n{run}\n")
    payload = config.run(path, folder / example / name, progress=False)
    return payload, io.read_draws(folder / example / name / "posterior.nc"), _exact(path.parent, example, data)


@functools.lru_cache
def _exact(folder, example, data):
    """The exact posterior moments of the example's clients' training rows, as the run sees them."""
    cfg = tomllib.loads((folder / f"{example}.toml").read_text())
    section = {**cfg["data"], **tomllib.loads(data)}
    train, _, _ = inputs.load_data(section, folder)
    return unknown_noise_posterior(train, intercept=True)


def _errors(draws, exact):
    """Per parameter: the mean's offset and the sd's relative error, each over its allowance."""
    ess = np.maximum(diagnostics.ess(draws), 1.0)
    sd = np.sqrt(np.diag(exact.cov))
    mean_off = np.abs(draws.mean(axis=(0, 1)) - exact.mean) / (sd * Z / np.sqrt(ess))
    sd_off = np.abs(draws.std(axis=(0, 1)) / sd - 1) / (STD_INFLATION + Z / np.sqrt(2 * ess))
    return mean_off, sd_off


def _within_chain_sd(draws, exact):
    """Per parameter: the chains' own standard deviation (averaged over chains) over the exact one."""
    return draws.std(axis=1).mean(axis=0) / np.sqrt(np.diag(exact.cov))


def test_target_and_features_standardised_by_the_config(files):
    """Birth weights in ounces, a config that standardises them: SGLD's automatic step (not
    whitened here) and the chains dispersed around the mode give the exact posterior."""
    payload, draws, exact = _run(files, "births", "plain", 'name = "sgld"', run="whiten = false")
    assert payload["whitening"]["used"] is False
    mean_off, sd_off = _errors(draws, exact)
    assert mean_off.max() < 1 and sd_off.max() < 1, (mean_off, sd_off)
    assert payload["posterior_check"]["passed"] is True


def test_features_in_their_own_units_whitened_and_not(files):
    """Gestation in days, weights in pounds, the target in ounces (``standardise = false``): the
    curvature spans six decades; whitened, QLSD++'s automatic step gives the exact posterior;
    without whitening the chains barely leave their starts and the run says so."""
    payload, draws, exact = _run(files, "births", "raw", 'name = "lsd++"', data="standardise = false")
    assert payload["whitening"]["used"] is True and payload["whitening"]["full"] is True
    assert payload["step"]["lambda_max"] < 10  # the whitened curvature: about 1
    mean_off, sd_off = _errors(draws, exact)
    assert mean_off.max() < 1 and sd_off.max() < 1, (mean_off, sd_off)
    assert payload["posterior_check"]["passed"] is True

    payload, draws, exact = _run(files, "births", "raw-plain", 'name = "lsd++"', data="standardise = false",
                                 run="whiten = false", iterations=1500)
    assert payload["whitening"]["used"] is False
    assert _within_chain_sd(draws, exact).min() < 0.5  # the chains barely leave their dispersed starts
    assert payload["posterior_check"]["passed"] is not True
    assert payload["diagnostics"]["max_rhat"] > 1.01


def test_correlated_features_whitened_and_not(files):
    """The diamonds' 26 parameters (condition 1e6): whitened, SGLD's automatic step gives the exact
    posterior; not whitened, the chains barely move and the run says so."""
    payload, draws, exact = _run(files, "diamonds", "auto", 'name = "sgld"')
    assert payload["whitening"]["used"] is True
    mean_off, sd_off = _errors(draws, exact)
    assert mean_off.max() < 1 and sd_off.max() < 1, (mean_off, sd_off)
    assert payload["posterior_check"]["passed"] is True

    payload, draws, exact = _run(files, "diamonds", "plain", 'name = "sgld"', run="whiten = false", iterations=1500)
    assert _within_chain_sd(draws, exact).min() < 0.5
    assert payload["posterior_check"]["passed"] is not True
    assert payload["diagnostics"]["max_rhat"] > 1.01


def test_cg_dsgld_automatic_step(files):
    """CG-DSGLD with Taylor surrogates on the four clinics in their own units: whitened, its
    automatic step is of order 1e-2 (not 1e-8), and the draws are the exact posterior."""
    payload, draws, exact = _run(files, "births", "cg", 'name = "cg-dsgld"\nlocal_steps = 10',
                                 data="standardise = false", iterations=8000)
    assert payload["step"]["value"] > 1e-3
    mean_off, sd_off = _errors(draws, exact)
    assert mean_off.max() < 1 and sd_off.max() < 1, (mean_off, sd_off)
