"""Differential privacy of the released draws: accounting (epsilon, delta) of a Langevin run.

* :mod:`fedmcmc.privacy.accountant` -- :class:`GaussianRounds` (a composition of (subsampled)
  Gaussian mechanisms) and :func:`epsilon` / :func:`smallest_noise`, with ``dp-accounting``'s
  RDP or PLD accountant.
* :mod:`fedmcmc.privacy.mechanisms` -- the mapping from a sampler's settings to its rounds'
  mechanisms, one function per mechanism (:data:`~fedmcmc.privacy.mechanisms.MECHANISMS`, with the
  derivations), which a sampler's registry entry names (:func:`~fedmcmc.privacy.mechanisms.mapping`);
  :func:`account` gives client- and record-level (epsilon, delta), or the reason why not;
  :func:`~fedmcmc.privacy.mechanisms.against_clients` the client level against a client that sees participation.

The clipping that bounds the sensitivities lives where it acts:
:func:`fedmcmc.compression.clipped` (a client's decoded upload) and
:func:`fedmcmc.models.clipped_gradients` (one record's gradient).
"""

from fedmcmc.privacy.accountant import ACCOUNTANTS, GaussianRounds, epsilon, smallest_noise
from fedmcmc.privacy.mechanisms import LEVELS, MECHANISMS, Setting, account, mapping

__all__ = ["ACCOUNTANTS", "GaussianRounds", "epsilon", "smallest_noise", "LEVELS", "MECHANISMS", "Setting", "account",
           "mapping"]
