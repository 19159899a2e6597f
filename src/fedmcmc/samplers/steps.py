"""Step sizes from the curvature at the mode: the rules of ``step_size = "auto"``.

A registered sampler names its rule in its registry entry (:attr:`fedmcmc.samplers.Registered.step`).

Every rule takes ``lambda_max = L``, the largest eigenvalue of ``nabla^2 U(theta*)``
(:func:`fedmcmc.estimators.curvature.curvature`; the model's temperature is inside ``U``, so it
is inside ``L``), and the sampler's builder arguments, and returns the step.

**The accuracy target.** For a Gaussian target of precision ``lambda``, Langevin's Euler step
``theta - gamma grad U + sqrt(2 gamma) Z`` (ULA) has the stationary variance

    1 / (lambda (1 - gamma lambda / 2)),

too wide by the factor ``(1 - gamma lambda / 2)^(-1/2)`` in standard deviation, most in the
stiffest direction. A marginal's variance is a mixture of the eigen-directions' variances, so
no marginal is inflated more than the stiffest direction. The rules keep that inflation at
:data:`STD_INFLATION` (2%): ``gamma L / 2 <= E``, ``E = 1 - (1 + 0.02)^(-2) = 0.0388``. A gradient
noise of variance ``s^2`` per coordinate adds ``gamma s^2 / 2`` to the relative variance
(``x' = (1 - gamma lambda) x + gamma xi + sqrt(2 gamma) Z`` has variance
``(1 + gamma s^2 / 2) / (lambda (1 - gamma lambda / 2))``); a rule writes it as ``s^2 = kappa L``
and asks ``gamma L (1 + kappa) / 2 <= E``:

    gamma = 2 E / (L (1 + kappa)).                                                  (R1)

Leapfrog with step ``eta`` leaves ``p^2 / 2 + (lambda / 2)(1 - eta^2 lambda / 4) q^2`` invariant
on a Gaussian, so unadjusted HMC with fresh momenta has ``q``'s variance
``1 / (lambda (1 - eta^2 lambda / 4))`` for any number of leapfrog steps: ULA's with
``gamma = eta^2 / 2``, and ``eta = sqrt(2 gamma)`` from (R1).

**The rules** (``kappa``'s terms are the paper's where it has them; ``w_i = N_i / N``, ``p_i``
client ``i``'s participation probability, ``omega_i`` its compressor's variance factor,
``n_i`` its batch of ``N_i`` points):

* QLSD*, LSD*, QLSD++, LSD++ (Vono et al. 2022, Theorems S6 and 3): (R1) with the variance
  bound of the compressed control-variate gradients, ``E||G - grad U||^2 <= M~ <theta - theta*,
  grad U(theta) - grad U(theta*)>`` (their (S37)) with
  ``M~ = M_bar max_i {omega_i N_i + (omega_i + 1)(N_i (1 - p_i) / p_i + A_i)}``,
  ``A_i = N_i (N_i - n_i) / (n_i (N_i - 1))``, and the per-point smoothness ``M_bar`` taken as
  ``L / N``: ``kappa = M~ / L``. Then ``gamma = 2 E / (L + M~)``, ``2 E`` times their
  ``gamma_bar_2 = 1 / (m + L + M~)`` without ``m``. ``M_bar = L / N`` holds when every point
  has the same curvature in the same direction; a point's curvature is spread over ``d``
  directions and high-leverage points are stiffer, so the minibatch term ``A_i M_bar`` can be
  short by orders of magnitude (on a 31-parameter logistic regression of 312 points, by 150
  times). The rule therefore measures it where it can: the stationary covariance of the
  minibatch noise of the control-variate gradients, ``C = sum_i c_i sum_{j in i} H_j H^{-1} H_j``
  with ``c_i = (omega_i + 1) A_i / p_i`` (the weights :func:`noise_weights`), adds
  ``u' C u`` to the noise variance ``s^2`` of direction ``u``, so ``noise = lambda_max(C)``
  (``Setting.noise``, :func:`fedmcmc.estimators.curvature.minibatch_noise`) replaces the
  minibatch part of ``M~``. QLSD++'s control variates sit at a past state of the chain rather
  than at the mode, two independent draws apart at most: twice the noise. QLSD++ also keeps
  Theorem 3's ``gamma <= alpha / (3 m)`` (``alpha`` the memory rate, ``p_i / (omega_i + 1)`` by default
  under ``memory_update = "inverse_probability"``, :mod:`fedmcmc.samplers.qlsd_pp`) when
  ``lambda_min = m`` is given.
* QLSD# (Theorem S5) and SGLD: (R1) with the compression and participation terms as above and
  the minibatch noise of a gradient summed over ``N`` points from ``n``, whose covariance is
  ``(N / n - 1)`` times the Fisher information (= the Hessian at the mode):
  ``kappa += N / n - 1``. QLSD#'s bias from the clients' gradients at the mode (``omega B*``,
  their Table 2) is not a matter of curvature; no step removes it (use QLSD* or QLSD++).
* FA-HMC, FA-LD (Liang et al. 2024; Deng et al. 2021): ``eta = 2 sqrt(E / D)``,
  ``D = S min(K, S) L + K (N / n - 1) L + K sigma^2 + 4 omega S^2 L``, from the relative variance
  inflations of: a round of ``S`` leapfrog steps taken on heterogeneous local potentials (each
  client's private momentum and own curvature carry it away from the others until the round
  ends), bounded by treating the round as one step of the dynamics it integrates: ballistic
  within a trajectory of ``K`` steps, a leapfrog step of ``S eta`` if ``K >= S``
  (``(S eta)^2 L / 4``), and ``S / K`` Langevin steps of ``(K eta)^2 / 2`` otherwise
  (``S K eta^2 L / 4``; FA-LD, ``K = 1``: ``T`` steps of ULA as one); minibatch and simulated
  gradient noise heating the momentum over a trajectory (``K eta^2 s^2 / 4``); and compressing
  the round's move ``eta S p`` (``omega eta^2 S^2 L``). The paper's condition on the same
  quantities, ``(K eta)^2 <= C eps^2 / (d T^2 (1 - rho) N)`` (Proposition 4.3, ``C`` unknown),
  also shrinks the step with the steps per round; its proofs' ``K eta <= 1 / sqrt(L)`` is a
  contraction condition, which the rule does not impose.
* FA-HMC with ``num_leapfrog = "auto"``: no bound; the step and the trajectory length ``K`` whose
  round forgets its state fastest among those whose exact stationary law on the clients' Laplace
  approximations (the clients' Hessians and gradients at the mode: the rounds above, nothing more)
  keeps every linear combination's sd within :data:`STD_INFLATION` and its mean within
  :data:`MEAN_OFFSET` sd (:mod:`fedmcmc.samplers.fa_hmc_law`; trajectory clock, full batches,
  uncompressed, full participation, up to 200 parameters).
* DSGLD and CG-DSGLD (Ahn et al. 2014; El Mekkaoui et al. 2021): the local step is ``h / 2``
  on the shard's potential ``-log p - (1 / f_s) log p(x_s | theta)``, whose curvature is about
  ``(w_s / f_s) L``, with minibatch noise ``kappa_s = (N_s / m_s - 1) w_s / f_s^2``:
  ``h = 4 E / (L max_s (w_s / f_s + kappa_s) V)``. A visit of ``V`` (``local_steps``) steps
  follows one shard, the bias conducive gradients cure exactly only with exact surrogates
  (Gaussian models); Taylor or Laplace surrogates of another likelihood are exact at the mode
  only, so for both samplers a visit is bounded as FA-HMC's round, as one step of ``V h / 2``.
  CG-DSGLD's visit follows ``v_s + alpha g_s``, the gradient of a potential with the Hessian
  ``M_s = H_0 + H_s / f_s + alpha (Lambda - Lambda_s / f_s)`` (``Lambda_s`` the precision of shard
  ``s``'s Gaussian surrogate, ``Lambda = sum_s Lambda_s``; ``Setting.visit``,
  :func:`fedmcmc.estimators.conducive.visit_curvature`, at the mode): the rule bounds the largest
  of the shard's own curvature and ``lambda_max(M_s)``,
  ``h = 4 E / (max_s(max(L w_s / f_s, lambda_max(M_s)) + L kappa_s) V)``. The shard's own term
  stays because the conducive term is fixed while ``H_s`` moves with ``theta``; Taylor surrogates
  at the mode give ``M_s = nabla^2 U``, ``lambda_max(M_s) = L``, and DSGLD's step. A negative
  eigenvalue ``lambda`` of ``M_s`` (diagonal surrogates of a correlated shard have them) pushes a
  visit away from the mode along its direction, by ``1 - h lambda / 2`` a step, while the other
  shards' visits pull back (their average ``sum_s f_s M_s`` is ``nabla^2 U`` up to the surrogates'
  error); down to ``-L`` the bound covers it (``max_s w_s / f_s >= 1``, so the step keeps
  ``h V |lambda| / 2 <= 2E`` over a visit). One beyond ``-L`` means the surrogate's precision
  ``Lambda_s / f_s`` outweighs the shard's curvature by more than the posterior's stiffest
  direction, so the step would be set by a failed fit: refused, naming the surrogates.
  CG-DSGLD's SGLD surrogates (``surrogate_step_size = "auto"``, :func:`surrogate_step`) run ULA
  with ``gamma = h / 2`` on a shard's potential, whose curvature is at most ``L``: ``h = 4 E / L``.
  FA-HMC's and FA-LD's dynamic step (``step_decay = "auto"``, :func:`step_decay`) starts from the
  rule's ``eta`` and keeps it for Proposition J.1's first stage, ``lambda_min`` as its ``mu``.
* **The clients' drift** (FA-HMC, FA-LD, DSGLD): a chain that follows one local potential
  ``f_c = U_0 + U_c / s_c`` for several steps is pulled towards that client's own mode, and on
  non-IID data the pulls do not cancel. On quadratic ``f_c`` (Hessians ``A_c``, gradients
  ``g_c`` at the mode, ``sum_c s_c g_c = 0``) a client's mean map over a round is
  ``x -> m_c + (I - alpha A_c + beta A_c^2)(x - m_c)`` to second order, and the fixed point of
  the averaged map is off the mode by ``delta = (beta / alpha) A^{-1} b``, ``b = sum_c s_c A_c g_c``
  (:func:`fedmcmc.estimators.curvature.heterogeneity`, one round). ``beta / alpha`` is
  ``(T - 1) gamma / 2`` for ``T`` Langevin steps of ``gamma`` and ``(K eta)^2 (1/12 + (n - 1)/4)``
  for ``n`` trajectories of ``K`` leapfrog steps (``cos(K eta sqrt(A))^n``). In posterior sds,
  no marginal (no linear combination) is off by more than ``||A^{1/2} delta|| <= (beta / alpha)
  ||b|| / sqrt(m)`` (``m = lambda_min``; the bound is exact when the sampler runs whitened). The
  rules keep it below :data:`MEAN_OFFSET` (``D``, 0.05 sd) and take the smaller step. DSGLD also
  draws one shard's gradient at a time: at the mode its covariance is ``S = sum_s f_s g_s g_s'``,
  held for a visit of ``V`` steps, which adds at most ``gamma V lambda_max(S) / (2 m)`` to a
  marginal's relative variance: ``h <= 4 E m / (V lambda_max(S))``. CG-DSGLD's conducive gradients cancel both
  at the mode (exactly for Taylor surrogates there), so its rule reads neither.
* DG-SGLD (Plassier et al. 2021): client ``i``'s step on ``U_i(z) + ||z - theta||^2 / (2 rho_i)``,
  whose curvature is at most ``L + 1 / rho_i`` (``nabla^2 U_i <= nabla^2 U`` for convex terms):
  ``gamma_i = 2 E / (L (1 + kappa_i) + 1 / rho_i)``, ``kappa_i = N_i / n_i - 1``. With ``rho =
  "auto"`` the tolerance is the largest whose smoothing keeps the same inflation
  (:func:`tolerance`): a factor of precision ``H_i`` becomes ``H_i (I + rho H_i)^{-1}``, at least
  ``(1 + rho L)^{-1}`` of it, so the sd grows by at most ``sqrt(1 + rho L)``, and
  ``rho = ((1 + 0.02)^2 - 1) / L``. A smaller ``rho`` is less biased and mixes more slowly.
* FedAvg (McMahan et al. 2017), an optimiser: gradient descent's ``1 / L`` on the clients'
  averaged objective ``sum_c w_c F_c = U / N``, i.e. ``learning_rate = N / L``.
* VR-FALD* (Plassier et al. 2023): FA-LD's rule with ``K = 1`` (``D = T L + s^2 + 4 omega T^2 L``,
  the same round of ``T`` Langevin steps on heterogeneous local curvatures, and the same
  compression of the move), with the minibatch noise ``s^2`` of its control variates at the mode
  instead of a plain minibatch's ``(N / n - 1) L``: measured (``Setting.noise``) when it can be,
  else QLSD*'s bound ``L max_i A_i / N`` (the measurement's weights :func:`noise_weights` count
  compression and participation as QLSD*'s gradients have them; here they act on the move, so
  the noise is over-counted and the step smaller than it need be). No drift term: at the mode every client's corrected
  drift is the posterior's (on quadratic local potentials every corrected potential is centred at
  the mode, and the stationary mean is exact).
* pSGLD has none: its step is relative to an RMSprop preconditioner built from the gradients
  along the run, which the curvature at the mode does not determine.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedmcmc.estimators import surrogates
from fedmcmc.estimators.gradients import FULL_HESSIAN_DIM
from fedmcmc.samplers import fa_hmc_law, schedules
from fedmcmc.samplers.trajectories import steps_per_round

#: The largest marginal standard-deviation inflation a rule allows (discretisation and noise).
STD_INFLATION = 0.02
#: ``E``: the admissible ``gamma L / 2`` of ULA for that inflation.
E = 1.0 - (1.0 + STD_INFLATION) ** -2
#: ``D``: the largest offset of the stationary mean a rule allows from the clients' drift, in posterior sds.
MEAN_OFFSET = 0.05


class Setting(NamedTuple):
    """What a rule reads: the curvature, the sampler's builder arguments, and the data's sizes.

    ``lambda_min`` is None when not estimated; ``counts`` are the clients' ``N_i`` (one entry for a
    pooled sampler); ``drift`` and ``spread`` are the clients' heterogeneity at the mode
    (:class:`fedmcmc.estimators.curvature.Heterogeneity`, with the shares of the sampler's
    :attr:`fedmcmc.samplers.Registered.shares`), None when not measured; ``noise`` is ``lambda_max``
    of the control variates' minibatch noise covariance
    (:func:`fedmcmc.estimators.curvature.minibatch_noise` with :func:`noise_weights`), None when not
    measured; ``visit`` is CG-DSGLD's ``(lambda_max, lambda_min)`` per shard of its visits' potential
    with the conducive term (:func:`fedmcmc.estimators.conducive.visit_curvature`), None when not
    measured; ``local`` is ``([b, d, d] A_c, [b, d] g_c)``, the Hessians and gradients at the mode
    of the clients' local potentials ``f_c = U_0 + U_c / s_c`` (FA-HMC's ``num_leapfrog = "auto"``,
    :mod:`fedmcmc.samplers.fa_hmc_law`), None when not measured.
    """

    lambda_max: float
    lambda_min: float | None
    args: dict
    counts: np.ndarray
    dim: int
    drift: float | None = None
    spread: float | None = None
    noise: float | None = None
    visit: tuple | None = None
    local: tuple | None = None


def _omega(s: Setting) -> np.ndarray:
    compressor = s.args.get("compressor")
    omega = 0.0 if compressor is None else compressor.omega(s.dim)
    return np.broadcast_to(np.asarray(omega, np.float64), s.counts.shape)


def _batch(s: Setting) -> np.ndarray:
    """``n_i``: the batch of each client (``N_i`` for full batches; a pooled batch is the total)."""
    batch = s.args.get("batch_size")
    if batch is None:
        return s.counts.astype(np.float64)
    return np.minimum(np.broadcast_to(np.asarray(batch, np.float64), s.counts.shape), s.counts)


def _probs(s: Setting) -> np.ndarray:
    participation = s.args.get("participation")
    probs = 1.0 if participation is None or participation.probs is None else participation.probs
    return np.broadcast_to(np.asarray(probs, np.float64), s.counts.shape)


def _spread(s: Setting) -> np.ndarray:
    """``A_i = N_i (N_i - n_i) / (n_i (N_i - 1))``: a minibatch sum's variance factor."""
    n_i, batch = s.counts.astype(np.float64), _batch(s)
    return np.where(n_i > 1, n_i * (n_i - batch) / (batch * np.maximum(n_i - 1, 1)), 0.0)


