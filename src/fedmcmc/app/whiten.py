"""``[run] whiten``: every sampler run in whitened coordinates ``z``, ``theta = theta* + L z``.

``L L^T = H^{-1}`` comes from the run's Laplace approximation at the federated mode
(:mod:`fedmcmc.app.posterior`), and the sampler is built on :func:`fedmcmc.models.whitened`, whose
Hessian at ``z* = 0`` is the identity: ``step_size = "auto"`` then takes its step from a curvature
of about 1, whatever the units or the correlations of the features (docs/design.md, "Whitening").
The chains start at the run's starting points mapped to ``z`` and their draws are mapped back to
``theta`` before any output; the simulator and the message runtime never see the map.

* ``"auto"`` (the default): whiten when ``step_size = "auto"`` and the Laplace approximation can
  be had: not for the models of :data:`fedmcmc.app.posterior.NOT_LOG_CONCAVE`, not under
  ``[privacy]`` (its accountant does not cover a transformation computed from the data), and not
  when the potential's Hessian at the mode is not positive definite;
* ``true``: whiten with any step (refused in one line where the approximation cannot be had);
* ``false``: never.

Cost, recorded in ``results.json`` (``whitening``) beyond what the run pays anyway: the broadcast
of ``theta*`` and ``L`` to every client (one round, 32 bits a number: ``d (d + 1) / 2 + d`` a
client for a full ``L``, ``2 d`` for a diagonal one), and the approximation's Hessian round (and
the mode's search, when neither the sampler nor the step found it) when the posterior check and
the starting points do not already pay for it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.estimators.gradients import ModeResult
from fedmcmc.models.whitened import Whitening
from fedmcmc.runtime.settings import ConfigError, RunSettings


def setting(cfg: dict) -> tuple[bool, str | None]:
    """``(whether to whiten, why not)`` for ``[run] whiten`` (module docstring), before the
    approximation is computed; raises a one-line ConfigError for a bad value, or for ``true``
    where the approximation cannot be had."""
    from fedmcmc.app import posterior

    value = RunSettings.from_section(cfg["run"]).whiten  # its value checked there
    if value is False:
        return False, "[run] whiten = false"
    why = (posterior.not_available(cfg)
           or ("privacy" in cfg and "[privacy]: its accountant does not cover a transformation computed from the data")
           or None)
    if why is not None:
        if value is True:
            raise ConfigError(f"[run] whiten = true needs the Laplace approximation at the mode, which this run cannot "
                         f"have ({why}); set whiten = false")
        return False, why
    if value == "auto" and cfg["sampler"].get("step_size") != "auto":
        return False, 'step_size is given, not "auto" (whiten = true whitens with a given step, in z units)'
    return True, None


def mode_in_z(model, mode: ModeResult, whitening: Whitening) -> ModeResult:
    """The mode of the whitened model, for the samplers that need one (QLSD*, LSD*): ``z* = 0``,
    the clients' gradient sum ``L^T sum_i grad U_i(theta*)`` and the gradient norm in ``z``,
    with no rounds of its own (the search in ``theta`` paid for it)."""
    lower = whitening.factor

    def to_z(g):
        return lower.T @ g if whitening.full else lower * g

    client_sum = np.asarray(mode.client_grad_sum, np.float64)
    prior = np.asarray(jax.grad(model.log_prior)(jnp.asarray(mode.theta, jnp.float32)), np.float64)
    return ModeResult(jnp.zeros(model.dim, jnp.float32), jnp.asarray(to_z(client_sum), jnp.float32),
                      float(np.linalg.norm(to_z(client_sum - prior))), 0, 0)


def record(whitening: Whitening, num_clients: int, unpaid: dict | None) -> dict:
    """``results.json``'s ``whitening`` of a whitened run: the broadcast of ``theta*`` and ``L``,
    plus ``unpaid``, the approximation's record when nothing else in the run pays for it."""
    d = int(np.shape(whitening.centre)[0])
    numbers = d * (d + 1) // 2 + d if whitening.full else 2 * d
    rounds, bits = 1, num_clients * 32 * numbers
    if unpaid is not None:
        rounds, bits = rounds + unpaid["rounds"], bits + unpaid["bits"]
    return {"used": True, "full": whitening.full, "rounds": rounds, "bits": bits}


def describe(entry: dict) -> str:
    """One line for the terminal."""
    kind = "full L = cholesky(H^-1)" if entry["full"] else "diagonal L = 1 / sqrt(diag H)"
    return (f"whiten: the sampler runs in z, theta = theta* + L z, {kind} "
            f"({entry['rounds']} round{'s' * (entry['rounds'] != 1)}, {entry['bits']} bits)")
