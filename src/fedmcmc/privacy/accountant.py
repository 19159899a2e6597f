"""(epsilon, delta) of a composition of (subsampled) Gaussian mechanisms, with ``dp-accounting``.

Every round of a Langevin sampler that the mappings of :mod:`fedmcmc.privacy.mechanisms`
cover is one Gaussian mechanism: Gaussian noise of standard deviation ``sigma`` added to a
quantity whose L2 sensitivity is ``Delta``, run on a random subset of the units (clients or
records) or on all of them. It is described by :class:`GaussianRounds` (the noise multiplier
``z = sigma / Delta``, how many rounds, and how units are sampled), and :func:`epsilon`
composes the rounds with the maintained accountants of Google's ``dp-accounting`` package:

* ``"rdp"``: Renyi DP (Mironov 2017; Poisson subsampling: Mironov, Talwar and Zhang 2019;
  sampling without replacement: Wang, Balle and Kasiviswanathan 2019, Theorem 27), converted
  to (epsilon, delta) at the best order;
* ``"pld"``: privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022), tighter,
  slower; it has no sampling without replacement.

Neighbouring relations: Poisson sampling is accounted for adding or removing one unit (its
``Delta`` is one unit's largest contribution), sampling a fixed number without replacement for
replacing one unit (its ``Delta`` is the largest change when one unit is replaced, twice a
contribution's bound). Without sampling the relation is whatever ``Delta`` was computed for.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import dp_accounting
from dp_accounting import mechanism_calibration, pld, rdp

__all__ = ["GaussianRounds", "epsilon", "event", "smallest_noise", "ACCOUNTANTS"]

ACCOUNTANTS = ("rdp", "pld")
_NEIGHBOURS = dp_accounting.NeighboringRelation


class GaussianRounds(NamedTuple):
    """``rounds`` identical Gaussian mechanisms.

    Attributes
    ----------
    noise_multiplier
        ``z = sigma / Delta``, the noise's standard deviation over the round's L2 sensitivity
        (``inf``: the unit does not enter the round).
    rounds
        How many rounds compose.
    sampling
        ``"poisson"`` (each unit enters a round independently with probability ``rate``; add or
        remove one unit), ``"without_replacement"`` (``size`` of ``population`` units, uniformly;
        replace one unit) or ``"none"`` (every unit, every round).
    rate
        Poisson probability (``"poisson"``), or ``size / population``.
    size, population
        The sample and population sizes of ``"without_replacement"``.
    """

    noise_multiplier: float
    rounds: int
    sampling: str = "none"
    rate: float = 1.0
    size: int = 0
    population: int = 0


def event(mechanism: GaussianRounds) -> dp_accounting.DpEvent:
    """The ``dp-accounting`` event of ``mechanism``."""
    gauss = dp_accounting.GaussianDpEvent(mechanism.noise_multiplier)
    if mechanism.sampling == "poisson" and mechanism.rate < 1:
        gauss = dp_accounting.PoissonSampledDpEvent(mechanism.rate, gauss)
    elif mechanism.sampling == "without_replacement" and mechanism.size < mechanism.population:
        gauss = dp_accounting.SampledWithoutReplacementDpEvent(mechanism.population, mechanism.size, gauss)
    return dp_accounting.SelfComposedDpEvent(gauss, int(mechanism.rounds))


def _accountant(mechanism: GaussianRounds, accountant: str):
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {ACCOUNTANTS}")
    replace = mechanism.sampling == "without_replacement"
    if accountant == "pld":
        if replace and mechanism.size < mechanism.population:
            raise ValueError('the PLD accountant has no sampling without replacement; use accountant="rdp"')
        return pld.PLDAccountant(_NEIGHBOURS.ADD_OR_REMOVE_ONE)
    return rdp.RdpAccountant(neighboring_relation=_NEIGHBOURS.REPLACE_ONE if replace
                             else _NEIGHBOURS.ADD_OR_REMOVE_ONE)


def epsilon(mechanism: GaussianRounds, delta: float, accountant: str = "rdp") -> float:
    """The smallest ``epsilon`` the accountant certifies for ``mechanism`` at ``delta``
    (0 when the unit never enters, ``inf`` without noise)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1) (got {delta!r}); 1e-5 or 1 / (number of units) is usual")
    if mechanism.rounds == 0 or mechanism.noise_multiplier == math.inf:
        return 0.0
    if mechanism.noise_multiplier <= 0:
        return math.inf
    acc = _accountant(mechanism, accountant)
    try:
        acc.compose(event(mechanism))
    except ValueError:  # the package's sampling formulas overflow for huge noise: sampling only helps
        acc = _accountant(mechanism._replace(sampling="none"), accountant)
        acc.compose(event(mechanism._replace(sampling="none")))
    return float(acc.get_epsilon(delta))


def smallest_noise(mechanism: GaussianRounds, target_epsilon: float, delta: float,
                   accountant: str = "rdp") -> float:
    """The smallest noise multiplier with which ``mechanism`` (its other fields as given) meets
    ``(target_epsilon, delta)``, by ``dp-accounting``'s calibration (bisection, relative
    tolerance 1e-4, rounded up)."""
    if not target_epsilon > 0:
        raise ValueError(f"epsilon must be > 0 (got {target_epsilon!r})")
    z = mechanism_calibration.calibrate_dp_mechanism(
        lambda: _accountant(mechanism, accountant),
        lambda noise: event(mechanism._replace(noise_multiplier=noise)),
        target_epsilon, delta,
        mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4)
    return float(z)
