"""pSGLD: preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson and Carin,
AAAI 2016, Algorithm 1), the centralised adaptive baseline.

All data sit in one place (run it on ``data.pooled()``, one "client" holding ``N`` points).
With ``U = U_0 + sum_j U_j`` the posterior potential (``U_0 = -log prior``, ``U_j`` the
negative log-likelihood of point ``j``), each iteration ``k`` draws a minibatch ``S_k`` of
``n`` points (all of them if ``batch_size`` is None) and sets

    g_k     = (1 / n) sum_{j in S_k} grad U_j(theta_k)             (mean per-point gradient)
    V_k     = beta V_{k-1} + (1 - beta) g_k * g_k                  (coordinatewise)
    G_k     = diag(1 / (lambda + sqrt(V_k)))
    theta_{k+1} = theta_k - (eps_k / 2) G_k [ grad U_0(theta_k) + N g_k ] + sqrt(eps_k G_k) Z_{k+1},

``Z ~ N(0, I)``. This is the paper's update (written there with ``log p``, so with the opposite
sign of the gradient): ``beta`` is its ``alpha`` (0.99), ``lambda`` its ``lambda`` (1e-5), and
``g_k`` its ``g_bar``, the *mean* per-point likelihood gradient (the prior is not in ``V``).
``V`` is updated with the current gradient before ``G`` is used, as in Algorithm 1.

Conventions to keep in mind:

* ``step_size`` is the paper's ``eps``: the drift is ``eps / 2`` and the noise variance ``eps``.
  With ``G = I`` this is :func:`fedmcmc.samplers.sgld` with ``step_size = eps / 2``.
* **The correction term is dropped.** The paper's update also has ``(eps / 2) Gamma(theta)``,
  ``Gamma_i = sum_j dG_ij / dtheta_j``, which is what makes a position-dependent preconditioner
  leave the posterior invariant. The paper states it but recommends dropping it in practice
  (it needs derivatives of ``G``), arguing that the resulting bias is small when ``beta`` is
  close to 1; the authors' public code (``SGLD_RMSprop.m``) has no such term, while TFP's
  ``StochasticGradientLangevinDynamics`` keeps it. We drop it: the chain
  is then a heuristic, not a sampler with the posterior as its stationary law, except with
  ``beta = 1``, where ``G`` is a constant and the chain is preconditioned ULA (biased only by
  the discretisation, like SGLD).
* ``V_0``: Algorithm 1 starts from ``V_0 = 0`` (``v0=None``). Any ``v0 >= 0`` can be given,
  one value or one per coordinate; ``beta = 1`` freezes ``V`` at ``v0``, which must then be given.
  (The authors' code starts ``V`` at the first squared gradient instead.)

Nothing is communicated: bits are zero. It shares the federated contract so the same
runtime, outputs and tests apply.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model
from fedmcmc.samplers.integrators import preconditioned_langevin_step, step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo


class PSGLDState(NamedTuple):
    """Server state: the current sample ``position`` and the RMSprop average ``v`` (``[d]``)."""

    position: Any
    v: Any


class PSGLDUpload(NamedTuple):
    """The data holder's message: the minibatch estimate of ``sum_j grad U_j(theta)`` and its
    number of points ``N`` (so that the server forms ``g = grad / N``)."""

    grad: Any
    count: Any


def psgld(model: Model, step_size, batch_size=None, beta: float = 0.99, lam: float = 1e-5, v0=None,
          name: str = "psgld") -> FederatedSampler:
    """Build centralised pSGLD (see the module docstring); run it on one client holding all the data.

    Parameters
    ----------
    model
        The model; its prior enters the drift, not the preconditioner.
    step_size
        ``eps > 0`` (drift ``eps / 2``, noise variance ``eps``), or a schedule ``k -> eps_k``.
    batch_size
        Minibatch size ``n``; the full data if None.
    beta
        The RMSprop decay in ``[0, 1]`` (the paper's ``alpha``, 0.99). ``1`` freezes ``V`` at ``v0``.
    lam
        ``lambda > 0``, added to ``sqrt(V)`` so that ``G`` stays bounded (1e-5 in the paper).
    v0
        Initial ``V`` (``>= 0``; one value or one per coordinate); zero if None (the paper).
    """
    step_size = checks.step_size(step_size)
    beta = checks.unit_interval("beta", beta, "; the paper uses 0.99")
    lam = checks.positive("lam", lam, "; the paper uses 1e-5")
    if v0 is None:
        if beta == 1.0:
            raise ValueError("beta = 1 freezes the preconditioner at its initial value: give v0 "
                             "(V_0 >= 0, one value or one per coordinate)")
        v0_np = np.zeros((), np.float32)
    else:
        v0_np = np.asarray(v0, dtype=np.float64)
        if v0_np.ndim > 1 or not np.all(np.isfinite(v0_np)) or np.any(v0_np < 0):
            raise ValueError(f"v0 must be >= 0, one value or one per coordinate (got {v0!r})")
        if v0_np.ndim == 1 and v0_np.size not in (1, model.dim):
            raise ValueError(f"v0 has {v0_np.size} entries but the model has dimension {model.dim}")
        v0_np = v0_np.astype(np.float32)
    oracle = gradients.minibatch_gradient(model, batch_size)
    beta32, lam32 = np.float32(beta), np.float32(lam)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        v = jnp.broadcast_to(jnp.asarray(v0_np), theta0.shape).astype(jnp.float32)
        return PSGLDState(theta0, v), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key, broadcast, client_data
        return ()

    def client_step(key, client_state, broadcast, client_data, k):
        del k
        grad = oracle(key, broadcast.position, client_data)
        upload = PSGLDUpload(grad, client_data.count.astype(jnp.float32))
        return client_state, upload, ClientInfo(bits=jnp.zeros((), jnp.int32))

    def server_step(key, server_state, uploads, mask, k):
        eps = step_size_at(step_size, k)
        m = mask.astype(jnp.float32)
        grad = jnp.tensordot(m, uploads.grad, axes=1)  # estimate of sum_j grad U_j
        count = jnp.maximum(jnp.sum(m * uploads.count), 1.0)
        g_bar = grad / count
        v = beta32 * server_state.v + (1.0 - beta32) * g_bar * g_bar
        precond = 1.0 / (lam32 + jnp.sqrt(v))
        theta = server_state.position
        position = preconditioned_langevin_step(key, theta, grad - jax.grad(model.log_prior)(theta), 0.5 * eps,
                                                precond)
        return (PSGLDState(position, v), Broadcast(position),
                ServerInfo(step_size=eps, broadcast_bits=jnp.zeros((), jnp.int32)))

    return FederatedSampler(init, client_init, client_step, server_step, participation_lib.full(), name)
