"""Ground truth for non-Gaussian targets: NUTS or MALA (BlackJAX) on the pooled posterior, cached.

The reference is what sampler accuracy is measured against, so it is run long, checked with
ArviZ (R-hat, ESS) and cached on disk per problem, seed and settings: reproductions reuse it
instead of recomputing it. The cache key includes a hash of the data and the log-posterior
at fixed probe points, so a changed model or dataset never reuses a stale reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.core.cache import user_cache
from fedmcmc.data.federated import FederatedData


class ReferenceSamples(NamedTuple):
    """Reference draws of the pooled posterior (NUTS or MALA).

    Attributes
    ----------
    samples
        ``[chain, draw, d]``.
    rhat, ess
        Worst (largest) rank-normalised R-hat and smallest bulk ESS over coordinates (ArviZ).
    divergences
        Number of divergent transitions after warm-up (NUTS; 0 for MALA).
    step_size
        The step size of each chain (adapted for NUTS, given for MALA).
    seconds
        Time it took (0 when read from the cache).
    cached
        True if read from the cache.
    """

    samples: np.ndarray
    rhat: float
    ess: float
    divergences: int
    step_size: np.ndarray
    seconds: float
    cached: bool
    acceptance: float = float("nan")


def cache_dir() -> Path:
    """``reference/`` of :func:`fedmcmc.core.cache.user_cache`."""
    return user_cache() / "reference"


def log_posterior(model: Model, data: FederatedData):
    """``theta -> log prior(theta) + sum_ij log p(x_ij | theta)`` over all clients' real data."""
    pooled = data.pooled()
    x = jax.tree_util.tree_map(jnp.asarray, pooled.x)

    def logdensity(theta):
        return model.log_prior(theta) + jnp.sum(jax.vmap(model.log_likelihood, (None, 0))(theta, x))

    return logdensity


def _fingerprint(model: Model, data: FederatedData, logdensity, settings: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(dict(settings, model=model.name, dim=model.dim), sort_keys=True).encode())
    for leaf in jax.tree_util.tree_leaves(data.x) + [np.asarray(data.counts)]:
        h.update(np.ascontiguousarray(leaf).tobytes())
    probes = np.random.default_rng(12345).standard_normal((3, model.dim)).astype(np.float32)
    values = [float(logdensity(jnp.asarray(p))) for p in probes]
    h.update(json.dumps([f"{v:.6e}" for v in values]).encode())
    return h.hexdigest()[:16]


def nuts(seed: int, model: Model, data: FederatedData, num_samples: int = 2000, num_chains: int = 4,
         num_warmup: int = 1000, theta0=None, use_cache: bool = True, name: str | None = None) -> ReferenceSamples:
    """Sample the pooled posterior with NUTS after Stan-style window adaptation (diagonal mass).

    Parameters
    ----------
    seed
        Integer seed; chain ``c`` uses ``fold_in(key(seed), c)``.
    model, data
        The problem; every client's data enters the likelihood.
    num_samples, num_chains, num_warmup
        Draws kept per chain, chains, and warm-up (adaptation) steps per chain.
    theta0
        Start of every chain (zeros if None).
    use_cache
        Read and write ``cache_dir()/<name>-<fingerprint>.npz``.
    name
        Prefix of the cache file (the model's name if None).
    """
    for label, value in (("num_samples", num_samples), ("num_chains", num_chains), ("num_warmup", num_warmup)):
        if int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer (got {value!r})")
    import blackjax

    logdensity = log_posterior(model, data)
    settings = dict(seed=seed, num_samples=num_samples, num_chains=num_chains, num_warmup=num_warmup,
                    theta0=None if theta0 is None else np.asarray(theta0, np.float32).tolist())
    theta0 = jnp.zeros(model.dim, jnp.float32) if theta0 is None else jnp.asarray(theta0, jnp.float32)

    def one_chain(key):
        key_warm, key_run = jax.random.split(key)
        warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
        (state, parameters), _ = warmup.run(key_warm, theta0, num_steps=num_warmup)
        kernel = blackjax.nuts(logdensity, **parameters).step

        def step(state, key):
            state, info = kernel(key, state)
            return state, (state.position, info.is_divergent, info.acceptance_rate)

        _, (positions, divergent, accept) = jax.lax.scan(step, state, jax.random.split(key_run, num_samples))
        return positions, jnp.sum(divergent), parameters["step_size"], jnp.mean(accept)

    return _cached(f"{name or model.name}", model, data, logdensity, settings, seed, num_chains, one_chain, use_cache)


