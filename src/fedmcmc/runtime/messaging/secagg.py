"""Secure aggregation of integer uploads: the server learns only the sum of the active clients'.

The pairwise-masking protocol of Bonawitz et al. (CCS 2017), on the int32 grid integers of
:func:`fedmcmc.compression.fixed_point` (docs/privacy.md, "Secure aggregation"):

* **Keys, once per run** (every client): client ``i`` makes an X25519 key pair and sends its
  public key; the server relays all public keys; every pair ``(i, j)`` agrees on a secret
  ``s_ij = HKDF-SHA256(X25519(i, j), info = context | min(i, j) | max(i, j))``
  (:func:`pair_secret`). The server never holds a private key or a pair secret. Optionally
  (node config ``secagg-signing-key`` and ``secagg-verify-keys``) each client signs its public
  key, bound to the run and its index (:func:`advert`), with its SuperNode's authentication key
  (:func:`sign`), and every client checks all of them against the keys it was given
  (:func:`verify`), so a server that swaps the keys it relays (a man in the middle) is refused.
* **Each round ``k``, each chain ``c``**, with ``A`` the chain's active clients: client ``i``
  uploads ``y_i = q_i + r_i + sum_{j in A, j != i} sign(j - i) m_ij  (mod 2^32)``, where
  ``m_ij = SHAKE-256(t_ij)`` expanded to ``d`` words and ``t_ij = SHA-256(s_ij | k | c)`` is the
  pair's seed of that round and chain (:func:`round_seed`), and ``r_i = SHAKE-256(b_i)`` is the
  client's **self-mask**, from its own seed ``b_i = SHA-256("self" | x_i | k | c)`` (``x_i`` its
  private key; :func:`self_seed`): Bonawitz's double masking. The pairwise masks cancel in
  ``sum_{i in A} y_i``.
* **Unmasking, every round** (one more exchange): the server tells each surviving client ``j``
  (one whose masked upload it holds) the chain's dropped clients ``D``; ``j`` reveals its own
  ``b_j`` and its ``t_ju`` for each ``u`` in ``D``, and the server removes the survivors'
  self-masks and the dropped clients' pairwise masks (:func:`unmask`): the result is
  ``sum_{i in A \\ D} q_i``, the int32 sum itself while ``|A| B < 2^31``. A revealed seed opens
  that round and chain only (SHA-256 is one-way): no secret is shared out (Bonawitz's Shamir
  shares of a long-term key) and none needs replacing.
* **Never both for one client** (:func:`check_reveal`, every client's rule): a client declared
  dropped does not reveal its self seed (its peers reveal their seeds with it), and a client
  answers once per round and chain, for one dropped set whatever its keys. So the masked upload
  of a client declared dropped, arriving late or withheld, stays hidden behind its self-mask: the
  server holds its pairwise seeds and never its ``b_u``.
* **No sum of fewer than ``MIN_CLIENTS``** (:func:`check_mask`, :func:`check_reveal`): a client
  masks a round and chain for one active set only, of at least ``[flower] secure_min_clients``
  (default and least 2) clients, and reveals only while that many of them survive; the server
  applies no client of a chain with fewer survivors. A replayed upload (another round's or
  chain's) was masked with that round's seeds and unmasks to words the server's range check
  (``|S_j| <= n B`` for ``n`` survivors) rejects with overwhelming probability. Left open: a server that tells ``u`` another dropped set than its
  peers (``u`` not dropped, the peers ``u`` dropped) gets both; Bonawitz's consistency round
  (signed survivor sets) and self seeds revealed through Shamir shares held by the peers close
  it, at two more exchanges per round.

Every function here is pure, on bytes and NumPy arrays.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedmcmc.runtime.settings import MIN_SECURE_CLIENTS

#: Bytes of a public key, a private key, a pair secret and a round seed.
KEY_BYTES = 32


def keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair, ``(private, public)``, 32 raw bytes each."""
    private = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    return (private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
            private.public_key().public_bytes(raw, serialization.PublicFormat.Raw))


