"""Models (potentials): per-datum log-likelihoods and priors on flat parameter vectors."""

from fedmcmc.models.gaussian import (GaussianPosterior, gaussian_factors, gaussian_factors_posterior,
                                     gaussian_mean, gaussian_mean_posterior)
from fedmcmc.models.clipped import clipped_gradients
from fedmcmc.models.intercept import with_intercept
from fedmcmc.models.layout import ParamLayout, initial_position
from fedmcmc.models.lenet import lenet5, lenet5_layout
from fedmcmc.models.linear import (LinearPosterior, linear_regression, linear_regression_posterior,
                                   linear_regression_unknown_noise)
from fedmcmc.models.logistic import logistic_regression
from fedmcmc.models.mlp import mlp, mlp_layout
from fedmcmc.models.softmax import multinomial_layout, multinomial_logistic_regression
from fedmcmc.models.target import with_target_scaling
from fedmcmc.models.tempered import tempered
from fedmcmc.models.whitened import Whitening, whitened, whitening

__all__ = ["GaussianPosterior", "gaussian_mean", "gaussian_mean_posterior", "gaussian_factors",
           "gaussian_factors_posterior", "logistic_regression", "linear_regression",
           "linear_regression_posterior", "linear_regression_unknown_noise", "LinearPosterior",
           "multinomial_logistic_regression", "multinomial_layout", "mlp", "mlp_layout", "lenet5", "lenet5_layout",
           "tempered", "with_intercept", "with_target_scaling", "clipped_gradients",
           "whitened", "whitening", "Whitening",
           "ParamLayout", "initial_position"]
