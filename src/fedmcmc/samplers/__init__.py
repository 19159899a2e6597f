"""Federated samplers, one algorithm per module, and their registry under the papers' names.

:data:`REGISTRY` maps a sampler's paper name (the ``[sampler] name`` of a run config) to a
:class:`Registered`: everything the rest of the package knows about a sampler, in one entry.
A new sampler is one module and one :class:`Registered` line here; every other place reads the
registry:

* the run config (:mod:`fedmcmc.app.config`) derives the keys a ``[sampler]`` section may and
  must set from the builder's signature, less :attr:`Registered.fixed`, plus
  :attr:`Registered.must_set`; ``fedmcmc list`` prints them;
* ``step_size = "auto"`` (:func:`fedmcmc.samplers.steps.auto_step`) calls :attr:`Registered.step`,
  with the clients' heterogeneity when :attr:`Registered.shares` is set and the control variates'
  minibatch noise when :attr:`Registered.control_points` is, sets the keys of
  :attr:`Registered.auto_keys` from the same curvature, and estimates the rounds per independent
  draw from :attr:`Registered.round_time`;
* ``[privacy]`` (:func:`fedmcmc.privacy.mechanisms.mapping`) interprets :attr:`Registered.privacy`;
* a Flower run on node-local data refuses a pooled sampler (:func:`fedmcmc.app.flower.nodes.refused`);
* the chain-scaling bench (:mod:`fedmcmc.app.bench.chains`) and the tests' catalogue run the
  example run of :attr:`Registered.example` and :attr:`Registered.problem`;
* the conformance tests (``tests/core/test_conformance.py``) run every entry through both runtimes.

Only ``build`` and ``summary`` are required: without a rule ``step_size = "auto"`` is refused
in one line, without a privacy mapping ``[privacy]`` records the reason for both levels, and
the example run takes the builder's defaults.

**Which way the imports go.** This package is below :mod:`fedmcmc.privacy` and
:mod:`fedmcmc.app` and imports neither (the privacy accountant alone takes seconds to import,
and the app imports the registry). So an entry holds what those layers interpret, not their
code: the step rule is a function of :mod:`fedmcmc.samplers.steps` (same layer); the privacy
mapping is declarative, :class:`Accounted` naming one of the Gaussian mechanisms derived in
:mod:`fedmcmc.privacy.mechanisms` (:data:`~fedmcmc.privacy.mechanisms.MECHANISMS`, a table per
mechanism, which several samplers share), or a string, the reason it is refused; the example
run is plain ``[sampler]`` and ``[problem]`` keys, which the app builds as it builds a config.
Whoever interprets an entry looks it up when called, not when imported (:mod:`fedmcmc.privacy.mechanisms`
and :mod:`fedmcmc.samplers.steps` import this package inside their functions), so an entry added
at run time is seen everywhere, and no other module keeps a table per sampler.
"""

from typing import Callable, NamedTuple

from fedmcmc.core.base import FederatedSampler
from fedmcmc.samplers import steps
from fedmcmc.samplers.consensus_mc import consensus_mc
from fedmcmc.samplers.dg_sgld import dg_sgld
from fedmcmc.samplers.dsgld import cg_dsgld, dsgld
from fedmcmc.samplers.fa_hmc import fa_hmc, fa_ld
from fedmcmc.samplers.fedavg import fedavg
from fedmcmc.samplers.gaussian_product import gaussian_product
from fedmcmc.samplers.psgld import psgld
from fedmcmc.samplers.qlsd import lsd_star, qlsd, qlsd_sharp, qlsd_star
from fedmcmc.samplers.qlsd_pp import lsd_pp, qlsd_pp
from fedmcmc.samplers.sgld import sgld
from fedmcmc.samplers.subposterior import step_rule as _subposterior_step
from fedmcmc.samplers.vr_fald import vr_fald_star


