"""``step_size = "auto"`` in a ``[sampler]`` section: the step from the curvature at the mode.

The federated mode (:func:`fedmcmc.estimators.gradients.find_mode`, reused when the sampler
already needs it) and the largest eigenvalue of the potential's Hessian there
(:func:`fedmcmc.estimators.curvature.curvature`: one round of the clients' Hessians up to 200
parameters, else one federated round per Hessian-vector product), and for a sampler whose registry entry names its clients' shares
(:attr:`fedmcmc.samplers.Registered.shares`) the clients' heterogeneity there
(:func:`fedmcmc.estimators.curvature.heterogeneity`, one round), and for control variates
(:attr:`~fedmcmc.samplers.Registered.control_points`: QLSD*, QLSD++) with minibatches their
minibatch noise (:func:`fedmcmc.estimators.curvature.minibatch_noise`, likewise), and for
CG-DSGLD the curvature of its visits with the conducive term, from its surrogates fitted at the mode
(:func:`fedmcmc.estimators.conducive.visit_curvature`; with ``surrogate_step_size = "auto"``, set
from the step, Taylor surrogates stand in for the SGLD ones), feed
the sampler's rule (:attr:`fedmcmc.samplers.Registered.step`, documented per sampler in
:mod:`fedmcmc.samplers.steps`). The record says what was chosen and what it cost: the power
iterations' rounds and bits, plus the mode's when it was found for the step alone (a sampler that
needs the mode, QLSD*, counts it as ``theta_star`` in ``results.json``).
"""

from __future__ import annotations

import inspect

import jax
import numpy as np

from fedmcmc.estimators import conducive as conducive_lib
from fedmcmc.estimators import curvature as curvature_lib
from fedmcmc.estimators import approximation, gradients
from fedmcmc.runtime.settings import RunSettings
from fedmcmc.samplers import REGISTRY, schedules
from fedmcmc.samplers.steps import Setting, auto_step as rule_step, noise_weights, rounds_per_draw, trajectories_per_round

#: Round budgets and tolerance of the power iterations (lambda_max, then lambda_min).
MAX_ROUNDS, MAX_ROUNDS_SMALLEST, TOL = 200, 100, 1e-3


def auto_step(seed: int, name: str, args: dict, model, data, mode=None, whitened: bool = False
              ) -> tuple[object, dict, object]:
    """The step of registered sampler ``name`` with builder arguments ``args`` on ``data``.

    ``seed`` keys the power iterations' start vectors; ``mode`` is the sampler's own mode, if it
    has one (else the mode is found here and its cost added to the step's); ``whitened``: the
    model runs in the Laplace approximation's coordinates (``H = I`` at the mode). QLSD*'s and
    QLSD++'s minibatch noise is measured when whitened or up to
    :data:`fedmcmc.estimators.approximation.FULL_DIM` parameters (with ``H^{-1}`` from the Laplace
    approximation, one more round), else bounded by the paper's ``M_bar = L / N``. Returns
    ``(value, record, mode)``: the step (a float, or one per client for DG-SGLD) and
    ``{"value", "rule", "lambda_max", "lambda_min", "converged", "rounds", "bits"}`` (``bits`` up
    and down; ``converged``: whether the power iterations met their tolerance).
    """
    counts, shares = np.asarray(data.counts, np.int64), REGISTRY[name].shares
    if REGISTRY[name].pooled:
        counts = counts.sum(keepdims=True)
    rule_step(name, Setting(1.0, None, args, counts, int(model.dim)))  # a refusal before any round
    own = mode is None
    mode = gradients.find_mode(model, data) if own else mode
    found = curvature_lib.curvature(jax.random.key(seed), model, data, mode.theta, max_rounds=MAX_ROUNDS, tol=TOL,
                                    smallest=True, max_rounds_smallest=MAX_ROUNDS_SMALLEST)
    rounds, bits = found.rounds + own * mode.rounds, found.bits_up + found.bits_down + own * mode.bits
    pull = None
    if shares:  # the clients' drift and noise at the mode: one more round
        pull = curvature_lib.heterogeneity(model, data, mode.theta, args[shares])
        rounds, bits = rounds + pull.rounds, bits + pull.bits_up + pull.bits_down
    visit = None
    if "surrogate" in inspect.signature(REGISTRY[name].build).parameters:  # CG-DSGLD: the conducive curvature
        visit = conducive_lib.visit_curvature(
            jax.random.fold_in(jax.random.key(seed), 3), model, data, mode.theta, args["probs"],
            conducive_lib.conducive(args.get("surrogate"), args.get("alpha", 1.0), args.get("likelihood_only", False)))
        rounds, bits = rounds + visit.rounds, bits + visit.bits_up + visit.bits_down
    setting = Setting(found.lambda_max, found.lambda_min, args, counts, int(model.dim),
                      *((pull.drift, pull.spread) if pull else (None, None)),
                      visit=None if visit is None else (visit.top, visit.low))
    if args.get("num_leapfrog") == "auto" and found.hessians is not None and pull is not None:
        clients, prior = found.hessians  # the local potentials f_c = U_0 + U_c / w_c
        share = np.asarray(args[shares], np.float64)
        setting = setting._replace(local=(prior + clients / share[:, None, None], pull.gradients))
    weights, noise = noise_weights(name, setting), None
    if weights is not None and (whitened or model.dim <= approximation.FULL_DIM):
        cov = None
        if not whitened:  # H^{-1} for the noise's covariance: the Laplace approximation's round and broadcast
            laplace = approximation.laplace_approximation(model, data, mode)
            cov, rounds = laplace.cov, rounds + laplace.rounds
            bits += laplace.bits + data.num_clients * 32 * int(model.dim) * (int(model.dim) + 1) // 2
        noise = curvature_lib.minibatch_noise(jax.random.fold_in(jax.random.key(seed), 2), model, data, mode.theta,
                                              weights, cov, max_rounds=MAX_ROUNDS_SMALLEST, tol=TOL)
        rounds, bits = rounds + noise.rounds, bits + noise.bits_up + noise.bits_down
        setting = setting._replace(noise=noise.lambda_max)
    value, formula, *more = rule_step(name, setting)
    extra = more[0] if more else {}
    per_draw = extra.pop("rounds_per_draw", None) or rounds_per_draw(name, setting, value)
    record = {"value": np.asarray(value).tolist(), "rule": formula, "lambda_max": found.lambda_max,
              "lambda_min": found.lambda_min, "converged": found.converged and (noise is None or noise.converged),
              "rounds": rounds, "bits": bits, **({"drift": pull.drift, "spread": pull.spread} if pull else {}),
              **({"minibatch_noise": noise.lambda_max} if noise else {}),
              **({"visit_curvature": float(visit.top.max())} if visit is not None else {}),
              **({"rounds_per_draw": per_draw} if per_draw else {}), **extra}
    return value, record, mode