def _compression_kappa(s: Setting, control_variates: bool) -> float:
    """``M~ / L`` of QLSD's Theorems S5/S6 with ``M_bar = L / N``, and the control variates'
    minibatch term measured when ``s.noise`` is (see the module docstring)."""
    w, omega, p = s.counts / s.counts.sum(), _omega(s), _probs(s)
    measured = control_variates and s.noise is not None
    minibatch = _spread(s) / s.counts.sum() if control_variates and not measured else 0.0
    kappa = float(np.max(w * omega + (omega + 1) * (w * (1 - p) / p + minibatch)))
    return kappa + (s.noise / s.lambda_max if measured else 0.0)


def noise_weights(name: str, s: Setting) -> np.ndarray | None:
    """``c_i = k (omega_i + 1) A_i / p_i`` for :func:`fedmcmc.estimators.curvature.minibatch_noise`
    (``k``: :attr:`fedmcmc.samplers.Registered.control_points`), or None when sampler ``name`` has
    no control-variate minibatch noise to measure (another sampler, or full batches)."""
    from fedmcmc.samplers import REGISTRY  # the registry says where a sampler's control points sit

    points = REGISTRY[name].control_points
    if points is None:
        return None
    weights = points * (_omega(s) + 1) * _spread(s) / _probs(s)
    return weights if np.any(weights > 0) else None


