"""What users compute from samples: predictions, classification and calibration metrics, HPD regions,
distances, diagnostics and reference samples.

The modules, by concern: :mod:`~fedmcmc.evaluation.predict` (per-draw predictions, the model
average, potentials), :mod:`~fedmcmc.evaluation.classification` (accuracy, NLL, Brier, entropy,
AUROC, agreement with a reference), :mod:`~fedmcmc.evaluation.calibration` (reliability
diagrams, ECE), :mod:`~fedmcmc.evaluation.regression` (a regression's posterior predictive interval, RMSE,
coverage), :mod:`~fedmcmc.evaluation.report` (the metrics gathered for ``results.json``, per client),
:mod:`~fedmcmc.evaluation.hpd` (HPD thresholds and intervals),
:mod:`~fedmcmc.evaluation.distances` (Wasserstein distances, rounds to a precision, bits saved),
:mod:`~fedmcmc.evaluation.diagnostics` (R-hat, ESS, their warnings, trace and rank plots),
:mod:`~fedmcmc.evaluation.posterior_check` (draws against the Laplace approximation at the mode), :mod:`~fedmcmc.evaluation.reference`
(cached NUTS and MALA references) and :mod:`~fedmcmc.evaluation.laws` (exact laws of
discretised chains on Gaussian targets, the oracles of the statistical tests). This face
gathers the functions users call.
"""

from fedmcmc.evaluation.calibration import Reliability, accuracy_vs_threshold, ece, plot_reliability, reliability
from fedmcmc.evaluation.classification import accuracy, agreement, auroc, brier, entropy, nll, total_variation
from fedmcmc.evaluation.diagnostics import convergence, ess, plot_rank, plot_trace, rhat
from fedmcmc.evaluation.distances import (marginal_error, relative_efficiency, rounds_to_reach, w2_gaussian,
                                          w2_to_gaussian, wasserstein1)
from fedmcmc.evaluation.hpd import hpd_interval, hpd_relative_error, hpd_threshold, marginal_hpd_relative_error
from fedmcmc.evaluation.predict import (bayes_average, neg_log_posterior, pointwise_log_likelihood, predict_bma,
                                       predict_draws)
from fedmcmc.evaluation.reference import ReferenceSamples, mala, nuts
from fedmcmc.evaluation.regression import RegressionPredictive, predictive_interval, regression_report, rmse
from fedmcmc.evaluation.report import by_client, classification_report

__all__ = [
    "predict_draws", "predict_bma", "bayes_average", "neg_log_posterior", "pointwise_log_likelihood",
    "accuracy", "nll", "brier", "entropy", "auroc", "agreement", "total_variation",
    "Reliability", "reliability", "ece", "accuracy_vs_threshold", "plot_reliability", "classification_report",
    "by_client", "RegressionPredictive", "predictive_interval", "regression_report", "rmse",
    "hpd_threshold", "hpd_relative_error", "hpd_interval", "marginal_hpd_relative_error",
    "wasserstein1", "marginal_error", "w2_gaussian", "w2_to_gaussian", "rounds_to_reach", "relative_efficiency",
    "rhat", "ess", "convergence", "plot_trace", "plot_rank", "nuts", "mala", "ReferenceSamples",
]