def mala(seed: int, model: Model, data: FederatedData, step_size: float, num_samples: int = 10_000,
         num_chains: int = 4, num_warmup: int = 2_000, thinning: int = 10, theta0=None, use_cache: bool = True,
         name: str | None = None) -> ReferenceSamples:
    """Sample the pooled posterior with MALA (Roberts and Tweedie 1996): the Langevin proposal
    ``theta' = theta + h grad log pi(theta) + sqrt(2 h) Z`` with a Metropolis-Hastings correction,
    so the chain targets the posterior exactly whatever ``h`` (QLSD's references use it).

    ``num_samples`` draws are kept per chain, every ``thinning`` steps after ``num_warmup``
    steps; the acceptance rate is reported (aim for about 0.57). Caching as :func:`nuts`.
    """
    for label, value in (("num_samples", num_samples), ("num_chains", num_chains), ("thinning", thinning)):
        if int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer (got {value!r})")
    if not step_size > 0:
        raise ValueError(f"MALA step_size must be > 0 (got {step_size!r})")
    import blackjax

    logdensity = log_posterior(model, data)
    settings = dict(kind="mala", seed=seed, step_size=float(step_size), num_samples=num_samples,
                    num_chains=num_chains, num_warmup=num_warmup, thinning=thinning,
                    theta0=None if theta0 is None else np.asarray(theta0, np.float32).tolist())
    theta0 = jnp.zeros(model.dim, jnp.float32) if theta0 is None else jnp.asarray(theta0, jnp.float32)
    kernel = blackjax.mala(logdensity, step_size).step

    def one_chain(key):
        def step(state, key):
            state, info = kernel(key, state)
            return state, info.is_accepted

        def kept(state, key):
            state, accepted = jax.lax.scan(step, state, jax.random.split(key, thinning))
            return state, (state.position, jnp.mean(accepted))

        key_warm, key_run = jax.random.split(key)
        state = blackjax.mala(logdensity, step_size).init(theta0)
        state, _ = jax.lax.scan(step, state, jax.random.split(key_warm, num_warmup)) if num_warmup else (state, None)
        _, (positions, accept) = jax.lax.scan(kept, state, jax.random.split(key_run, num_samples))
        return positions, jnp.zeros((), jnp.int32), jnp.asarray(step_size, jnp.float32), jnp.mean(accept)

    return _cached(f"{name or model.name}-mala", model, data, logdensity, settings, seed, num_chains, one_chain,
                   use_cache)


def _cached(prefix, model, data, logdensity, settings, seed, num_chains, one_chain, use_cache) -> ReferenceSamples:
    """Run ``one_chain`` over ``num_chains`` keys, or read the result from the cache."""
    from fedmcmc.evaluation.diagnostics import ess, rhat

    path = cache_dir() / f"{prefix}-{_fingerprint(model, data, logdensity, settings)}.npz"
    if use_cache and path.exists():
        with np.load(path) as z:
            return ReferenceSamples(z["samples"], float(z["rhat"]), float(z["ess"]), int(z["divergences"]),
                                    z["step_size"], 0.0, True,
                                    float(z["acceptance"]) if "acceptance" in z.files else float("nan"))
    start = time.perf_counter()
    keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.arange(num_chains))
    positions, divergent, step_size, accept = jax.jit(jax.vmap(one_chain))(keys)
    samples = np.asarray(positions)
    if not np.all(np.isfinite(samples)):
        raise FloatingPointError("the reference sampler produced NaN/inf; check the model's log-density "
                                 "(or lower the MALA step size)")
    result = ReferenceSamples(samples, float(np.max(rhat(samples))), float(np.min(ess(samples))),
                              int(np.sum(divergent)), np.asarray(step_size), time.perf_counter() - start, False,
                              float(np.mean(accept)))
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # parallel test workers may race
        with open(tmp, "wb") as f:
            np.savez(f, samples=samples, rhat=result.rhat, ess=result.ess, divergences=result.divergences,
                     step_size=result.step_size, acceptance=result.acceptance)
        os.replace(tmp, path)
    return result
