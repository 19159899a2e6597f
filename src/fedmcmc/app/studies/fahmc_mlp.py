"""FA-HMC and FA-LD training a two-hidden-layer ReLU network on Fashion-MNIST: predictive
metrics against communication rounds for the number of leapfrog steps K and of local steps T
(Liang, Zhang, Deng, Lin, Song 2024, Section 5.4, Figure 5).

"Other settings of the experiments are the same as the logistic regression experiments in
Section 5.3 except that only one chain is simulated in each case": 10 IID clients, minibatches
of 1,000, FA-HMC on the leapfrog clock (positions averaged every T leapfrog steps, momenta
redrawn every K steps from the shared seed, rho = 1), eta tuned per setting on a pilot, the BMA
of all draws so far scored on the test set after each round (accuracy, Brier score, ECE, and
NLL, which the paper does not plot). Everything but the model is :mod:`fahmc_logistic`'s
(:func:`fedmcmc.app.studies.fahmc_logistic.study`). Sweeps: K in {1, 10, 50, 100} at T = 50
(K = 1 is FA-LD), and T in {1, 10, 50} at K = 10.

**Network width.** The paper's footnote: "The widths of two layers are 512 times input
dimension and 512 times the number of classification labels respectively". We read these as
the shapes of two weight matrices, 784 x 512 and 512 x 10, so the paper's network has 512
hidden units next to the input and next to the output (784-512-512-10 for two hidden layers;
784-512-10 if the footnote's "two layers" are the two weight layers). That is d of about
670,000 (or 407,000); at two minibatch gradients per leapfrog step and up to 100 leapfrog
steps per round this does not fit our budget. The full setting is a 50-32-16-10 ReLU network
(d = 2,330) on the top 50 principal axes of the pixels, prior N(0, I), started at a He/Glorot
draw (:meth:`fedmcmc.models.layout.ParamLayout.init`, seed ``seed``), ``rounds`` = 25 rounds
and a two-value eta grid tuned on five-round pilots. ``--set hidden=512,512 --set
pca_components=0`` is the paper's size. ``--quick`` uses 10,000 training and 2,000 test
images on 20 principal axes, a 20-16-8-10 network, minibatches of 100 and eight rounds.
"""

from __future__ import annotations

import jax
import numpy as np

from fedmcmc.app.studies import fahmc_logistic
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import mlp, mlp_layout

NAME = "fahmc-mlp"
SUMMARY = ("FA-HMC vs FA-LD, two-hidden-layer ReLU MLP on Fashion-MNIST: accuracy, Brier, ECE of the BMA "
           "against rounds for K and T, leapfrog clock (FA-HMC Sec. 5.4, Fig. 5)")

FULL = dict(fahmc_logistic.FULL, hidden=[32, 16], activation="relu", leapfrog_sweep=[1, 10, 50, 100],
            sweep_local_steps=50, local_steps_sweep=[1, 10, 50], sweep_leapfrog=10, rounds=25, num_runs=1,
            step_sizes=[6e-4, 1.2e-3], pilot_rounds=5, pca_components=50)
QUICK = dict(FULL, train_subset=10000, test_subset=2000, pca_components=20, batch_size=100, hidden=[16, 8],
             step_sizes=[2e-3, 4e-3], rounds=8, pilot_rounds=3, accuracy_targets=[0.7, 0.75])


def science(cfg: dict, run: Run) -> Findings:
    hidden = tuple(int(h) for h in cfg["hidden"])
    if len(hidden) != 2:
        raise ValueError(f"hidden must give two layer widths, e.g. --set hidden=32,16 (got {cfg['hidden']!r})")

    def make_model(num_features, num_classes):
        return mlp(num_features, hidden, num_classes, cfg["activation"], cfg["prior_scale"])

    def initial(num_features, num_classes):
        layout = mlp_layout(num_features, hidden, num_classes, cfg["activation"])
        return np.asarray(layout.init(jax.random.PRNGKey(cfg["seed"])))

    return fahmc_logistic.study(cfg, run, f"{'-'.join(map(str, hidden))} ReLU MLP", make_model, initial)
