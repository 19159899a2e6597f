"""The server of a run without Flower: the server loop over a transport that reaches the clients.

:class:`ServerRuntime` runs the server side of any :class:`~fedmcmc.core.base.FederatedSampler`
over a transport (Flower's ``Grid`` in :mod:`fedmcmc.app.flower.apps`, or direct calls in tests);
:class:`~fedmcmc.runtime.messaging.client.ClientRuntime` runs one client's side on its own data. Messages are dicts of
``str``, ``int``, ``bytes``, lists of them, and lists of NumPy arrays (what Flower's records carry).

Same samples as :func:`fedmcmc.simulate`: both call the round of :mod:`fedmcmc.runtime.round`
(with its key schedule). Every node runs all chains of its client (chains under ``vmap``), and
the server stacks the replies into the leading client axis and calls the same ``server_step``;
both compute the chains in the simulator's blocks (:func:`fedmcmc.runtime.round.blockwise`).

Faults. A client that fails, times out, or sends an upload that :func:`~fedmcmc.runtime.messaging.wire.decode_upload`
rejects is inactive for that round (``mask[c, i] = False``, which the sampler's participation
weights see). The client keeps its round result as *pending*; each message names, per chain,
the round of the client's last upload the server applied (``accepted_round``), and the client
commits its pending result only when that is the pending result's round; otherwise it keeps
its committed state, exactly as an inactive client does in the simulator. So a node that
restarts from its saved state, having missed messages, stays in step with the server. The server writes draws and its state
every chunk of rounds; each node writes its own state every round to its state folder, so
a restarted server resumes (``resume=True``) with the same samples as an uninterrupted run.

Upload norms. With ``[flower] max_upload_norm = "auto"`` (the default) the server bounds each
part of an upload (the compressor's message, each other array) by ``NORM_FACTOR`` (100) times a
reference norm: the lower median of that part's norms over this round's uploads (all clients
and chains) and the uploads it accepted in the ``NORM_WINDOW`` (10) rounds before. An upload
above the bound is rejected; a reference of 0 (most uploads of that part are zero) bounds
nothing. So uploads are bounded by the scale of the run's own uploads as long as fewer than half
of the norms in the reference are a deviating client's; in a run's first round with one upload
(one client and one chain) the upload is its own reference. A number sets a fixed bound instead.

Replays and copies. The server hashes every upload (per client and chain) and counts, without
refusing them (honest uploads can repeat, e.g. deterministic ones at a fixed point), an upload
whose bytes equal one of the ``NORM_WINDOW`` rounds before (``replayed_uploads``) or another
client's in the same round (``copied_uploads``); ``results.json``'s ``flower`` entry reports both.

Secure aggregation (``[flower] secure_aggregation = true``, :mod:`~fedmcmc.runtime.messaging.secagg`):
the clients upload double-masked grid integers; the server unmasks each chain's sum of the
active clients' (asking the survivors for their self seeds and their seeds with a client that
dropped out) and hands it to the same ``server_step``, so the samples are the plain run's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.compression import FixedPointMessage
from fedmcmc.compression.fixed_point import grid_bound
from fedmcmc.core import xla
from fedmcmc.runtime.messaging import secagg
from fedmcmc.runtime import round as rnd
from fedmcmc.runtime import identity
from fedmcmc.runtime.messaging.client import Build, ClientRuntime
from fedmcmc.runtime.messaging.wire import MalformedUpload, decode_upload, from_leaves, items, leaves
from fedmcmc.runtime.records import assemble, check_finite, save_npz
from fedmcmc.runtime.round import chain_keys

log = logging.getLogger("fedmcmc.runtime.messaging")

#: ``max_upload_norm = "auto"``: an upload part above this many times the reference norm is rejected.
NORM_FACTOR = 100.0
#: Rounds back whose accepted norms enter the reference, and whose uploads' hashes a replay is matched against.
NORM_WINDOW = 10


class Transport(Protocol):
    """How the server reaches the clients: ``exchange({client: message}, timeout)`` returns
    ``{client: reply}``, with ``None`` for a client that failed or did not answer in time."""

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]: ...


class ServerRuntime:
    """The server side of a run described by a config (TOML text), over a transport.

    Parameters
    ----------
    cfg_text
        The run config (``fedmcmc run`` format); the server reads its ``[run]`` and ``[flower]``
        from the built run's typed settings (``built.settings``,
        :class:`fedmcmc.runtime.settings.Settings`, checked where the config is parsed): of
        ``[flower]``, ``round_timeout`` (seconds a round waits for replies), ``max_upload_norm``
        (``"auto"``, above, or a fixed bound on each part's norm), ``secure_aggregation``
        (:mod:`~fedmcmc.runtime.messaging.secagg`; the server then sees only each round's sum of the
        uploads) and ``secure_min_clients``.
    out_dir
        Output folder: ``chunks/`` (draws, server state) and ``nodes/`` (the clients' own
        checkpoints in a local run; a real deployment keeps them on each node).
    build
        ``build(cfg_text) -> (cfg, built)`` (:func:`fedmcmc.app.config.from_text`); ``built``
        carries the config's typed ``settings``.
    resume
        Continue a run whose server stopped, from its last completed chunk; refused, naming the
        first setting that differs, when the checkpoint is another run's: the run's identity
        (:mod:`fedmcmc.runtime.identity`) is the parsed config and the chunk size. The server
        cannot see the nodes' data: a node whose data changed under the same config resumes
        with it.
    overwrite
        Replace a run whose chunks are in ``out_dir``; without it (or ``resume``) such a folder is refused.
    """

    def __init__(self, cfg_text: str, out_dir, build: Build, resume: bool = False, state_dir=None,
                 overwrite: bool = False):
        self.cfg_text = cfg_text
        self.cfg, self.built = build(cfg_text)
        r, self.flower = self.built.settings.run, self.built.settings.flower
        self.sampler, data = self.built.sampler, self.built.data
        self.b = data.num_clients
        self.seed, self.C = r.seed, r.num_chains
        self.N, self.burn_in, self.thinning = r.num_iterations, r.burn_in, r.thinning
        self.chunk = r.chunk_size or max(self.thinning, (min(self.N, 20) // self.thinning) * self.thinning)
        self.out_dir, self.resume, self.overwrite = Path(out_dir), resume, overwrite
        if resume and overwrite:
            raise ValueError("give resume (continue the run) or overwrite (replace it), not both")
        self.state_dir = str(state_dir if state_dir is not None else self.out_dir / "nodes")
        self.stats = {"rejected_uploads": 0, "missing_replies": 0, "wire_bits_mismatch": 0, "round_seconds": []}
        self.secure, self.minimum = self.flower.secure_aggregation, self.flower.secure_min_clients
        self.max_norm = self.flower.max_upload_norm
        self.norms, self.hashes = deque(maxlen=NORM_WINDOW), deque(maxlen=NORM_WINDOW)  # accepted, per round
        if not self.secure:
            self.stats.update(replayed_uploads=0, copied_uploads=0)
        if self.secure:
            self.stats.update(secagg_bits_up=0, secagg_bits_down=0, secagg_recoveries=0, secagg_self_bits=0,
                              secagg_too_few=0, secagg_out_of_range=0)
        self.chain_keys = chain_keys(self.seed, np.arange(self.C))
        self._compile(data)

    def _compile(self, data):
        s, b, w = self.sampler, self.b, rnd.block_width(self.C)  # the simulator's blocks of chains
        init = jax.vmap(lambda ck, theta0: rnd.server_init(s, ck, theta0, b))
        self.init = rnd.blockwise(xla.jit(init), w, 2)
        self.masks = rnd.blockwise(xla.jit(jax.vmap(lambda ck, k: rnd.participation(s, ck, k, b), (0, None))), w, 1)
        self.step = rnd.blockwise(xla.jit(jax.vmap(lambda ck, ss, up, m, k: rnd.server_round(s, ck, k, ss, up, m, b),
                                                   (0, 0, 0, 0, None))), w, 4)
        if s.setup is not None:
            self.setup = rnd.blockwise(xla.jit(jax.vmap(lambda ck, ss, up: rnd.setup_server(s, ck, ss, up, b))), w, 3)
        d = self.built.model.dim
        start = getattr(self.built, "start", None)  # the chains' starting points, where the build set them
        self.theta0 = jnp.zeros((self.C, d), jnp.float32) if start is None else jnp.asarray(start, jnp.float32)
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        ss, bc = jax.eval_shape(s.init, key, jax.ShapeDtypeStruct((d,), jnp.float32))
        client0 = data.client(0)
        cs = jax.eval_shape(s.client_init, key, bc, client0)
        up = jax.eval_shape(s.client_step, key, cs, bc, client0, jnp.int32(0))[1]
        self.up_leaves, self.up_treedef = jax.tree_util.tree_flatten(up)
        if self.secure and not isinstance(up, FixedPointMessage):
            raise ValueError(f"secure_aggregation needs uploads on a fixed-point grid, and {s.name}'s are not; use a "
                             "QLSD-family sampler with compression = {..., fixed_point = {fraction_bits = .., "
                             "max_abs = ..}}")
        if self.secure:  # what one upload's grid integers may hold: |q_j| <= B, ||q 2^-p|| <= C with [privacy] clip
            grid = self.cfg["sampler"]["compression"]["fixed_point"]
            self.grid = (grid_bound(grid["fraction_bits"], grid["max_abs"]), 2.0 ** -grid["fraction_bits"],
                         (self.built.privacy or {}).get("clip"))
        self.up_parts = items(up)
        self.ss_like, self.bc_like = jax.eval_shape(init, jax.ShapeDtypeStruct((self.C, 2), jnp.uint32),
                                                    self.theta0)
        if s.setup is not None:
            self.setup_up_like = jax.tree_util.tree_map(
                lambda a: jax.ShapeDtypeStruct((self.C, 1) + a.shape, a.dtype),
                jax.eval_shape(s.setup.client, key, cs, bc, client0)[1])

    def _message(self, kind: str, **fields) -> dict:
        return {"kind": kind, "state_dir": self.state_dir, **fields}

    def _all(self, transport, messages: dict, what: str) -> dict:
        replies = transport.exchange(messages, self.flower.round_timeout)
        missing = [i for i in messages if replies.get(i) is None]
        if missing:
            raise RuntimeError(f"client(s) {missing} did not answer the {what} message; every client is needed "
                               f"before round 1 (check that the SuperNodes are running)")
        return replies

    def run(self, transport: Transport, progress: bool = False):
        """Run (or resume) the rounds; returns the :class:`~fedmcmc.SimulationResult`.

        After every round the server rewrites ``out_dir/progress.json`` (:func:`write_progress`):
        the rounds done and configured and the measured seconds per round, which a launcher reads
        to show progress and the time left. With ``progress`` it also logs a line per chunk."""
        run_id = identity.identity(self.cfg, runtime="flower", chunk_size=self.chunk)
        chunk_dir = self.out_dir / "chunks"
        state_path = chunk_dir / "state.npz"
        pieces, done, wall = [], 0, 0.0
        accepted = np.full((self.C, self.b), -1, np.int32)  # round of each client's last applied upload
        setup_bits = (np.zeros(self.C, np.int64), np.zeros(self.C, np.int64))
        ss_leaves, ss_def = jax.tree_util.tree_flatten(self.ss_like)
        bc_leaves, bc_def = jax.tree_util.tree_flatten(self.bc_like)
        clients = range(self.b)
        if self.resume and state_path.exists():
            with np.load(state_path) as z:
                identity.check_resume(self.out_dir, z, run_id)
                done, wall = int(z["done"]), float(z["wall"])
                server_state = jax.tree_util.tree_unflatten(ss_def, [jnp.asarray(z[f"ss{i}"]) for i in range(len(ss_leaves))])
                broadcast = jax.tree_util.tree_unflatten(bc_def, [jnp.asarray(z[f"bc{i}"]) for i in range(len(bc_leaves))])
                accepted = z["last_accepted"]
                setup_bits = (z["setup_up"], z["setup_down"])
                num_chunks = int(z["num_chunks"])
            for i in range(num_chunks):
                with np.load(chunk_dir / f"chunk_{i:06d}.npz") as z:
                    pieces.append({name: z[name] for name in z.files})
            self._all(transport, {i: self._message("init", resume_from=done, broadcast=leaves(broadcast))
                                  for i in clients}, "resume")
            log.info("resumed at round %d", done)
            if self.secure:
                self._keys(transport)
        else:
            if chunk_dir.exists():
                if not self.overwrite and any(chunk_dir.glob("*.npz")):
                    raise ValueError(f"{self.out_dir} holds a run (chunks/); continue it with --resume, or replace "
                                     "it with --overwrite")
                for old in chunk_dir.iterdir():
                    old.unlink()
            chunk_dir.mkdir(parents=True, exist_ok=True)
            server_state, broadcast = self.init(self.chain_keys, self.theta0)
            self._all(transport, {i: self._message("init", broadcast=leaves(broadcast)) for i in clients}, "init")
            if self.sampler.setup is not None:
                server_state, setup_bits = self._setup(transport, server_state, broadcast)
            if self.secure:
                self._keys(transport)
        while done < self.N:
            length = min(self.chunk, self.N - done)
            start = time.perf_counter()
            positions, up, down, act = [], [], [], []
            window = np.zeros((3, self.C), np.int64)
            for t in range(length):
                k = done + t
                t0 = time.perf_counter()
                server_state, broadcast, accepted, counts = self._round(transport, k, server_state, broadcast, accepted)
                self.stats["round_seconds"].append(time.perf_counter() - t0)
                write_progress(self.out_dir / PROGRESS, k + 1, self.N, self.stats["round_seconds"])
                window += counts
                if (t + 1) % self.thinning == 0:
                    pos = np.asarray(server_state.draws if self.sampler.draws_per_round > 1
                                     else server_state.position[:, None])
                    check_finite(pos[:, None], [k + 1])
                    positions.append(pos)
                    up.append(window[0].copy()), down.append(window[1].copy()), act.append(window[2].copy())
                    window[:] = 0
            wall += time.perf_counter() - start
            kept = done + np.arange(1, length // self.thinning + 1) * self.thinning > self.burn_in
            pos = np.stack(positions, axis=1)[:, kept]  # [C, draws, m, d]
            piece = {"positions": pos.reshape((self.C, -1) + pos.shape[3:]),
                     "up": np.stack(up, 1), "down": np.stack(down, 1), "active": np.stack(act, 1)}
            pieces.append(piece)
            done += length
            save_npz(chunk_dir / f"chunk_{len(pieces) - 1:06d}.npz", **piece)
            save_npz(state_path, identity=identity.dumps(run_id), done=np.asarray(done), wall=np.asarray(wall),
                      num_chunks=np.asarray(len(pieces)), last_accepted=accepted, setup_up=setup_bits[0],
                      setup_down=setup_bits[1],
                      **{f"ss{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(server_state))},
                      **{f"bc{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(broadcast))})
            if progress:
                log.warning("round %d/%d (%.2f s per round)", done, self.N, wall / max(done, 1))
        return assemble(pieces, self.N, self.burn_in, self.thinning, False, wall, int(self.sampler.draws_per_round),
                         setup_bits)

    def _setup(self, transport, server_state, broadcast):
        replies = self._all(transport, {i: self._message("setup", broadcast=leaves(broadcast)) for i in range(self.b)},
                            "setup")
        uploads = [from_leaves(replies[i]["upload"], self.setup_up_like) for i in range(self.b)]
        uploads = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=1), *uploads)
        bits_up = np.sum([replies[i]["bits"] for i in range(self.b)], axis=0).astype(np.int64)
        server_state, message, info = self.setup(self.chain_keys, server_state, uploads)
        self._all(transport, {i: self._message("setup_receive", message=leaves(message)) for i in range(self.b)},
                  "setup result")
        return server_state, (bits_up, np.asarray(info.broadcast_bits, np.int64) * self.b)

    def _round(self, transport, k, server_state, broadcast, accepted):
        """One round: masks, messages to the clients active in some chain, decoding and
        validation of the replies, ``server_step`` with the effective mask."""
        mask = np.asarray(self.masks(self.chain_keys, jnp.int32(k)))  # [C, b]
        if self.secure:  # a sum of fewer clients would reveal their uploads: no client of such a chain this round
            few = mask.sum(axis=1) < self.minimum
            self.stats["secagg_too_few"] += int(np.sum(few & mask.any(axis=1)))
            mask = np.where(few[:, None], False, mask)
        bc = leaves(broadcast)
        messages = {i: self._message("round", k=k, broadcast=bc, mask=leaves([mask[:, i]]),
                                     accepted_round=leaves([accepted[:, i].copy()]), keep=self.chunk + 2)
                    for i in range(self.b) if mask[:, i].any()}
        if self.secure:
            for m in messages.values():
                m.update(secure=1, active=leaves([mask]))
        replies = transport.exchange(messages, self.flower.round_timeout) if messages else {}
        uploads = [np.zeros((self.C, self.b) + tuple(x.shape), x.dtype) for x in self.up_leaves]
        effective = np.zeros_like(mask)
        bits = np.zeros((self.C, self.b), np.int64)
        collect = self._collect_secure if self.secure else self._collect
        collect(transport, k, mask, messages, replies, uploads, effective, bits)
        accepted[effective] = k
        up_tree = jax.tree_util.tree_unflatten(self.up_treedef, [jnp.asarray(u) for u in uploads])
        server_state, broadcast, info = self.step(self.chain_keys, server_state, up_tree, jnp.asarray(effective),
                                                  jnp.int32(k))
        n_active = effective.sum(axis=1)
        counts = np.stack([bits.sum(axis=1), n_active * np.asarray(info.broadcast_bits, np.int64), n_active])
        return server_state, broadcast, accepted, counts

    def _reply(self, replies, k, i):
        """Client ``i``'s reply in round ``k``, or None (counted and logged: inactive this round)."""
        reply = replies.get(i)
        if reply is None:
            self.stats["missing_replies"] += 1
            log.warning("round %d: client %d failed or timed out; inactive this round", k, i)
        return reply

    def _collect(self, transport, k, mask, messages, replies, uploads, effective, bits):
        """Decode and validate the replies into ``uploads`` (``[C, b]`` per leaf), ``effective`` and ``bits``."""
        fixed = np.inf if self.max_norm == "auto" else float(self.max_norm)
        decoded = {}
        for i in messages:
            reply = self._reply(replies, k, i)
            if reply is None:
                continue
            try:
                chains = list(reply["chains"])
                if sorted(chains) != np.flatnonzero(mask[:, i]).tolist():
                    raise MalformedUpload(f"reply for chains {chains}, expected {np.flatnonzero(mask[:, i]).tolist()}")
                decoded[i] = []
                for n, c in enumerate(chains):
                    codecs = list(reply[f"codecs/{c}"])
                    blobs = [reply[f"blob/{c}/{j}"] for j in range(len(self.up_parts))]
                    values, wire, norms = decode_upload(codecs, blobs, self.up_parts, fixed)
                    if wire != int(reply["bits"][n]):
                        self.stats["wire_bits_mismatch"] += 1
                    digest = hashlib.sha256(repr(codecs).encode() + b"".join(bytes(b) for b in blobs)).digest()
                    decoded[i].append((c, values, wire, norms, digest))
            except (MalformedUpload, KeyError, TypeError, IndexError, ValueError) as err:
                decoded.pop(i, None)
                self.stats["rejected_uploads"] += 1
                log.warning("round %d: rejected the upload of client %d: %s", k, i, err)
        if self.max_norm == "auto":
            self._norm_bound(k, decoded)
        self._repeats(k, decoded)
        for i, chains in decoded.items():
            for c, values, wire, _, _ in chains:
                for u, v in zip(uploads, values):
                    u[c, i] = v
                effective[c, i] = True
                bits[c, i] = wire

    def _norm_bound(self, k, decoded: dict) -> None:
        """Reject (drop from ``decoded``) the clients with an upload part above ``NORM_FACTOR`` times
        its reference norm (the module docstring), and remember the accepted norms."""
        now = [norms for chains in decoded.values() for _, _, _, norms, _ in chains]
        pool = np.asarray(now + [norms for past in self.norms for norms in past]).reshape(-1, len(self.up_parts))
        bound = NORM_FACTOR * np.quantile(pool, 0.5, axis=0, method="lower") if len(pool) else np.zeros(0)
        bound = np.where(bound > 0, bound, np.inf)
        for i in list(decoded):
            over = [(c, j, norms[j]) for c, _, _, norms, _ in decoded[i] for j in range(len(norms))
                    if norms[j] > bound[j]]
            if over:
                del decoded[i]
                self.stats["rejected_uploads"] += 1
                c, j, norm = over[0]
                log.warning("round %d: rejected the upload of client %d: chain %d's array %d has norm %.3g > %g x "
                            "the uploads' median = %.3g (max_upload_norm = \"auto\")", k, i, c, j, norm, NORM_FACTOR,
                            bound[j])
        self.norms.append([norms for chains in decoded.values() for _, _, _, norms, _ in chains])

    def _repeats(self, k, decoded: dict) -> None:
        """Count the uploads of ``decoded`` equal to one of the last ``NORM_WINDOW`` rounds'
        (``replayed_uploads``) or to another client's of this round (``copied_uploads``)."""
        seen = set().union(*self.hashes)
        owner = {}
        for i, chains in decoded.items():
            for c, _, _, _, digest in chains:
                if digest in seen:
                    self.stats["replayed_uploads"] += 1
                    log.warning("round %d: client %d's upload for chain %d repeats an earlier round's", k, i, c)
                if owner.setdefault(digest, i) != i:
                    self.stats["copied_uploads"] += 1
                    log.warning("round %d: client %d's upload for chain %d is client %d's", k, i, c, owner[digest])
        self.hashes.append(set(owner))

    def _keys(self, transport):
        """Secure aggregation's key exchange (:mod:`~fedmcmc.runtime.messaging.secagg`): every client's
        public key, then all of them to every client."""
        replies = self._all(transport, {i: self._message("secagg_keys") for i in range(self.b)}, "key")
        publics = b"".join(bytes(replies[i]["public"]) for i in range(self.b))
        if len(publics) != self.b * secagg.KEY_BYTES:
            raise RuntimeError("a client sent a public key of the wrong length")
        signatures = [str(replies[i].get("signature", "")) for i in range(self.b)]  # relayed as they came
        signed = {"signatures": signatures} if any(signatures) else {}
        self._all(transport, {i: self._message("secagg_peers", publics=publics, **signed) for i in range(self.b)},
                  "keys")
        sent = 8 * len(publics) + 4 * sum(len(x) for x in signatures)  # a signature's hex digit: 4 bits
        self.stats["secagg_bits_up"] += sent
        self.stats["secagg_bits_down"] += sent * self.b

    def _collect_secure(self, transport, k, mask, messages, replies, uploads, effective, bits):
        """Unmask each chain's sum of its surviving clients' integers and hand it to the sampler as
        the first survivor's ``offset`` (every other message zero): the survivors reveal their
        self seeds and their seeds with the dropped clients (one more exchange, :meth:`_reveal`).
        A client's upload bits are its masked words, ``32 d``."""
        size = int(np.prod(self.up_parts[0].value.shape))
        got = {}
        for i in messages:
            reply = self._reply(replies, k, i)
            if reply is None:
                continue
            for c in np.flatnonzero(mask[:, i]).tolist():  # chain by chain: a valid masked upload is
                try:  # never followed by a request for its client's seeds
                    y = np.asarray(reply[f"masked/{c}"][0])
                    if y.dtype != np.uint32 or y.shape != (size,):
                        raise MalformedUpload(f"masked upload of {y.dtype} {y.shape}, expected uint32 ({size},)")
                    got[(c, i)] = y
                except (MalformedUpload, KeyError, TypeError, IndexError, ValueError) as err:
                    self.stats["rejected_uploads"] += 1
                    log.warning("round %d: rejected the upload of client %d for chain %d: %s", k, i, c, err)
        dropped = {c: [int(i) for i in np.flatnonzero(mask[c]) if (c, i) not in got] for c in range(self.C)}
        survivors = {c: [i for i in range(self.b) if (c, i) in got] for c in range(self.C)}
        for c in range(self.C):  # fewer survivors than the minimum: their sum stays masked, no client applied
            if 0 < len(survivors[c]) < self.minimum:
                self.stats["secagg_too_few"] += 1
                log.warning("round %d: chain %d has %d survivor(s), fewer than secure_min_clients = %d; no client "
                            "applied", k, c, len(survivors[c]), self.minimum)
                survivors[c] = []
        asked = sorted((c, i) for c in range(self.C) for i in survivors[c])
        own, revealed = self._reveal(transport, k, asked, dropped) if asked else ({}, {})
        offset = len(self.up_leaves) - 1  # the last leaf of a FixedPointMessage
        for c in range(self.C):
            if not survivors[c]:
                continue
            try:
                total = secagg.unmask({i: got[(c, i)] for i in survivors[c]}, dropped[c], revealed.get(c, {}),
                                      own.get(c, {}))
            except KeyError:
                log.warning("round %d: chain %d's sum could not be unmasked; no client applied", k, c)
                continue
            why = self._out_of_range(total, len(survivors[c]))
            if why:
                self.stats["secagg_out_of_range"] += 1
                log.warning("round %d: chain %d's unmasked sum %s (a replayed or forged upload); no client applied",
                            k, c, why)
                continue
            uploads[offset][c, survivors[c][0]] = total.reshape(uploads[offset].shape[2:])
            self.stats["secagg_recoveries"] += bool(dropped[c])
            for i in survivors[c]:  # the bits on the wire: the masked words
                effective[c, i], bits[c, i] = True, 32 * size
                self.stats["secagg_bits_up"] += 32 * size

    def _out_of_range(self, total: np.ndarray, n: int) -> str | None:
        """Why the unmasked sum of ``n`` uploads cannot be a sum of ``n`` grid integers within their
        bounds (each ``|q_j| <= B``; with ``[privacy] clip``, ``||q 2^-p|| <= C``), or None."""
        bound, step, clip = self.grid
        largest = int(np.max(np.abs(total.astype(np.int64))))
        if largest > n * bound:
            return f"has a coordinate of {largest} > {n} x B = {n * bound}"
        norm = float(np.linalg.norm(total.astype(np.float64))) * step
        if clip is not None and norm > n * clip * (1 + 2 ** -20):
            return f"has norm {norm:.4g} > {n} x clip = {n * clip:.4g}"
        return None

    def _reveal(self, transport, k, got: list, dropped: dict) -> tuple[dict, dict]:
        """Ask every survivor ``j`` of round ``k`` (``got``: its ``(chain, j)``), for each of its
        chains, for its self seed and its seeds with that chain's ``dropped`` clients:
        ``({chain: {j: b_j}}, {chain: {(j, u): t_ju}})`` (a missing reply leaves the chain masked)."""
        chains: dict[int, list] = {}
        for c, j in got:
            chains.setdefault(j, []).append(c)
        asks = {j: self._message("secagg_reveal", k=k, chains=cs, dropped=[dropped[c] for c in cs])
                for j, cs in chains.items()}
        replies = transport.exchange(asks, self.flower.round_timeout)
        own, revealed = {}, {}
        for j, cs in chains.items():
            reply = replies.get(j) or {}
            selfs, seeds = reply.get("self", b""), reply.get("seeds", b"")
            pairs = [(c, u) for c in cs for u in dropped[c]]
            if len(selfs) != secagg.KEY_BYTES * len(cs) or len(seeds) != secagg.KEY_BYTES * len(pairs):
                continue
            self.stats["secagg_bits_up"] += 8 * (len(selfs) + len(seeds))
            self.stats["secagg_self_bits"] += 8 * len(selfs)
            for n, c in enumerate(cs):
                own.setdefault(c, {})[j] = selfs[n * secagg.KEY_BYTES:(n + 1) * secagg.KEY_BYTES]
            for n, (c, u) in enumerate(pairs):
                revealed.setdefault(c, {})[(j, u)] = seeds[n * secagg.KEY_BYTES:(n + 1) * secagg.KEY_BYTES]
        return own, revealed


#: The file a running server rewrites after every round (:func:`write_progress`).
PROGRESS = "progress.json"


def write_progress(path: Path, done: int, total: int, seconds: list[float]) -> None:
    """Write ``{"done", "total", "seconds_per_round", "remaining_seconds"}`` to ``path``, atomically.

    The seconds per round are the median of this session's last 20 rounds after its first (which
    compiles the programs), or of the first alone; ``None`` before any round."""
    recent = seconds[1:][-20:] or seconds[:1]
    per = float(np.median(recent)) if recent else None
    record = {"done": int(done), "total": int(total), "seconds_per_round": per,
              "remaining_seconds": None if per is None else per * (total - done)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


class LocalTransport:
    """All clients in this process, called directly (tests and debugging; no Flower).

    ``faults(kind, k, index, reply) -> reply`` may alter or drop (return None) a reply."""

    def __init__(self, cfg_text: str, num_clients: int, build: Build, faults: Callable | None = None):
        self.clients = {i: ClientRuntime(cfg_text, i, build) for i in range(num_clients)}
        self.stores: dict[int, dict] = {i: {} for i in range(num_clients)}
        self.faults = faults

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]:
        replies = {}
        for i, msg in messages.items():
            try:
                reply = self.clients[i].handle(msg, self.stores[i])
            except Exception as err:  # noqa: BLE001 - a failing client is an inactive client
                log.warning("client %d failed: %s", i, err)
                reply = None
            if self.faults is not None:
                reply = self.faults(msg["kind"], msg.get("k"), i, reply)
            replies[i] = reply
        return replies
