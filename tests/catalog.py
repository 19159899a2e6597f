"""Every registered sampler and every surrogate kind, built on a real data set.

Used by the long-lived-process test (``test_no_hang``) and the runtime-equality tests: one
place that knows how to build each sampler of ``fedmcmc.samplers.REGISTRY`` on scikit-learn's
breast-cancer data (569 patients, 30 features, split over 10 clients by a Dirichlet(0.5)
label partition), with small settings so that each one compiles and runs in about a second.
"""

from __future__ import annotations

import numpy as np

from fedmcmc.estimators import gradients, surrogates
from fedmcmc.compression import identity, quantization
from fedmcmc.data import partition
from fedmcmc.models import logistic_regression
from fedmcmc.samplers.participation import bernoulli
from fedmcmc.samplers import (cg_dsgld, dg_sgld, dsgld, fa_hmc, fa_ld, fedavg, lsd_pp, lsd_star, psgld, qlsd_pp,
                              qlsd_sharp, qlsd_star, sgld)

SURROGATES = [(kind, cov) for kind in ("taylor", "laplace", "sgld_moments") for cov in ("diag", "full")]


def breast_cancer(num_clients: int = 10):
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    x = np.hstack([np.ones((len(x), 1)), x]).astype(np.float32)
    parts = partition.dirichlet(0, y, num_clients, 0.5, min_size=5)
    data = partition.federate(x, y.astype(np.float32), parts)
    return data, logistic_regression(x.shape[1])


def surrogate(kind: str, covariance: str):
    if kind == "sgld_moments":
        return surrogates.sgld_moments(1e-3, 200, 50, covariance)
    return getattr(surrogates, kind)(covariance)


#: The catalog's names, known without building anything (``samplers`` builds them).
NAMES = ["sgld", "psgld", "qlsd#", "qlsd*", "lsd*", "qlsd++", "lsd++", "fa-hmc", "fa-ld", "dsgld", "dg-sgld",
         "fedavg"] + [f"cg-dsgld-{kind}-{cov}" for kind, cov in SURROGATES]


def samplers(data, model, mode=None) -> dict:
    """``name -> (sampler, data)`` for every registered sampler and every CG-DSGLD surrogate."""
    mode = gradients.find_mode(model, data) if mode is None else mode
    batch = np.maximum(np.asarray(data.counts) // 5, 1)
    step = 1e-4
    q = quantization(16)
    part = bernoulli(0.5)
    f = np.asarray(data.weights)
    pooled = data.pooled()
    out = {
        "sgld": (sgld(model, step, 32), pooled),
        "psgld": (psgld(model, step, 32), pooled),
        "qlsd#": (qlsd_sharp(model, step, batch, q, part), data),
        "qlsd*": (qlsd_star(model, step, mode, batch, q), data),
        "lsd*": (lsd_star(model, step, mode, batch), data),
        "qlsd++": (qlsd_pp(model, step, batch, q, part, refresh_every=3), data),
        "lsd++": (lsd_pp(model, step, batch, refresh_every=3), data),
        "fa-hmc": (fa_hmc(model, f, 1e-2, 3, 2, batch_size=batch), data),
        "fa-ld": (fa_ld(model, f, 1e-2, 3, batch_size=batch, compressor=identity()), data),
        "dsgld": (dsgld(model, f, step, 10, batch_size=8, record_every=5), data),
        "dg-sgld": (dg_sgld(model, 0.5, step, batch_size=batch, num_clients=data.num_clients), data),
        "fedavg": (fedavg(model, f, 1e-3, 2, batch, q, part), data),
    }
    for kind, cov in SURROGATES:
        out[f"cg-dsgld-{kind}-{cov}"] = (cg_dsgld(model, f, step, 10, surrogate=surrogate(kind, cov), batch_size=8,
                                                  record_every=5), data)
    assert list(out) == NAMES
    return out