def pair_secret(private: bytes, own: int, peer: int, peer_public: bytes, context: bytes) -> bytes:
    """The secret client ``own`` shares with client ``peer`` (the same bytes on both sides)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    lo, hi = sorted((int(own), int(peer)))
    info = b"fedmcmc-secagg|" + context + struct.pack("<II", lo, hi)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def round_seed(secret: bytes, k: int, chain: int) -> bytes:
    """The pair's seed of round ``k`` and chain ``chain`` (what a survivor reveals for a dropout)."""
    return hashlib.sha256(secret + struct.pack("<QI", int(k), int(chain))).digest()


def self_seed(private: bytes, k: int, chain: int) -> bytes:
    """The client's own seed of round ``k`` and chain ``chain``, for its self-mask (one-way in its
    private key, so revealing it opens that round and chain only)."""
    return hashlib.sha256(b"fedmcmc-secagg-self|" + private + struct.pack("<QI", int(k), int(chain))).digest()


#: Rounds back that a client remembers the active sets it masked for and the dropped sets it
#: answered (:func:`check_mask`, :func:`check_reveal`).
MEMORY = 64
#: The fewest clients whose sum a round may reveal (``[flower] secure_min_clients``, at least this).
MIN_CLIENTS = MIN_SECURE_CLIENTS


def _remember(record: list, k: int, entry: list) -> list:
    """``record`` with ``entry`` (of round ``k``), rounds more than ``MEMORY`` back forgotten."""
    newest = max([int(a[0]) for a in record] + [int(k)])
    return [a for a in record if int(a[0]) >= newest - MEMORY] + [entry]


def _recent(record: list, k: int) -> None:
    newest = max([int(a[0]) for a in record], default=int(k))
    if int(k) < newest - MEMORY:
        raise ValueError(f"round {k} is older than the rounds this client remembers")


def check_mask(masked: list, k: int, chain: int, active, minimum: int = MIN_CLIENTS) -> list:
    """A client's rule before masking its upload of round ``k`` and chain ``chain`` for the active
    clients ``active``: at least ``minimum`` of them, and one active set per round and chain (a
    server that runs a round again for another set, such as the client alone, is refused).

    Parameters
    ----------
    masked
        ``[[k, chain, sorted active], ...]``: what the client masked for, the last ``MEMORY`` rounds.

    Returns
    -------
    list
        ``masked`` with this round and chain (older rounds forgotten).

    Raises
    ------
    ValueError
        The request breaks the rule, or its round is older than the client remembers.
    """
    active = sorted(int(j) for j in active)
    if len(active) < int(minimum):
        raise ValueError(f"round {k}, chain {chain} has {len(active)} active client(s), fewer than the "
                         f"{minimum} whose sum may be revealed")
    _recent(masked, k)
    for a_k, a_c, a_a in masked:
        if (int(a_k), int(a_c)) == (int(k), int(chain)):
            if list(a_a) != active:
                raise ValueError(f"round {k}, chain {chain} was masked for the active clients {list(a_a)}, "
                                 f"now asked for {active}")
            return masked
    return _remember(masked, k, [int(k), int(chain), active])


def check_reveal(answered: list, k: int, chain: int, own: int, dropped, masked: list, keys: str = "",
                 minimum: int = MIN_CLIENTS) -> list:
    """A client's rule before revealing its seeds of round ``k`` and chain ``chain`` for the
    dropped clients ``dropped``: only for a round and chain it masked, never its self seed while it
    is declared dropped, never for fewer than ``minimum`` survivors (the sum of one client is its
    upload), once per round and chain under one key pair, and for one dropped set per round and
    chain whatever the keys (so no client's self seed and pairwise seeds are both revealed, and a
    server that exchanges keys again cannot open another sum of the same round).

    Parameters
    ----------
    answered
        ``[[k, chain, sorted dropped, keys], ...]``: what the client answered, the last ``MEMORY`` rounds.
    masked
        What the client masked for (:func:`check_mask`).
    keys
        A tag of the client's current key pair.

    Returns
    -------
    list
        ``answered`` with this request (older rounds forgotten).

    Raises
    ------
    ValueError
        The request breaks the rule, or its round is older than the client remembers.
    """
    dropped = sorted(int(u) for u in dropped)
    if int(own) in dropped:
        raise ValueError(f"declared dropped in round {k}, chain {chain}: its self seed stays secret")
    _recent(answered, k)
    for a_k, a_c, a_d, a_keys in answered:
        if (int(a_k), int(a_c)) == (int(k), int(chain)) and (a_keys == keys or list(a_d) != dropped):
            raise ValueError(f"round {k}, chain {chain} was already answered for the dropped clients {list(a_d)}, "
                             f"now asked for {dropped}")
    active = next((list(a) for a_k, a_c, a in masked if (int(a_k), int(a_c)) == (int(k), int(chain))), None)
    if active is None:
        raise ValueError(f"round {k}, chain {chain} was not masked by this client: nothing to reveal")
    survivors = set(active) - set(dropped)
    if len(survivors) < int(minimum) or not set(dropped) <= set(active):
        raise ValueError(f"round {k}, chain {chain}: {len(survivors)} of the active clients {active} survive "
                         f"(dropped {dropped}), fewer than the {minimum} whose sum may be revealed")
    return _remember(answered, k, [int(k), int(chain), dropped, keys])