def _minibatch_kappa(s: Setting) -> float:
    """``N / n - 1``: a plain minibatch gradient's covariance in units of the Hessian."""
    return float(s.counts.sum() / _batch(s).sum() - 1.0)


def _langevin(s: Setting, kappa: float) -> float:
    return 2.0 * E / (s.lambda_max * (1.0 + kappa))


def _qlsd_cv(s: Setting) -> tuple[float, str]:
    measured = "" if s.noise is None else " with measured minibatch noise"
    return _langevin(s, _compression_kappa(s, True)), f"2E / (L + M~) (QLSD Thm S6{measured})"


def _qlsd_pp(s: Setting) -> tuple[float, str]:
    gamma, rule = _qlsd_cv(s)
    if s.lambda_min is None or not s.lambda_min > 0 or not s.args.get("memory", True):  # no estimate of m
        return gamma, rule
    rate = s.args.get("memory_rate")
    if rate is None:  # the builder's default: 1 / (omega_i + 1), p_i / (omega_i + 1) under eq. S45's update
        default = 1.0 / (1.0 + _omega(s))
        alpha = float(np.min(default * _probs(s) if s.args.get("memory_update") == "inverse_probability" else default))
    else:
        alpha = float(np.min(rate))
    if alpha > 0 and alpha / (3 * s.lambda_min) < gamma:
        return alpha / (3 * s.lambda_min), "alpha / (3 m) (QLSD++ Thm 3)"
    return gamma, rule


