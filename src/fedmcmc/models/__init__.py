"""Models (potentials): per-datum log-likelihoods and priors on flat parameter vectors."""

from fedmcmc.models.gaussian import GaussianPosterior, gaussian_mean, gaussian_mean_posterior

__all__ = ["GaussianPosterior", "gaussian_mean", "gaussian_mean_posterior"]