#: The effective sample size below which a run's automatic step draws a warning (ArviZ's advice for bulk ESS).
MIN_ESS = 400


def budget(record: dict, run: RunSettings, args: dict | None = None) -> dict:
    """``{"expected_ess": ...}``: about how many effective draws ``run``'s schedule (the config's
    typed ``[run]``, :class:`fedmcmc.runtime.settings.RunSettings`) gives at the
    step of ``record`` (:func:`fedmcmc.samplers.steps.rounds_per_draw`), over all chains, and
    ``{"rounds_needed": ...}`` for :data:`MIN_ESS` when it gives fewer (None when no run length
    does). Empty without an estimate. With a decaying step (the builder arguments ``args`` set
    ``step_decay``) a kept round counts by its Langevin time relative to the first stage's
    (:func:`fedmcmc.samplers.schedules.decayed_rounds`)."""
    per_draw = record.get("rounds_per_draw")
    if not per_draw:
        return {}
    burn_in, chains, total = run.burn_in, run.num_chains, run.num_iterations
    decay = None if args is None else args.get("step_decay")
    if decay is None:
        def kept(stop):
            return max(stop - burn_in, 0)
    else:
        per_round = trajectories_per_round(args)

        def kept(stop):
            return schedules.decayed_rounds(decay, per_round, burn_in, stop)
    expected = min(chains * kept(total) / (2 * per_draw), chains * max(total - burn_in, 0))
    out = {"expected_ess": expected}
    if expected < MIN_ESS:
        target = MIN_ESS * 2 * per_draw / chains
        if decay is None:
            out["rounds_needed"] = int(np.ceil(burn_in + target))
        else:  # the smallest length whose kept time reaches the target, if int32's rounds do
            low, high = total, 2**31 - 1
            if kept(high) < target:
                out["rounds_needed"] = None
            else:
                while low < high:
                    mid = (low + high) // 2
                    low, high = (mid + 1, high) if kept(mid) < target else (low, mid)
                out["rounds_needed"] = int(low)
    return out


def budget_warning(record: dict, run: RunSettings) -> str | None:
    """One line when ``run``'s schedule is too short for the step of ``record`` (:func:`budget`)."""
    if "rounds_needed" not in record:
        return None
    have = (f"at this step a chain needs about {record['rounds_per_draw']:.3g} rounds to forget its state "
            f"(1 / (lambda_min x a round's Langevin time)): num_iterations = {run.num_iterations} after "
            f"burn_in = {run.burn_in} gives about {record['expected_ess']:.0f} effective draws over "
            f"{run.num_chains} chain(s); ")
    if record["rounds_needed"] is None:
        return have + (f"no run length gives {MIN_ESS}: the decaying step's Langevin time grows with the logarithm "
                       "of the rounds; drop step_decay, or give it a longer first stage")
    return have + f"for {MIN_ESS}, set num_iterations >= {record['rounds_needed']}"


def describe(record: dict) -> str:
    """One line for the terminal."""
    value = record["value"]
    shown = f"{value:.4g}" if isinstance(value, float) else "[" + ", ".join(f"{v:.4g}" for v in value) + "]"
    chosen = f", num_leapfrog = {record['num_leapfrog']}" if "num_leapfrog" in record else ""
    return (f"step_size = auto: {shown}{chosen} by {record['rule']}, lambda_max = {record['lambda_max']:.4g} "
            f"({record['rounds']} rounds, {record['bits']} bits)")