def _qlsd_sharp(s: Setting) -> tuple[float, str]:
    return (_langevin(s, _compression_kappa(s, False) + _minibatch_kappa(s)),
            "2E / (L (1 + M~/L + N/n - 1)) (QLSD Thm S5)")


def _sgld(s: Setting) -> tuple[float, str]:
    return _langevin(s, _minibatch_kappa(s)), "2E / (L (1 + N/n - 1)) (ULA variance)"


def _in_sds(s: Setting) -> float | None:
    """``1 / sqrt(m)``: the largest offset in posterior sds of a marginal per unit of ``||b||``
    (``||A^{1/2} A^{-1} b|| <= ||b|| / sqrt(m)``; 1 when whitened)."""
    if s.lambda_min is None or not s.lambda_min > 0:
        return None
    return float(1.0 / np.sqrt(s.lambda_min))


def _fa_hmc(s: Setting) -> tuple:
    if s.args.get("num_leapfrog") == "auto":
        return _fa_hmc_law(s)
    k = int(s.args.get("num_leapfrog", 1))
    steps = steps_per_round(k, int(s.args["local_steps"]), s.args.get("clock", "leapfrog"))
    sigma = float(s.args.get("gradient_noise", 0.0))
    lam = s.lambda_max
    omega = float(np.max(_omega(s)))
    d = steps * min(k, steps) * lam + k * _minibatch_kappa(s) * lam + k * sigma**2 + 4 * omega * steps**2 * lam
    eta, rule = 2.0 * np.sqrt(E / d), "2 sqrt(E / (S min(K, S) L + K (N/n - 1) L + K sigma^2 + 4 omega S^2 L))"
    scale, length = _in_sds(s), min(k, steps)
    if s.drift and scale:
        trajectories = steps / length
        drifted = np.sqrt(MEAN_OFFSET / (scale * s.drift * (1 / 12 + (trajectories - 1) / 4))) / length
        if drifted < eta:
            return drifted, "sqrt(D sqrt(m) / (|b| (1/12 + (n - 1)/4))) / min(K, S) (client drift)"
    return eta, rule


