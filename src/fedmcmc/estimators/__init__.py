"""Gradient estimators of a client's potential, the wrappers that make new ones from them, and
the Gaussian surrogates of its density.

* :mod:`~fedmcmc.estimators.gradients` -- oracles ``oracle(key, theta, client_data)``:
  :func:`minibatch_gradient`, :func:`control_variate_gradient` (QLSD*); a
  :class:`GradientEstimator` ``(init, estimate)`` carries a per-client state, and
  :func:`stateless` makes one of an oracle; :func:`find_mode` finds the federated mode by Newton's
  or L-BFGS rounds.
* :mod:`~fedmcmc.estimators.federation` -- the clients as the server's estimators reach them:
  named computations on each client's rows (``federation.Local`` in the simulator, the nodes over Flower).
* :mod:`~fedmcmc.estimators.svrg` -- the SVRG estimator of QLSD++ (``svrg.svrg``).
* :mod:`~fedmcmc.estimators.stochastic` -- a client's gradient bound to its data
  (:class:`StochasticGradient`) and the :func:`gaussian_noise` wrapper (FA-HMC's noisy gradients).
* :mod:`~fedmcmc.estimators.scaffold` -- SCAFFOLD control variates ``g - h_c + h``
  (``scaffold.scaffold()``; de-biased FA-HMC, and FedAvg's ``control_variates``).
* :mod:`~fedmcmc.estimators.conducive` -- conducive gradients of CG-DSGLD (``conducive.conducive``).
* :mod:`~fedmcmc.estimators.surrogates` -- Gaussian surrogates of a client's density for
  CG-DSGLD: :func:`taylor`, :func:`laplace`, :func:`sgld_moments`.
* :mod:`~fedmcmc.estimators.curvature` -- the extreme eigenvalues of the potential's Hessian at
  the mode, from one round of the clients' Hessians or by federated power iteration
  (``curvature.curvature``; ``step_size = "auto"``).
* :mod:`~fedmcmc.estimators.approximation` -- the Laplace approximation at the federated mode, each
  client's Hessian uploaded once (``approximation.laplace_approximation``; the posterior check and
  the chains' dispersed starts).

The wrappers and the curvature live in the submodules of their name (``svrg``, ``scaffold``,
``conducive``, ``curvature``), which
this face does not shadow with their functions.
"""

from fedmcmc.estimators.gradients import (GradientEstimator, control_variate_gradient, find_mode, minibatch_gradient,
                                          stateless)
from fedmcmc.estimators.stochastic import StochasticGradient, gaussian_noise
from fedmcmc.estimators.surrogates import laplace, sgld_moments, taylor

__all__ = ["GradientEstimator", "stateless", "minibatch_gradient", "control_variate_gradient", "find_mode",
           "StochasticGradient", "gaussian_noise", "taylor", "laplace", "sgld_moments"]