def mask(seed: bytes, size: int) -> np.ndarray:
    """``size`` uint32 words from a seed (SHAKE-256, little-endian)."""
    return np.frombuffer(hashlib.shake_256(seed).digest(4 * size), "<u4").astype(np.uint32)


def _sign(i: int, j: int) -> int:
    return 1 if j > i else -1


def masked(values: np.ndarray, own: int, active, seeds: dict[int, bytes], own_seed: bytes) -> np.ndarray:
    """Client ``own``'s upload ``y = q + r_own + sum_j sign(j - own) m_own,j (mod 2^32)`` (uint32).

    Parameters
    ----------
    values
        int32 ``q`` (any shape; flattened).
    own
        The client's index.
    active
        The chain's active clients (``own`` among them).
    seeds
        ``{j: t_own,j}`` of this round and chain for every other active ``j``.
    own_seed
        ``b_own`` of this round and chain (:func:`self_seed`).
    """
    y = np.asarray(values, np.int32).reshape(-1).view(np.uint32) + mask(own_seed, np.size(values))
    for j in active:
        if j != own:
            m = mask(seeds[j], y.size)
            y = y + m if _sign(own, j) > 0 else y - m
    return y


def unmask(uploads: dict[int, np.ndarray], dropped, revealed: dict[tuple[int, int], bytes],
           own_seeds: dict[int, bytes]) -> np.ndarray:
    """``sum_{j in survivors} q_j`` (int32) from the survivors' uploads ``{j: y_j}``, their self
    seeds ``own_seeds[j] = b_j`` and, for every survivor ``j`` and dropped client ``u``, the
    revealed seed ``revealed[(j, u)] = t_ju``.

    Raises
    ------
    KeyError
        A survivor's self seed, or its seed with a dropped client, is missing.
    """
    total = np.zeros_like(next(iter(uploads.values())), dtype=np.uint32)
    for j, y in uploads.items():
        total = total + np.asarray(y, np.uint32) - mask(own_seeds[j], total.size)
    for j in uploads:
        for u in dropped:
            m = mask(revealed[(j, u)], total.size)
            total = total - m if _sign(j, u) > 0 else total + m
    return total.view(np.int32)


def advert(public: bytes, index: int, context: bytes) -> bytes:
    """What client ``index`` signs of its public key: the key, bound to the run (``context``) and its index."""
    return b"fedmcmc-secagg-key|" + context + struct.pack("<I", int(index)) + public


def sign(private_openssh: bytes, message: bytes) -> bytes:
    """``message`` signed with an OpenSSH private key (a SuperNode's authentication key: ECDSA
    with SHA-256, or Ed25519)."""
    key = serialization.load_ssh_private_key(private_openssh, password=None)
    return key.sign(message, ec.ECDSA(hashes.SHA256())) if isinstance(key, ec.EllipticCurvePrivateKey) \
        else key.sign(message)


def verify(public_openssh: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``message`` signed by the key of ``public_openssh`` (one OpenSSH line)."""
    key = serialization.load_ssh_public_key(public_openssh)
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, message)
    except InvalidSignature:
        return False
    return True