def _fa_hmc_law(s: Setting) -> tuple[float, str, dict]:
    """FA-HMC's ``num_leapfrog = "auto"``: the step and trajectory length from the exact law of a round
    on the clients' Laplace approximations (:func:`fedmcmc.samplers.fa_hmc_law.choose`)."""
    why = [text for bad, text in (
        (s.args.get("clock", "leapfrog") != "trajectory", 'clock = "trajectory" (a round of whole trajectories)'),
        (np.any(_batch(s) < s.counts), "full batches (no batch_size or batch_fraction)"),
        (np.any(_omega(s) > 0), "uncompressed uploads (no compression)"),
        (np.any(_probs(s) < 1), "full participation"),
        (float(s.args.get("gradient_noise", 0.0)) > 0, "exact gradients (no gradient_noise)"),
        (s.args.get("debiased", False), "debiased = false"),
        (s.args.get("step_decay") is not None, "a constant step (no step_decay)"),
        (s.dim > FULL_HESSIAN_DIM, f"the clients' Hessians at the mode, which one round gives up to "
                                   f"{FULL_HESSIAN_DIM} parameters (this model has {s.dim})")) if bad]
    if why:
        raise ValueError('num_leapfrog = "auto" chooses the trajectory from the exact law of a round on the '
                         f"clients' Laplace approximations, which holds for {'; '.join(why)}; give num_leapfrog "
                         "(a number) instead")
    if s.local is None:  # checked before the rounds that measure it
        return float("nan"), "", {}
    hessians, gradients = s.local
    weights = np.asarray(s.args["weights"], np.float64)
    choice = fa_hmc_law.choose(hessians, gradients, weights, int(s.args["local_steps"]),
                               float(s.args.get("correlation", 0.0)), STD_INFLATION, MEAN_OFFSET)
    law = choice.law
    return (choice.step_size,
            f"the fastest-forgetting (eta, K) whose round's exact law on the Laplace approximation keeps sds within "
            f"{STD_INFLATION:.0%} and the mean within {MEAN_OFFSET:g} sd (fedmcmc.samplers.fa_hmc_law)",
            {"num_leapfrog": choice.num_leapfrog, "rounds_per_draw": law.autocorrelation_time / 2,
             "law": {"sd_ratios": list(law.sd_ratios), "mean_offset_sds": law.mean_offset,
                     "autocorrelation_rounds": law.autocorrelation_time}})


