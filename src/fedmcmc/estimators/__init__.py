"""Gradient estimators of a client's potential, and the Gaussian surrogates of its density.

* :mod:`~fedmcmc.estimators.gradients` -- oracles ``oracle(key, theta, client_data)``:
  :func:`minibatch_gradient`, :func:`control_variate_gradient` (QLSD*); a
  :class:`GradientEstimator` ``(init, estimate)`` carries a per-client state, and
  :func:`stateless` makes one of an oracle; :func:`find_mode` runs federated gradient descent.
* :mod:`~fedmcmc.estimators.svrg` -- the SVRG estimator of QLSD++ (:func:`svrg`).
* :mod:`~fedmcmc.estimators.surrogates` -- Gaussian surrogates of a client's density for
  CG-DSGLD: :func:`taylor`, :func:`laplace`, :func:`sgld_moments`.
"""

from fedmcmc.estimators.gradients import (GradientEstimator, control_variate_gradient, find_mode, minibatch_gradient,
                                          stateless)
from fedmcmc.estimators.surrogates import laplace, sgld_moments, taylor
from fedmcmc.estimators.svrg import svrg

__all__ = ["GradientEstimator", "stateless", "minibatch_gradient", "control_variate_gradient", "find_mode", "svrg",
           "taylor", "laplace", "sgld_moments"]
