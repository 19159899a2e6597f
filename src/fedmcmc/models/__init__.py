"""Models (potentials): per-datum log-likelihoods and priors on flat parameter vectors."""

from fedmcmc.models.gaussian import (GaussianPosterior, gaussian_factors, gaussian_factors_posterior,
                                     gaussian_mean, gaussian_mean_posterior)
from fedmcmc.models.linear import LinearPosterior, linear_regression, linear_regression_posterior
from fedmcmc.models.logistic import logistic_regression

__all__ = ["GaussianPosterior", "gaussian_mean", "gaussian_mean_posterior", "gaussian_factors",
           "gaussian_factors_posterior", "logistic_regression", "linear_regression",
           "linear_regression_posterior", "LinearPosterior"]