def _dsgld(s: Setting) -> tuple[float, str]:
    w = s.counts / s.counts.sum()
    f = np.asarray(s.args["probs"], np.float64)
    own, kappa = w / f, (s.counts / _batch(s) - 1.0) * w / f**2
    visit = int(s.args["local_steps"])
    if s.visit is not None:  # CG-DSGLD: the conducive term's curvature too
        top, low = (np.asarray(v, np.float64) for v in s.visit)
        if np.any(-low > s.lambda_max):
            bad = int(np.argmin(low))
            what, _ = surrogates.describe(s.args.get("surrogate") or surrogates.taylor())
            raise ValueError(f"CG-DSGLD's visit potential on shard {bad} is not convex at the mode: H_0 + H_s / f_s + "
                             f"alpha (Lambda - Lambda_s / f_s) has the eigenvalue {low[bad]:.3g}, beyond the posterior's "
                             f"-lambda_max = {-s.lambda_max:.3g}, with its surrogates ({what}): the surrogate's "
                             "precision Lambda_s / f_s outweighs the shard's curvature, a visit is pushed away from the "
                             "mode faster than the posterior pulls, and no step fixes that; use surrogates that match "
                             'the shards\' curvature at the mode (surrogate = "taylor" or "laplace"; for "sgld", more '
                             "surrogate_steps or a smaller surrogate_step_size), or a smaller alpha")
        scale = np.max(np.maximum(own, top / s.lambda_max) + kappa)
        return (4.0 * E / (s.lambda_max * scale * visit),
                "4E / (max_s(max(L w_s/f_s, lambda_max(M_s)) + L kappa_s) V) (conducive visit curvature)")
    scale = np.max(own + kappa)
    h, rule = 4.0 * E / (s.lambda_max * scale * visit), "4E / (L max_s(w_s/f_s + kappa_s) V)"
    sds = _in_sds(s)
    if s.spread is None or s.args.get("surrogate") is not None or not sds:
        return h, rule  # CG-DSGLD (no shares): its conducive gradients cancel the shards' pull at the mode
    noise = 4.0 * E / (visit * s.spread * sds**2)
    drift = 4.0 * MEAN_OFFSET / ((visit - 1) * sds * s.drift) if visit > 1 and s.drift else np.inf
    if min(noise, drift) < h:
        return ((noise, "4E m / (V lambda_max(S)) (shard noise)") if noise <= drift
                else (drift, "4D sqrt(m) / ((V - 1) |b|) (shard drift)"))
    return h, rule