class Accounted(NamedTuple):
    """A sampler whose rounds ``[privacy]`` accounts.

    Attributes
    ----------
    mechanism
        The key of :data:`fedmcmc.privacy.mechanisms.MECHANISMS` whose derivation covers the
        sampler's rounds (named after the algorithm it was derived for).
    knobs
        ``{level: field}``: the :class:`fedmcmc.privacy.mechanisms.Setting` field that a budget
        at that level chooses, where it is not ``clip`` (client level) or ``record_clip``
        (record level).
    """

    mechanism: str
    knobs: dict = {}


#: The privacy reason of an entry that declares none.
NOT_ACCOUNTED = "no privacy mapping is registered for this sampler (fedmcmc.samplers.Registered.privacy)"


class Registered(NamedTuple):
    """A sampler under its paper name: all that the config, the automatic step, the privacy
    accountant, the message runtime, the bench and the tests know of it (module docstring).

    Attributes
    ----------
    build
        The public builder (its keyword arguments are the sampler's settings).
    summary
        One line: the algorithm and its paper.
    pooled
        A centralised baseline: it runs on one client holding all the data
        (:meth:`fedmcmc.FederatedData.pooled`) and communicates nothing.
    step
        Its rule for ``step_size = "auto"``: ``rule(fedmcmc.samplers.steps.Setting) -> (step,
        formula)`` (documented in :mod:`fedmcmc.samplers.steps`), or a string, why it has
        none; None: no rule (``"auto"`` is refused).
    shares
        The builder argument that holds the shares of the clients' local potentials, for a
        rule that reads the clients' heterogeneity at the mode (one more round,
        :func:`fedmcmc.estimators.curvature.heterogeneity`); None: the rule does not.
    round_time
        ``time(steps.Setting, step) -> float``: the Langevin time a round advances the chain, from
        which ``step_size = "auto"`` estimates the rounds per independent draw
        (:func:`fedmcmc.samplers.steps.rounds_per_draw`); None: no estimate of its mixing (FedAvg,
        pSGLD's preconditioner).
    control_points
        For control-variate gradients, how many independent stationary draws apart their control
        points sit at most (1 at the mode; :func:`fedmcmc.samplers.steps.noise_weights`, whose
        minibatch noise ``step_size = "auto"`` measures); None: no control variates.
    auto_keys
        ``{key: rule(record, args) -> value}``: ``[sampler]`` keys besides ``step_size`` that
        ``"auto"`` sets from the same curvature (with ``step_size = "auto"``), from the step's
        record (``value``, ``lambda_max``, ``lambda_min``: :func:`fedmcmc.app.auto_step.auto_step`) and
        the builder's arguments (:func:`fedmcmc.samplers.steps.of_lambda_max` makes one of a
        function of ``lambda_max``).
    privacy
        :class:`Accounted`, or a string: why ``[privacy]`` has no bound for it (both levels
        are recorded as refused with it, and a budget is refused naming it).
    example
        ``[sampler]`` keys (TOML values, besides ``name``) of a small example run: what the
        tests' catalogue and the chain-scaling bench build. Keys it leaves out take the
        builder's defaults.
    problem
        ``[problem]`` keys of the built-in problem (:data:`fedmcmc.app.problems.PROBLEMS`)
        the bench times the example on.
    fixed
        Builder arguments a config leaves at their defaults (initial arrays, internal objects).
    must_set
        ``{key: why}``: keys a config must set although the builder has a default.
    """

    build: Callable[..., FederatedSampler]
    summary: str
    pooled: bool = False
    step: Callable | str | None = None
    shares: str | None = None
    round_time: Callable | None = None
    control_points: float | None = None
    auto_keys: dict = {}
    privacy: Accounted | str = NOT_ACCOUNTED
    example: dict = {}
    problem: dict = {"name": "heterogeneous-gaussian"}
    fixed: frozenset = frozenset()
    must_set: dict = {}


