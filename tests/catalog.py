"""Every registered sampler and every surrogate kind, built on a real data set.

Used by the long-lived-process test (``test_no_hang``), the conformance tests and the
runtime-equality tests: every sampler of ``fedmcmc.samplers.REGISTRY``, built from its entry's
example settings (:func:`fedmcmc.app.config.example`) on scikit-learn's breast-cancer data
(569 patients, 30 features, split over 10 clients by a Dirichlet(0.5) label partition), so that
each one compiles and runs in about a second; a sampler that takes a ``surrogate`` once per
surrogate kind and covariance.
"""

from __future__ import annotations

import numpy as np

from fedmcmc.app import config
from fedmcmc.data import partition
from fedmcmc.estimators import gradients
from fedmcmc.models import logistic_regression
from fedmcmc.samplers import REGISTRY

SURROGATES = [(kind, cov) for kind in ("taylor", "laplace", "sgld_moments") for cov in ("diag", "full")]
#: ``[sampler]`` keys of each surrogate kind (``sgld_moments``: SGLD's moments, ``surrogate = "sgld"``).
_SURROGATE_KEYS = {"taylor": {"surrogate": "taylor"}, "laplace": {"surrogate": "laplace"},
                   "sgld_moments": {"surrogate": "sgld", "surrogate_step_size": 1e-3, "surrogate_steps": 200,
                                    "surrogate_burn_in": 50}}


def breast_cancer(num_clients: int = 10):
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    x = np.hstack([np.ones((len(x), 1)), x]).astype(np.float32)
    parts = partition.dirichlet(0, y, num_clients, 0.5, min_size=5)
    data = partition.federate(x, y.astype(np.float32), parts)
    return data, logistic_regression(x.shape[1])


def _variants() -> dict:
    """``catalogue name -> (registered name, extra [sampler] keys)``."""
    out = {}
    for name in REGISTRY:
        if "surrogate" in config.sampler_keys(name):
            out.update({f"{name}-{kind}-{cov}": (name, {**_SURROGATE_KEYS[kind], "surrogate_covariance": cov})
                        for kind, cov in SURROGATES})
        else:
            out[name] = (name, {})
    return out


#: The catalog's names, known without building anything (``samplers`` builds them).
NAMES = list(_variants())


def samplers(data, model, mode=None) -> dict:
    """``name -> (sampler, data)`` for every registered sampler and every CG-DSGLD surrogate (the
    data pooled for a pooled sampler)."""
    mode = gradients.find_mode(model, data) if mode is None else mode
    out = {}
    for key, (name, keys) in _variants().items():
        built = config.build_run(config.example(name, **keys), data, model, mode=mode)
        out[key] = (built.sampler, built.data)
    return out
