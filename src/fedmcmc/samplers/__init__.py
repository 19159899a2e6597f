"""Federated samplers, one algorithm per module."""

from fedmcmc.samplers.dg_sgld import dg_sgld
from fedmcmc.samplers.dsgld import cg_dsgld, dsgld
from fedmcmc.samplers.fa_hmc import fa_hmc, fa_ld
from fedmcmc.samplers.fedavg import fedavg
from fedmcmc.samplers.psgld import psgld
from fedmcmc.samplers.qlsd import lsd_star, qlsd, qlsd_sharp, qlsd_star
from fedmcmc.samplers.qlsd_pp import lsd_pp, qlsd_pp
from fedmcmc.samplers.sgld import sgld

__all__ = ["qlsd", "qlsd_sharp", "qlsd_star", "lsd_star", "qlsd_pp", "lsd_pp", "sgld", "fa_hmc", "fa_ld", "dsgld", "cg_dsgld", "psgld",
           "dg_sgld", "fedavg"]
