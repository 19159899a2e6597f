"""Federated samplers, one algorithm per module, and their registry under the papers' names.

:data:`REGISTRY` maps a sampler's paper name (the ``[sampler] name`` of a run config) to a
:class:`Registered`: its public builder, one line on what it is, and whether it runs on the
pooled data. The run config (:mod:`fedmcmc.app.config`) derives the keys a ``[sampler]``
section may and must set from the builders' signatures, and the conformance tests run every
registered sampler, so a new sampler is one module and one registry line (and one line of
:data:`fedmcmc.samplers.steps.RULES`, its step for ``step_size = "auto"``; a test checks that
every registered name has one).
"""

from typing import Callable, NamedTuple

from fedmcmc.core.base import FederatedSampler
from fedmcmc.samplers.dg_sgld import dg_sgld
from fedmcmc.samplers.dsgld import cg_dsgld, dsgld
from fedmcmc.samplers.fa_hmc import fa_hmc, fa_ld
from fedmcmc.samplers.fedavg import fedavg
from fedmcmc.samplers.psgld import psgld
from fedmcmc.samplers.qlsd import lsd_star, qlsd, qlsd_sharp, qlsd_star
from fedmcmc.samplers.qlsd_pp import lsd_pp, qlsd_pp
from fedmcmc.samplers.sgld import sgld


class Registered(NamedTuple):
    """A sampler under its paper name.

    Attributes
    ----------
    build
        The public builder (its keyword arguments are the sampler's settings).
    summary
        One line: the algorithm and its paper.
    pooled
        A centralised baseline: it runs on one client holding all the data
        (:meth:`fedmcmc.FederatedData.pooled`) and communicates nothing.
    """

    build: Callable[..., FederatedSampler]
    summary: str
    pooled: bool = False


REGISTRY: dict[str, Registered] = {
    "sgld": Registered(sgld, "SGLD on the pooled data (Welling and Teh 2011, baseline)", pooled=True),
    "psgld": Registered(psgld, "preconditioned SGLD on the pooled data (Li et al. 2016, baseline)", pooled=True),
    "qlsd#": Registered(qlsd_sharp, "QLSD with minibatch gradients (Vono et al. 2022, Alg. 1); alias 'qlsd'"),
    "qlsd*": Registered(qlsd_star, "QLSD with control variates at the mode (Vono et al. 2022)"),
    "lsd*": Registered(lsd_star, "QLSD* without compression (Vono et al. 2022)"),
    "qlsd++": Registered(qlsd_pp, "QLSD with SVRG control variates and memory terms (Vono et al. 2022, Alg. 2)"),
    "lsd++": Registered(lsd_pp, "QLSD++ without compression (Vono et al. 2022, Alg. S3)"),
    "fa-hmc": Registered(fa_hmc, "federated averaging of local SG-HMC (Liang et al. 2024, Alg. 3; "
                                 "debiased: Alg. B.2)"),
    "fa-ld": Registered(fa_ld, "federated averaging Langevin dynamics (Deng et al. 2021): FA-HMC with one "
                               "leapfrog step"),
    "dsgld": Registered(dsgld, "distributed SGLD (Ahn et al. 2014): a chain visits one shard at a time"),
    "cg-dsgld": Registered(cg_dsgld, "DSGLD with conducive gradients from Gaussian shard surrogates "
                                     "(El Mekkaoui et al. 2021); alias 'fsgld'"),
    "dg-sgld": Registered(dg_sgld, "distributed Gibbs SGLD (Plassier et al. 2021, DG-LMC with minibatches)"),
    "fedavg": Registered(fedavg, "FedAvg (McMahan et al. 2017), an optimiser baseline"),
}

#: Other names of registered samplers.
ALIASES = {"qlsd": "qlsd#", "fsgld": "cg-dsgld"}

__all__ = ["REGISTRY", "ALIASES", "Registered", "qlsd", "qlsd_sharp", "qlsd_star", "lsd_star", "qlsd_pp", "lsd_pp",
           "sgld", "fa_hmc", "fa_ld", "dsgld", "cg_dsgld", "psgld", "dg_sgld", "fedavg"]