_MODE = "the mode theta* and the server's constant sum_i grad U_i(theta*) are computed from the data without noise"
_HIDDEN = "hidden local steps: the released average is not a Gaussian mechanism of one client's data"
#: The examples' shared settings: minibatches of a fifth of each client's points, 16 quantisation
#: levels, Bernoulli participation of one half (active scaling).
_BATCH, _Q, _HALF = {"batch_fraction": 0.2}, {"compression": {"levels": 16}}, {"participation": {"p": 0.5}}
_SHARDS = {"step_size": 1e-4, "local_steps": 10, "shard_probs": "size", "batch_size": 8, "record_every": 5}
_LOCAL = {"name": "heterogeneous-local-posteriors", "dim": 10}
_BLOBS = {"name": "gaussian-blobs"}
_DRAWS = "the sites upload draws of their subposteriors (or their moments) computed without noise"
#: One-shot examples: 60 recorded draws (more than the problem's 50 dimensions) after 40 steps of burn-in.
_ONE_SHOT = {"step_size": 1e-3, "local_steps": 60, "local_burn_in": 40}

REGISTRY: dict[str, Registered] = {
    "sgld": Registered(sgld, "SGLD on the pooled data (Welling and Teh 2011, baseline)", pooled=True,
                       step=steps._sgld, round_time=steps._langevin_time, privacy=Accounted("sgld"),
                       example={"step_size": 1e-4, "batch_size": 32}),
    "psgld": Registered(psgld, "preconditioned SGLD on the pooled data (Li et al. 2016, baseline)", pooled=True,
                        step="its step is relative to an RMSprop preconditioner that the curvature at the mode does "
                             "not fix",
                        privacy="its preconditioner is built from past gradients without noise",
                        example={"step_size": 1e-4, "batch_size": 32}, fixed=frozenset({"v0"})),
    "qlsd#": Registered(qlsd_sharp, "QLSD with minibatch gradients (Vono et al. 2022, Alg. 1); alias 'qlsd'",
                        step=steps._qlsd_sharp, round_time=steps._langevin_time, privacy=Accounted("qlsd#"),
                        example={"step_size": 1e-4, **_BATCH, **_Q, **_HALF}),
    "qlsd*": Registered(qlsd_star, "QLSD with control variates at the mode (Vono et al. 2022)",
                        step=steps._qlsd_cv, round_time=steps._langevin_time, control_points=1.0, privacy=_MODE,
                        example={"step_size": 1e-4, **_BATCH, **_Q}),
    "lsd*": Registered(lsd_star, "QLSD* without compression (Vono et al. 2022)",
                       step=steps._qlsd_cv, round_time=steps._langevin_time, control_points=1.0, privacy=_MODE,
                       example={"step_size": 1e-4, **_BATCH}),
    "qlsd++": Registered(qlsd_pp, "QLSD with SVRG control variates and memory terms (Vono et al. 2022, Alg. 2)",
                         step=steps._qlsd_pp, round_time=steps._langevin_time, control_points=2.0,
                         privacy=Accounted("qlsd++", {"record": "clip"}),
                         example={"step_size": 1e-4, **_BATCH, **_Q, **_HALF, "refresh_every": 3}),
    "lsd++": Registered(lsd_pp, "QLSD++ without compression (Vono et al. 2022, Alg. S3)",
                        step=steps._qlsd_pp, round_time=steps._langevin_time, control_points=2.0,
                        privacy=Accounted("qlsd++", {"record": "clip"}),
                        example={"step_size": 1e-4, **_BATCH, "refresh_every": 3}),
    "fa-hmc": Registered(fa_hmc, "federated averaging of local SG-HMC (Liang et al. 2024, Alg. 3; "
                                 "debiased: Alg. B.2)",
                         step=steps._fa_hmc, shares="weights", round_time=steps._leapfrog_time,
                         auto_keys={"step_decay": steps.step_decay, "num_leapfrog": steps.chosen("num_leapfrog")},
                         privacy=_HIDDEN + " (FA-LD with local_steps = 1 is accounted)",
                         example={"step_size": 1e-2, "num_leapfrog": 3, "local_steps": 2, **_BATCH,
                                  "clock": "leapfrog"},
                         problem=_LOCAL,
                         must_set={"clock": 'clock is what local_steps counts: "leapfrog" (T leapfrog steps per '
                                            'round, as the paper runs it) or "trajectory" (T trajectories of '
                                            'num_leapfrog steps per round, Algorithm 3 as printed, and what '
                                            'local_steps meant before the clock existed)'}),
    "fa-ld": Registered(fa_ld, "federated averaging Langevin dynamics (Deng et al. 2021): FA-HMC with one "
                               "leapfrog step",
                        step=steps._fa_hmc, shares="weights", round_time=steps._leapfrog_time,
                        auto_keys={"step_decay": steps.step_decay}, privacy=Accounted("fa-ld"),
                        example={"step_size": 1e-2, "local_steps": 3, **_BATCH}, problem=_LOCAL),
    "vr-fald*": Registered(vr_fald_star, "FA-LD with control variates at the mode (Plassier, Moulines and Durmus "
                                         "2023, VR-FALD*)",
                           step=steps._vr_fald, round_time=steps._leapfrog_time, control_points=1.0,
                           privacy="the mode theta* and sum_i grad U_i(theta*), which every client holds, are "
                                   "computed from the data without noise; " + _HIDDEN,
                           example={"step_size": 1e-2, "local_steps": 3, **_BATCH}, problem=_LOCAL),
    "dsgld": Registered(dsgld, "distributed SGLD (Ahn et al. 2014): a chain visits one shard at a time",
                        step=steps._dsgld, shares="probs", round_time=steps._visit_time,
                        privacy=Accounted("dsgld", {"client": "record_clip", "record": "record_clip"}),
                        example=_SHARDS, problem=_BLOBS),
    "cg-dsgld": Registered(cg_dsgld, "DSGLD with conducive gradients from Gaussian shard surrogates "
                                     "(El Mekkaoui et al. 2021); alias 'fsgld'",
                           step=steps._dsgld, round_time=steps._visit_time,
                           auto_keys={"surrogate_step_size": steps.of_lambda_max(steps.surrogate_step)},
                           privacy="the shards' Gaussian surrogates are computed from the data without noise",
                           example=_SHARDS, problem=_BLOBS),
    "dg-sgld": Registered(dg_sgld, "distributed Gibbs SGLD (Plassier et al. 2021, DG-LMC with minibatches)",
                          step=steps._dg_sgld, round_time=steps._gibbs_time,
                          auto_keys={"rho": steps.of_lambda_max(steps.tolerance)},
                          privacy=_HIDDEN,
                          example={"rho": 0.5, "step_size": 1e-4, **_BATCH}),
    "consensus-mc": Registered(consensus_mc, "consensus Monte Carlo (Scott et al. 2016): precision-weighted "
                                             "averages of the sites' subposterior draws, one-shot",
                               step=_subposterior_step, privacy=_DRAWS, example=_ONE_SHOT),
    "gaussian-product": Registered(gaussian_product, "the Gaussian product of subposteriors (Neiswanger et al. "
                                                     "2014, parametric), one-shot",
                                   step=_subposterior_step, privacy=_DRAWS, example=_ONE_SHOT),
    "fedavg": Registered(fedavg, "FedAvg (McMahan et al. 2017), an optimiser baseline", step=steps._fedavg,
                         privacy="FedAvg adds no noise",
                         example={"step_size": 1e-3, "local_steps": 2, **_BATCH, **_Q, **_HALF}),
}

#: Other names of registered samplers.
ALIASES = {"qlsd": "qlsd#", "fsgld": "cg-dsgld"}

__all__ = ["REGISTRY", "ALIASES", "Registered", "Accounted", "NOT_ACCOUNTED", "qlsd", "qlsd_sharp", "qlsd_star",
           "lsd_star", "qlsd_pp", "lsd_pp", "sgld", "fa_hmc", "fa_ld", "dsgld", "cg_dsgld", "psgld", "dg_sgld",
           "fedavg", "vr_fald_star", "consensus_mc", "gaussian_product"]
