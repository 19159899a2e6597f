"""The federated runtime without Flower: a server loop and a client that exchange messages.

:class:`ServerRuntime` runs the server side of any :class:`~fedmcmc.base.FederatedSampler`
over a transport (Flower's ``Grid`` in :mod:`fedmcmc.flower.apps`, or direct calls in tests);
:class:`ClientRuntime` runs one client's side on its own data. Messages are dicts of
``str``, ``int``, ``bytes`` and lists of them (what a Flower ``ConfigRecord`` carries).

Same samples as :func:`fedmcmc.simulate`: both call the round of :mod:`fedmcmc.runtime.round`
(with its key schedule). Every node runs all chains of its client (chains under ``vmap``), and
the server stacks the replies into the leading client axis and calls the same ``server_step``.

Faults. A client that fails, times out, or sends an upload that :func:`~fedmcmc.flower.wire.decode_upload`
rejects is inactive for that round (``mask[c, i] = False``, which the sampler's participation
weights see). The client keeps its round result as *pending* and commits it only when the
next round's message says the upload was accepted; otherwise it keeps its previous state,
exactly as an inactive client does in the simulator. The server writes draws and its state
every chunk of rounds; each node writes its own state every round to its state folder, so
a restarted server resumes (``resume=True``) with the same samples as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import logging
import time
from functools import partial
import tomllib
from pathlib import Path
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc import config as config_lib
from fedmcmc import cpu
from fedmcmc.flower.wire import MalformedUpload, decode_upload, encode_upload, items, pack, unpack
from fedmcmc.runtime import round as rnd
from fedmcmc.runtime.records import assemble, check_finite, fingerprint, save_npz
from fedmcmc.runtime.round import chain_keys

log = logging.getLogger("fedmcmc.flower")

#: Default settings of the ``[flower]`` part of a run (``ServerRuntime`` keyword arguments).
DEFAULTS = {"round_timeout": 120.0, "max_upload_norm": 1e8}


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_problem(cfg_text: str) -> tuple[dict, dict]:
    """Parse and build a run config (TOML text): ``(cfg, built)`` as in :mod:`fedmcmc.config`."""
    cfg = tomllib.loads(cfg_text)
    config_lib.validate(cfg)
    return cfg, config_lib.build(cfg)


# --------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------


_SHARED: dict[str, dict] = {}


def _shared_client(cfg_text: str) -> dict:
    """The built problem and the jitted client functions of a config, shared by the clients
    of one process (data and client index are arguments, so they compile once)."""
    key = config_hash(cfg_text)
    if key in _SHARED:
        return _SHARED[key]
    cfg, built = build_problem(cfg_text)
    s, b = built["sampler"], built["data"].num_clients

    def init(ck, bc, data, ids):
        return rnd.client_init(s, ck, bc, data, ids)

    def step(ck, cs, bc, m, k, data, ids):
        new_cs, up, info = rnd.client_round(s, ck, k, cs, bc, data, ids, m)
        return new_cs, up, info.bits

    functions = {
        "first": cpu.jit(partial(jax.tree_util.tree_map, lambda a: a[:, :1])),
        "init": cpu.jit(jax.vmap(init, (0, 0, None, None))),
        "step": cpu.jit(jax.vmap(step, (0, 0, 0, 0, None, None, None))),
        "accept": cpu.jit(jax.vmap(rnd.select)),
    }
    if s.setup is not None:
        def setup(ck, cs, bc, data, ids):
            return rnd.setup_clients(s, ck, cs, bc, data, ids, b)

        functions["setup"] = cpu.jit(jax.vmap(setup, (0, 0, 0, None, None)))
        functions["receive"] = cpu.jit(jax.vmap(partial(rnd.setup_receive, s)))
    _SHARED[key] = {"cfg": cfg, "sampler": s, "data": built["data"], "dim": built["model"].dim,
                    "functions": functions}
    if len(_SHARED) > 8:
        _SHARED.pop(next(iter(_SHARED)))
    return _SHARED[key]


class ClientRuntime:
    """One client (partition ``index``) of a run: all chains, its own data only.

    ``handle(message, store)`` answers one server message; ``store`` is the node's persistent
    dict (Flower's ``Context.state``), holding ``committed`` and ``pending`` client states.
    """

    def __init__(self, cfg_text: str, index: int, data_fn: Callable | None = None):
        shared = _shared_client(cfg_text)
        self.cfg, self.sampler = shared["cfg"], shared["sampler"]
        data = shared["data"]
        self.b = data.num_clients
        if not 0 <= index < self.b:
            raise ValueError(f"partition id {index} out of range for {self.b} clients; start node i with "
                             "--node-config 'partition-id=i' for i in 0..num_clients-1")
        self.index = int(index)
        r = self.cfg["run"]
        self.chain_keys = chain_keys(r.get("seed", 0), np.arange(r["num_chains"]))
        # The client's own data (never sent anywhere), as a vmap batch of ``width`` copies: XLA
        # compiles a batch of one differently from the simulator's batch of b clients (the
        # last bit of a reduction can differ), a batch of b identical copies exactly alike.
        self.width = self.b if self.cfg.get("flower", {}).get("exact", True) else 1
        own = data_fn(index) if data_fn else jax.tree_util.tree_map(
            lambda a: np.asarray(a)[index:index + 1], data.clients())
        self.data = jax.tree_util.tree_map(lambda a: jnp.asarray(np.repeat(a, self.width, axis=0)), own)
        self.ids = jnp.full((self.width,), self.index, jnp.uint32)
        f = shared["functions"]
        first = f["first"]
        self.init = lambda ck, bc: first(f["init"](ck, bc, self.data, self.ids))
        self.step = lambda ck, cs, bc, m, k: first(f["step"](ck, self._tile(cs), bc, jnp.repeat(m, self.width, axis=1),
                                                             k, self.data, self.ids))
        self.accept = f["accept"]
        self.setup = self.receive = None
        if self.sampler.setup is not None:
            self.setup = lambda ck, cs, bc: first(f["setup"](ck, self._tile(cs), bc, self.data, self.ids))
            self.receive = lambda cs, msg: first(f["receive"](self._tile(cs), msg))
        self._likes(shared["dim"])

    def _tile(self, tree):
        return jax.tree_util.tree_map(lambda a: jnp.repeat(a, self.width, axis=1), tree)

    def _likes(self, dim: int):
        s, C = self.sampler, self.chain_keys.shape[0]
        theta0 = jax.ShapeDtypeStruct((C, dim), jnp.float32)
        init_keys = jax.ShapeDtypeStruct(self.chain_keys.shape, self.chain_keys.dtype)
        ss_like, self.bc_like = jax.eval_shape(jax.vmap(s.init), init_keys, theta0)
        self.cs_like = jax.eval_shape(self.init, init_keys, self.bc_like)
        self.msg_like = None
        if s.setup is not None:
            up = jax.eval_shape(self.setup, init_keys, self.cs_like, self.bc_like)[1]
            up = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((C, self.b) + a.shape[2:], a.dtype), up)
            self.msg_like = jax.eval_shape(jax.vmap(lambda k, ss, u: s.setup.server(k, ss, u)[1]),
                                           init_keys, ss_like, up)

    def handle(self, msg: dict, store: dict) -> dict:
        """Answer one server message (see the module docstring for the kinds)."""
        kind = msg["kind"]
        if kind == "hello":
            return {"index": self.index}
        C = self.chain_keys.shape[0]
        flags = [jax.ShapeDtypeStruct((C,), jnp.bool_)]
        state_dir = Path(msg["state_dir"]) if msg.get("state_dir") else None
        if kind == "init":
            if int(msg.get("resume_from", -1)) > 0:
                k = int(msg["resume_from"])
                saved = sorted(int(p.stem[5:]) for p in (state_dir / f"client{self.index}").glob("round*.npz")
                               if int(p.stem[5:]) < k) if state_dir else []
                if not saved:
                    raise RuntimeError(f"client {self.index} has no saved state before round {k} in {state_dir}")
                with np.load(state_dir / f"client{self.index}" / f"round{saved[-1]}.npz") as z:
                    store.update(committed=z["committed"].tobytes(), pending=z["pending"].tobytes(), k=saved[-1])
                return {"ok": 1}
            bc = unpack(msg["broadcast"], self.bc_like)
            cs = self.init(self.chain_keys, bc)
            store.update(committed=pack(cs), pending=pack(cs), k=-1)
            if state_dir is not None:
                self._save(state_dir, -1, store, 0)
            return {"ok": 1}
        committed = unpack(store["committed"], self.cs_like)
        if kind == "setup":
            cs, up, info = self.setup(self.chain_keys, committed, unpack(msg["broadcast"], self.bc_like))
            store.update(committed=pack(cs), pending=pack(cs))
            return {"upload": pack(up), "bits": [int(x) for x in np.asarray(info.bits)[:, 0]]}
        if kind == "setup_receive":
            cs = self.receive(committed, unpack(msg["message"], self.msg_like))
            store.update(committed=pack(cs), pending=pack(cs))
            if state_dir is not None:
                self._save(state_dir, -1, store, 0)
            return {"ok": 1}
        if kind == "round":
            k = int(msg["k"])
            accepted = unpack(msg["accepted"], flags)[0]
            mask = unpack(msg["mask"], flags)[0]
            pending = unpack(store["pending"], self.cs_like)
            cs = self.accept(jnp.asarray(accepted), pending, committed)
            bc = unpack(msg["broadcast"], self.bc_like)
            new_cs, up, bits = self.step(self.chain_keys, cs, bc, jnp.asarray(mask)[:, None], jnp.int32(k))
            store.update(committed=pack(cs), pending=pack(new_cs), k=k)
            if state_dir is not None:
                self._save(state_dir, k, store, int(msg.get("keep", 3)))
            chains = [int(c) for c in np.flatnonzero(mask)]
            reply: dict[str, Any] = {"chains": chains, "bits": [], "wire_bits": []}
            parts = items(jax.tree_util.tree_map(np.asarray, up))
            bits = np.asarray(bits)
            for c in chains:
                enc = encode_upload([jax.tree_util.tree_map(lambda a: a[c, 0], part) for part in parts])
                reply[f"codecs/{c}"] = enc.codecs
                for j, blob in enumerate(enc.blobs):
                    reply[f"blob/{c}/{j}"] = blob
                reply["bits"].append(int(bits[c, 0]))
                reply["wire_bits"].append(int(enc.bits))
            return reply
        raise ValueError(f"unknown message kind {kind!r}")

    def _save(self, state_dir: Path, k: int, store: dict, keep: int):
        """The node's own checkpoint (its state folder): the state after round ``k``; files of
        rounds more than ``keep`` rounds back are removed (the server's chunk length + 2)."""
        folder = state_dir / f"client{self.index}"
        folder.mkdir(parents=True, exist_ok=True)
        save_npz(folder / f"round{k}.npz", committed=np.frombuffer(store["committed"], np.uint8),
                  pending=np.frombuffer(store["pending"], np.uint8))
        for old in folder.glob("round*.npz"):
            if int(old.stem[5:]) < k - keep:
                old.unlink()


# --------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------


class Transport(Protocol):
    """How the server reaches the clients: ``exchange({client: message}, timeout)`` returns
    ``{client: reply}``, with ``None`` for a client that failed or did not answer in time."""

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]: ...


class ServerRuntime:
    """The server side of a run described by a config (TOML text), over a transport.

    Parameters
    ----------
    cfg_text
        The run config (``fedmcmc run`` format); its optional ``[flower]`` settings are
        ``round_timeout`` (seconds a round waits for replies) and ``max_upload_norm``.
    out_dir
        Output folder: ``chunks/`` (draws, server state) and ``nodes/`` (the clients' own
        checkpoints in a local run; a real deployment keeps them on each node).
    resume
        Continue a run whose server stopped, from its last completed chunk.
    """

    def __init__(self, cfg_text: str, out_dir, resume: bool = False, state_dir=None):
        self.cfg_text = cfg_text
        self.cfg, self.built = build_problem(cfg_text)
        self.flower = {**DEFAULTS, **self.cfg.get("flower", {})}
        self.sampler, data = self.built["sampler"], self.built["data"]
        self.b = data.num_clients
        r = self.cfg["run"]
        self.seed, self.C = int(r.get("seed", 0)), int(r["num_chains"])
        self.N, self.burn_in, self.thinning = int(r["num_iterations"]), int(r.get("burn_in", 0)), int(r.get("thinning", 1))
        self.chunk = int(r.get("chunk_size") or max(self.thinning, (min(self.N, 20) // self.thinning) * self.thinning))
        self.out_dir, self.resume = Path(out_dir), resume
        self.state_dir = str(state_dir if state_dir is not None else self.out_dir / "nodes")
        self.stats = {"rejected_uploads": 0, "missing_replies": 0, "wire_bits_mismatch": 0, "round_seconds": []}
        self.chain_keys = chain_keys(self.seed, np.arange(self.C))
        self._compile(data)

    def _compile(self, data):
        s, b = self.sampler, self.b
        self.init = cpu.jit(jax.vmap(lambda ck, theta0: rnd.server_init(s, ck, theta0, b)))
        self.masks = cpu.jit(jax.vmap(lambda ck, k: rnd.participation(s, ck, k, b), (0, None)))
        self.step = cpu.jit(jax.vmap(lambda ck, ss, up, m, k: rnd.server_round(s, ck, k, ss, up, m, b),
                                     (0, 0, 0, 0, None)))
        if s.setup is not None:
            self.setup = cpu.jit(jax.vmap(lambda ck, ss, up: rnd.setup_server(s, ck, ss, up, b)))
        d = self.built["model"].dim
        self.theta0 = jnp.zeros((self.C, d), jnp.float32)
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        ss, bc = jax.eval_shape(s.init, key, jax.ShapeDtypeStruct((d,), jnp.float32))
        client0 = data.client(0)
        cs = jax.eval_shape(s.client_init, key, bc, client0)
        up = jax.eval_shape(s.client_step, key, cs, bc, client0, jnp.int32(0))[1]
        self.up_leaves, self.up_treedef = jax.tree_util.tree_flatten(up)
        self.up_parts = items(up)
        self.ss_like, self.bc_like = jax.eval_shape(self.init, jax.ShapeDtypeStruct((self.C, 2), jnp.uint32),
                                                    self.theta0)
        if s.setup is not None:
            self.setup_up_like = jax.tree_util.tree_map(
                lambda a: jax.ShapeDtypeStruct((self.C, 1) + a.shape, a.dtype),
                jax.eval_shape(s.setup.client, key, cs, bc, client0)[1])

    def _message(self, kind: str, **fields) -> dict:
        return {"kind": kind, "config": self.cfg_text, "state_dir": self.state_dir, **fields}

    def _all(self, transport, messages: dict, what: str) -> dict:
        replies = transport.exchange(messages, self.flower["round_timeout"])
        missing = [i for i in messages if replies.get(i) is None]
        if missing:
            raise RuntimeError(f"client(s) {missing} did not answer the {what} message; every client is needed "
                               f"before round 1 (check that the SuperNodes are running)")
        return replies

    def run(self, transport: Transport, progress: bool = False):
        """Run (or resume) the rounds; returns the :class:`~fedmcmc.simulator.SimulationResult`."""
        run_fingerprint = fingerprint(runtime="flower", config=config_hash(self.cfg_text), chunk=self.chunk)
        chunk_dir = self.out_dir / "chunks"
        state_path = chunk_dir / "state.npz"
        pieces, done, wall = [], 0, 0.0
        accepted = np.zeros((self.C, self.b), bool)
        setup_bits = (np.zeros(self.C, np.int64), np.zeros(self.C, np.int64))
        ss_leaves, ss_def = jax.tree_util.tree_flatten(self.ss_like)
        bc_leaves, bc_def = jax.tree_util.tree_flatten(self.bc_like)
        clients = range(self.b)
        if self.resume and state_path.exists():
            with np.load(state_path) as z:
                if str(z["fingerprint"]) != run_fingerprint:
                    raise ValueError(f"cannot resume from {chunk_dir}: it holds a run with different settings; "
                                     "use another --out folder or drop --resume")
                done, wall = int(z["done"]), float(z["wall"])
                server_state = jax.tree_util.tree_unflatten(ss_def, [jnp.asarray(z[f"ss{i}"]) for i in range(len(ss_leaves))])
                broadcast = jax.tree_util.tree_unflatten(bc_def, [jnp.asarray(z[f"bc{i}"]) for i in range(len(bc_leaves))])
                accepted = z["accepted"]
                setup_bits = (z["setup_up"], z["setup_down"])
                num_chunks = int(z["num_chunks"])
            for i in range(num_chunks):
                with np.load(chunk_dir / f"chunk_{i:06d}.npz") as z:
                    pieces.append({name: z[name] for name in z.files})
            self._all(transport, {i: self._message("init", resume_from=done, broadcast=pack(broadcast))
                                  for i in clients}, "resume")
            log.info("resumed at round %d", done)
        else:
            if chunk_dir.exists():
                for old in chunk_dir.iterdir():
                    old.unlink()
            chunk_dir.mkdir(parents=True, exist_ok=True)
            server_state, broadcast = self.init(self.chain_keys, self.theta0)
            self._all(transport, {i: self._message("init", broadcast=pack(broadcast)) for i in clients}, "init")
            if self.sampler.setup is not None:
                server_state, setup_bits = self._setup(transport, server_state, broadcast)
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
            save_npz(state_path, fingerprint=np.asarray(run_fingerprint), done=np.asarray(done), wall=np.asarray(wall),
                      num_chunks=np.asarray(len(pieces)), accepted=accepted, setup_up=setup_bits[0],
                      setup_down=setup_bits[1],
                      **{f"ss{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(server_state))},
                      **{f"bc{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(broadcast))})
            if progress:
                log.warning("round %d/%d (%.2f s per round)", done, self.N, wall / max(done, 1))
        return assemble(pieces, self.N, self.burn_in, self.thinning, False, wall, int(self.sampler.draws_per_round),
                         setup_bits)

    def _setup(self, transport, server_state, broadcast):
        replies = self._all(transport, {i: self._message("setup", broadcast=pack(broadcast)) for i in range(self.b)},
                            "setup")
        uploads = [unpack(replies[i]["upload"], self.setup_up_like) for i in range(self.b)]
        uploads = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=1), *uploads)
        bits_up = np.sum([replies[i]["bits"] for i in range(self.b)], axis=0).astype(np.int64)
        server_state, message, info = self.setup(self.chain_keys, server_state, uploads)
        self._all(transport, {i: self._message("setup_receive", message=pack(message)) for i in range(self.b)},
                  "setup result")
        return server_state, (bits_up, np.asarray(info.broadcast_bits, np.int64) * self.b)

    def _round(self, transport, k, server_state, broadcast, accepted):
        """One round: masks, messages to the clients active in some chain, decoding and
        validation of the replies, ``server_step`` with the effective mask."""
        mask = np.asarray(self.masks(self.chain_keys, jnp.int32(k)))  # [C, b]
        bc = pack(broadcast)
        messages = {i: self._message("round", k=k, broadcast=bc, mask=pack([mask[:, i]]),
                                     accepted=pack([accepted[:, i]]), keep=self.chunk + 2)
                    for i in range(self.b) if mask[:, i].any()}
        replies = transport.exchange(messages, self.flower["round_timeout"]) if messages else {}
        uploads = [np.zeros((self.C, self.b) + tuple(x.shape), x.dtype) for x in self.up_leaves]
        effective = np.zeros_like(mask)
        bits = np.zeros((self.C, self.b), np.int64)
        new_accepted = accepted.copy()
        for i in messages:
            new_accepted[:, i] = False
            reply = replies.get(i)
            if reply is None:
                self.stats["missing_replies"] += 1
                log.warning("round %d: client %d failed or timed out; inactive this round", k, i)
                continue
            try:
                chains = list(reply["chains"])
                if sorted(chains) != np.flatnonzero(mask[:, i]).tolist():
                    raise MalformedUpload(f"reply for chains {chains}, expected {np.flatnonzero(mask[:, i]).tolist()}")
                decoded = []
                for n, c in enumerate(chains):
                    blobs = [reply[f"blob/{c}/{j}"] for j in range(len(self.up_parts))]
                    values, wire = decode_upload(list(reply[f"codecs/{c}"]), blobs, self.up_parts,
                                                 float(self.flower["max_upload_norm"]))
                    if wire != int(reply["bits"][n]):
                        self.stats["wire_bits_mismatch"] += 1
                    decoded.append((c, values, wire))
            except (MalformedUpload, KeyError, TypeError, IndexError, ValueError) as err:
                self.stats["rejected_uploads"] += 1
                log.warning("round %d: rejected the upload of client %d: %s", k, i, err)
                continue
            for c, values, wire in decoded:
                for u, v in zip(uploads, values):
                    u[c, i] = v
                effective[c, i] = True
                new_accepted[c, i] = True
                bits[c, i] = wire
        up_tree = jax.tree_util.tree_unflatten(self.up_treedef, [jnp.asarray(u) for u in uploads])
        server_state, broadcast, info = self.step(self.chain_keys, server_state, up_tree, jnp.asarray(effective),
                                                  jnp.int32(k))
        n_active = effective.sum(axis=1)
        counts = np.stack([bits.sum(axis=1), n_active * np.asarray(info.broadcast_bits, np.int64), n_active])
        return server_state, broadcast, new_accepted, counts


class LocalTransport:
    """All clients in this process, called directly (tests and debugging; no Flower).

    ``faults(kind, k, index, reply) -> reply`` may alter or drop (return None) a reply."""

    def __init__(self, cfg_text: str, num_clients: int, faults: Callable | None = None):
        self.clients = {i: ClientRuntime(cfg_text, i) for i in range(num_clients)}
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