def tolerance(lambda_max: float) -> float:
    """DG-SGLD's ``rho = "auto"``: ``((1 + STD_INFLATION)^2 - 1) / L`` (module docstring)."""
    return ((1.0 + STD_INFLATION) ** 2 - 1.0) / lambda_max


def surrogate_step(lambda_max: float) -> float:
    """CG-DSGLD's ``surrogate_step_size = "auto"``: ``4 E / L`` (module docstring)."""
    return 4.0 * E / lambda_max


def trajectories_per_round(args: dict) -> float:
    """FA-HMC's trajectories of ``K`` leapfrog steps per round, ``S / K`` (fractional where a
    trajectory spans rounds), from its builder arguments."""
    k = int(args.get("num_leapfrog", 1))
    return steps_per_round(k, int(args["local_steps"]), args.get("clock", "leapfrog")) / k


def step_decay(record: dict, args: dict) -> int:
    """FA-HMC's and FA-LD's ``step_decay = "auto"``: Proposition J.1's first stage
    ``t_1 = ceil(log 8 / -log(1 - mu (K eta)^2 / 4))`` trajectories at the automatic step ``eta``,
    with ``mu = lambda_min`` (:func:`fedmcmc.samplers.schedules.first_stage`)."""
    mu = record.get("lambda_min")
    if mu is None or not mu > 0:
        raise ValueError(f'step_decay = "auto" needs the posterior\'s smallest curvature lambda_min > 0 at the mode '
                         f"(got {mu!r}); give step_decay as a number of trajectories")
    return schedules.first_stage(mu, float(record["value"]), int(args.get("num_leapfrog", 1)),
                                 trajectories_per_round(args))


def of_lambda_max(rule):
    """An automatic key's rule (:attr:`fedmcmc.samplers.Registered.auto_keys`) from a function of
    ``lambda_max`` alone."""
    return lambda record, args: rule(record["lambda_max"])


def chosen(key: str):
    """An automatic key that the step's rule chose with the step (its record's ``key``)."""
    return lambda record, args: record[key]


def _dg_sgld(s: Setting) -> tuple[np.ndarray, str]:
    rho = s.args["rho"]
    rho = tolerance(s.lambda_max) if isinstance(rho, str) else rho
    rho = np.broadcast_to(np.asarray(rho, np.float64), s.counts.shape)
    kappa = s.counts / _batch(s) - 1.0
    gamma = 2.0 * E / (s.lambda_max * (1.0 + kappa) + 1.0 / rho)
    return (float(gamma[0]) if np.all(gamma == gamma[0]) else gamma), "2E / (L (1 + kappa_i) + 1/rho_i)"


def _fedavg(s: Setting) -> tuple[float, str]:
    return float(s.counts.sum()) / s.lambda_max, "N / L (gradient descent's 1/L on U/N)"


def _vr_fald(s: Setting) -> tuple[float, str]:
    steps, lam, omega = int(s.args["local_steps"]), s.lambda_max, float(np.max(_omega(s)))
    noise = s.noise if s.noise is not None else lam * float(np.max(_spread(s))) / float(s.counts.sum())
    d = steps * lam + noise + 4 * omega * steps**2 * lam
    measured = "measured" if s.noise is not None else "L max_i A_i / N"
    return 2.0 * np.sqrt(E / d), f"2 sqrt(E / (T L + s*^2 + 4 omega T^2 L)), s*^2 = {measured} (VR-FALD*)"


def _langevin_time(s: Setting, step) -> float:
    """The Langevin time of a round of one ULA step: ``gamma``."""
    return float(step)


def _leapfrog_time(s: Setting, step) -> float:
    """``(K eta)^2 / 2`` per trajectory of ``K`` leapfrog steps, whose position on a Gaussian of
    precision ``m`` keeps ``cos(K eta sqrt(m))`` of its offset, ``1 - m (K eta)^2 / 2``."""
    k = int(s.args.get("num_leapfrog", 1))
    steps = steps_per_round(k, int(s.args["local_steps"]), s.args.get("clock", "leapfrog"))
    return steps * min(k, steps) * float(step) ** 2 / 2


def _visit_time(s: Setting, step) -> float:
    """``h / 2`` per DSGLD step, ``local_steps`` of them a round."""
    return int(s.args["local_steps"]) * float(step) / 2


def _gibbs_time(s: Setting, step) -> float:
    """DG-SGLD: ``sum_i (c_i / rho_i) / (sum_i 1 / rho_i)^2``. On a Gaussian with client precisions
    ``a_i`` (``sum_i a_i = m``), an exact sweep draws ``z_i ~ N(theta / (1 + rho_i a_i), .)`` and
    ``theta`` from their ``1 / rho_i``-weighted mean, so ``theta`` keeps ``1 - m / sum_i(1 / rho_i)``
    of its offset (to first order in ``rho a``). ``T_i`` Langevin steps of ``gamma_i`` move ``z_i``
    only ``c_i = 1 - (1 - gamma_i / rho_i)^T_i`` of the way to its new centre, the rest in later
    rounds: ``theta`` is then an ARMA(1, 1) whose pole keeps ``1 - c m / sum_i(1 / rho_i)`` and whose
    integrated autocorrelation time is about ``2 / (c m / sum_i(1 / rho_i))`` (first order in
    ``m / sum_i(1 / rho_i)``), which each client's ``c_i`` weights."""
    rho = s.args["rho"]
    rho = np.broadcast_to(np.asarray(tolerance(s.lambda_max) if isinstance(rho, str) else rho, np.float64),
                          s.counts.shape)
    gamma = np.broadcast_to(np.asarray(step, np.float64), s.counts.shape)
    local = np.broadcast_to(np.asarray(s.args.get("num_local_steps", 1), np.float64), s.counts.shape)
    moved = 1.0 - (1.0 - np.minimum(gamma / rho, 1.0)) ** local
    return float(np.sum(moved / rho) / np.sum(1.0 / rho) ** 2)


def rounds_per_draw(name: str, setting: Setting, step) -> float | None:
    """``1 / (m t)``: the rounds a chain of sampler ``name`` at ``step`` takes to forget its state in
    the posterior's widest direction (``m = lambda_min``, ``t`` the Langevin time of a round,
    :attr:`fedmcmc.samplers.Registered.round_time`): an effective sample size of about
    ``rounds / (2 / (m t))`` per chain. None when ``m`` or ``t`` is unknown."""
    from fedmcmc.samplers import REGISTRY  # the registry holds the round times of this module

    time = REGISTRY[name].round_time
    if time is None or setting.lambda_min is None or not setting.lambda_min > 0:
        return None
    return float(1.0 / (setting.lambda_min * time(setting, step)))


def auto_step(name: str, setting: Setting) -> tuple:
    """The step of registered sampler ``name`` by its rule (:attr:`fedmcmc.samplers.Registered.step`):
    ``(step, formula)``, or ``(step, formula, extra)`` where the rule also chose other settings
    (``extra`` goes into the step's record); a sampler without one is refused in one line."""
    from fedmcmc.samplers import REGISTRY  # the registry holds the rules of this module

    rule = REGISTRY[name].step
    if not callable(rule):
        why = rule or "no step rule is registered for it (fedmcmc.samplers.Registered.step)"
        raise ValueError(f'{name} has no step_size = "auto": {why}; give step_size (a number)')
    if not (np.isfinite(setting.lambda_max) and setting.lambda_max > 0):
        raise ValueError(f"the curvature at the mode must be positive and finite (got {setting.lambda_max!r}); "
                         "is the posterior proper?")
    return rule(setting)
