"""One client of a run on its own data, answering the server's messages (no Flower here).

:class:`ClientRuntime` runs all chains of one client (chains under ``vmap``, in the simulator's
blocks: :func:`fedmcmc.runtime.round.blockwise`) with the round of :mod:`fedmcmc.runtime.round`,
so its uploads are the simulator's. Messages are dicts of ``str``,
``int``, ``bytes`` and lists of them (what a Flower ``ConfigRecord`` carries); the kinds are
``hello``, ``init``, ``setup``, ``setup_receive`` and ``round`` (see :mod:`fedmcmc.runtime.messaging.server`
for the faults and the commit rule of pending states).

The run is named by its config text and built by the ``build`` function the caller passes
(``text -> (cfg, built)``: :func:`fedmcmc.app.config.from_text` for ``fedmcmc run`` configs), so
this layer knows nothing of the config format: it reads the run's settings from the built run's
typed ``settings`` (:class:`fedmcmc.runtime.settings.Settings`).
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.runtime import round as rnd
from fedmcmc.runtime.messaging import stored_programs as programs_lib
from fedmcmc.runtime.messaging import secagg
from fedmcmc.runtime.messaging.wire import encode_upload, from_leaves, items, leaves, pack, unpack
from fedmcmc.runtime.records import save_npz
from fedmcmc.runtime.settings import RunSettings
from fedmcmc.runtime.round import chain_keys

#: ``build(config_text) -> (cfg, built)``: the parsed config and the built run (a NamedTuple with
#: at least ``sampler``, ``data``, ``model`` and ``settings``, a :class:`fedmcmc.runtime.settings.Settings`).
Build = Callable[[str], "tuple[dict, Any]"]


def config_hash(text: str) -> str:
    """The run's identity: a short hash of its config text."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_SHARED: dict[str, dict] = {}


def _shared_client(cfg_text: str, build: Build, identity: str = "") -> dict:
    """The built problem and the client's functions of a config (and ``identity``), shared by
    the clients of one process (data and client index are arguments, so they compile once)."""
    key = config_hash(cfg_text) + identity
    if key in _SHARED:
        return _SHARED[key]
    cfg, built = build(cfg_text)
    s, b = built.sampler, built.data.num_clients

    def init(ck, bc, data, ids):
        return rnd.client_init(s, ck, bc, data, ids)

    def step(ck, cs, bc, m, k, data, ids):
        new_cs, up, info = rnd.client_round(s, ck, k, cs, bc, data, ids, m)
        return new_cs, up, info.bits

    functions = {"init": jax.vmap(init, (0, 0, None, None)), "step": jax.vmap(step, (0, 0, 0, 0, None, None, None))}
    if s.setup is not None:
        def setup(ck, cs, bc, data, ids):
            return rnd.setup_clients(s, ck, cs, bc, data, ids, b)

        functions["setup"] = jax.vmap(setup, (0, 0, 0, None, None))
        functions["receive"] = jax.vmap(partial(rnd.setup_receive, s))
    _SHARED[key] = {"cfg": cfg, "settings": built.settings, "sampler": s, "data": built.data, "dim": built.model.dim,
                    "functions": functions, "programs": {}}
    if len(_SHARED) > 8:
        _SHARED.pop(next(iter(_SHARED)))
    return _SHARED[key]


#: How many leading arguments of each client program have the chains first.
_CHAIN_ARGS = {"init": 2, "setup": 3, "receive": 2, "step": 4}


def _first(tree):
    """The first copy of a ``width``-batch (axis 1), as NumPy arrays (an exact copy)."""
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[:, :1], tree)


class ClientRuntime:
    """One client (partition ``index``) of a run: all chains, its own data only.

    ``handle(message, store)`` answers one server message; ``store`` is the node's persistent
    dict (Flower's ``Context.state``), holding ``committed`` and ``pending`` client states.
    ``data_fn(index)`` gives the client's own data (a ``ClientData`` of one client, its rows in the
    run's layout)
    in place of its part of the built run's data; ``identity`` names a build that is not the
    config text's alone (runs of one text that ``build`` builds differently). ``programs`` is a
    folder where the compiled programs and the run's shapes are kept for the next process
    (:mod:`fedmcmc.runtime.messaging.stored_programs`; None: compiled in memory).
    """

    def __init__(self, cfg_text: str, index: int, build: Build, data_fn: Callable | None = None, identity: str = "",
                 programs=None):
        self.shared = shared = _shared_client(cfg_text, build, identity)
        self.cfg, self.sampler = shared["cfg"], shared["sampler"]
        data = shared["data"]
        self.b = data.num_clients
        if not 0 <= index < self.b:
            raise ValueError(f"partition id {index} out of range for {self.b} clients; start node i with "
                             "--node-config 'partition-id=i' for i in 0..num_clients-1")
        self.index = int(index)
        r, flower = shared["settings"].run, shared["settings"].flower
        self.minimum = flower.secure_min_clients
        # The client's own data (never sent anywhere), as a vmap batch of ``width`` copies: XLA
        # compiles a batch of one differently from the simulator's batch of b clients (the
        # last bit of a reduction can differ), a batch of b identical copies exactly alike.
        self.width = self.b if flower.exact else 1
        own = data_fn(index) if data_fn else data.clients().take(np.asarray([index]))
        own = jax.tree_util.tree_map(np.asarray, own)
        self.data = own.take(np.zeros((self.width,), np.int32))
        self.ids = np.full((self.width,), self.index, np.uint32)
        # the layout's buckets are static in the programs: part of their key
        layout = hashlib.sha256(repr((own.rows.buckets, own.rows.n_max)).encode()).hexdigest()[:16]
        self.folder, self.key = programs, f"{config_hash(cfg_text)}{identity}/layout{layout}/width{self.width}"
        self.chain_keys, self.bc_like, self.cs_like, self.msg_like = programs_lib.cached(
            programs, self.key + "/shapes", lambda: self._likes(shared["dim"], r))

    def _tile(self, tree):
        return jax.tree_util.tree_map(lambda a: np.repeat(np.asarray(a), self.width, axis=1), tree)

    def _wide(self, like):
        return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[:1] + (self.width,) + a.shape[2:],
                                                                     a.dtype), like)

    def _run(self, name: str, *args):
        """Program ``name`` of the client's functions on ``args``, its first copy, computed on the
        simulator's blocks of chains (:func:`fedmcmc.runtime.round.blockwise`; the program is
        compiled once per process, or loaded from the programs folder)."""
        progs = self.shared["programs"]

        def block(*block_args):
            if name not in progs:
                progs[name] = programs_lib.program(self.folder, f"{self.key}/{name}", self.shared["functions"][name],
                                                   block_args)
            return progs[name](*block_args)

        return _first(rnd.blockwise(block, rnd.block_width(self.chain_keys.shape[0]), _CHAIN_ARGS[name])(*args))

    def _likes(self, dim: int, r: RunSettings) -> tuple:
        """The chains' keys and the shapes of the broadcast, the client state and the setup message."""
        s, f = self.sampler, self.shared["functions"]
        ck = np.asarray(chain_keys(r.seed, np.arange(r.num_chains)))
        keys, data, ids = programs_lib.shapes((ck, self.data, self.ids))
        ss_like, bc_like = jax.eval_shape(jax.vmap(s.init), keys, jax.ShapeDtypeStruct((len(ck), dim), jnp.float32))
        cs_like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[:1] + (1,) + a.shape[2:], a.dtype),
                                         jax.eval_shape(f["init"], keys, bc_like, data, ids))
        msg_like = None
        if s.setup is not None:
            up = jax.eval_shape(f["setup"], keys, self._wide(cs_like), bc_like, data, ids)[1]
            up = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((len(ck), self.b) + a.shape[2:], a.dtype), up)
            msg_like = jax.eval_shape(jax.vmap(lambda k, ss, u: s.setup.server(k, ss, u)[1]), keys, ss_like, up)
        return ck, bc_like, cs_like, msg_like

    def handle(self, msg: dict, store: dict) -> dict:
        """Answer one server message (see the module docstring for the kinds)."""
        kind = msg["kind"]
        if kind == "hello":  # what the server checks before round 1
            return {"index": self.index, "num_clients": self.b,
                    "shapes": [list(a.shape[1:]) for a in jax.tree_util.tree_leaves(self.data.rows.x)]}
        C = self.chain_keys.shape[0]
        flags = [jax.ShapeDtypeStruct((C,), jnp.bool_)]
        state_dir = Path(msg["state_dir"]) if msg.get("state_dir") else None
        if kind == "init":
            if int(msg.get("resume_from", -1)) > 0:
                self._restore(state_dir, int(msg["resume_from"]), store)
                return {"ok": 1}
            cs = self._run("init", self.chain_keys, from_leaves(msg["broadcast"], self.bc_like), self.data, self.ids)
            store.update(committed=pack(cs), pending=pack(cs), k=-1)
            if state_dir is not None:
                self._save(state_dir, -1, store, 0)
            return {"ok": 1}
        if "committed" not in store and kind == "round":  # a restarted node: its own saved state
            self._restore(state_dir, int(msg["k"]), store)
        committed = unpack(store["committed"], self.cs_like)
        if kind == "setup":
            cs, up, info = self._run("setup", self.chain_keys, self._tile(committed),
                                     from_leaves(msg["broadcast"], self.bc_like), self.data, self.ids)
            store.update(committed=pack(cs), pending=pack(cs))
            return {"upload": leaves(up), "bits": [int(x) for x in np.asarray(info.bits)[:, 0]]}
        if kind == "setup_receive":
            cs = self._run("receive", self._tile(committed), from_leaves(msg["message"], self.msg_like))
            store.update(committed=pack(cs), pending=pack(cs))
            if state_dir is not None:
                self._save(state_dir, -1, store, 0)
            return {"ok": 1}
        if kind == "round":
            k = int(msg["k"])
            accepted = from_leaves(msg["accepted_round"], [jax.ShapeDtypeStruct((C,), jnp.int32)])[0] == store["k"]
            mask = from_leaves(msg["mask"], flags)[0]
            if msg.get("secure"):  # before any state changes: a refused round leaves the client as it was
                self._check_masks(msg, store, k, mask)
            pending = unpack(store["pending"], self.cs_like)
            cs = jax.tree_util.tree_map(lambda p, c: np.where(accepted.reshape((-1,) + (1,) * (p.ndim - 1)), p, c),
                                        pending, committed)  # runtime.round.select, per chain
            bc = from_leaves(msg["broadcast"], self.bc_like)
            new_cs, up, bits = self._run("step", self.chain_keys, self._tile(cs), bc,
                                         np.repeat(mask[:, None], self.width, axis=1), np.asarray(k, np.int32),
                                         self.data, self.ids)
            store.update(committed=pack(cs), pending=pack(new_cs), k=k)
            if state_dir is not None:
                self._save(state_dir, k, store, int(msg.get("keep", 3)))
            chains = [int(c) for c in np.flatnonzero(mask)]
            if msg.get("secure"):
                return self._masked(msg, store, state_dir, up, chains)
            reply: dict[str, Any] = {"chains": chains, "bits": [], "wire_bits": []}
            parts = items(up)
            bits = np.asarray(bits)
            for c in chains:
                enc = encode_upload([jax.tree_util.tree_map(lambda a: a[c, 0], part) for part in parts])
                reply[f"codecs/{c}"] = enc.codecs
                for j, blob in enumerate(enc.blobs):
                    reply[f"blob/{c}/{j}"] = blob
                reply["bits"].append(int(bits[c, 0]))
                reply["wire_bits"].append(int(enc.bits))
            return reply
        if kind.startswith("secagg_"):
            return self._secagg(kind, msg, store, state_dir)
        raise ValueError(f"unknown message kind {kind!r}")

    def _secagg(self, kind: str, msg: dict, store: dict, state_dir: Path | None) -> dict:
        """The key exchange of secure aggregation (:mod:`fedmcmc.runtime.messaging.secagg`): make a key
        pair (``secagg_keys``), keep the peers' public keys (``secagg_peers``), or reveal this
        client's self seeds of one round and its seeds with the clients that dropped out
        (``secagg_reveal``), under :func:`~fedmcmc.runtime.messaging.secagg.check_reveal`'s rule."""
        if kind == "secagg_keys":
            private, public = secagg.keypair()
            store.update(secagg_private=private, secagg_publics=b"")
            if not store.get("secagg_signing_key"):
                return {"public": public}
            signing = Path(store["secagg_signing_key"]).read_bytes()
            return {"public": public, "signature": secagg.sign(signing, secagg.advert(public, self.index,
                                                                                      self.key.encode())).hex()}
        if kind == "secagg_peers":
            if store.get("secagg_verify_keys"):
                self._check_keys(bytes(msg["publics"]), msg.get("signatures"), Path(store["secagg_verify_keys"]))
            store["secagg_publics"] = bytes(msg["publics"])  # what it masked and answered stays remembered
            if state_dir is not None:  # a node that restarts keeps its keys
                folder = state_dir / f"client{self.index}"
                folder.mkdir(parents=True, exist_ok=True)
                save_npz(folder / "secagg.npz", private=np.frombuffer(store["secagg_private"], np.uint8),
                         publics=np.frombuffer(store["secagg_publics"], np.uint8))
            return {"ok": 1}
        if kind == "secagg_reveal":  # per chain: the self seed, and the seeds with the dropped clients
            k, answered = int(msg["k"]), json.loads(store.get("secagg_answered", "[]"))
            masked, private = json.loads(store.get("secagg_masked", "[]")), self._keys(store, state_dir)[0]
            tag = hashlib.sha256(b"fedmcmc-secagg-tag|" + private).hexdigest()[:16]
            for c, dropped in zip(msg["chains"], msg["dropped"]):  # raises: no reply
                answered = secagg.check_reveal(answered, k, int(c), self.index, dropped, masked, tag, self.minimum)
            store["secagg_answered"] = json.dumps(answered)
            return {"self": b"".join(secagg.self_seed(private, k, int(c)) for c in msg["chains"]),
                    "seeds": b"".join(self._seed(store, state_dir, int(u), k, int(c))
                                      for c, dropped in zip(msg["chains"], msg["dropped"]) for u in dropped)}
        raise ValueError(f"unknown message kind {kind!r}")

    def _check_keys(self, publics: bytes, signatures, verify_keys: Path) -> None:
        """Refuse the relayed public keys unless each is signed by its client's SuperNode key, one
        OpenSSH public key a line of ``verify_keys`` in client order (a man in the middle swaps them)."""
        lines = [line for line in verify_keys.read_bytes().splitlines() if line.strip()]
        if len(lines) != self.b or not isinstance(signatures, list) or len(signatures) != self.b:
            raise RuntimeError(f"client {self.index}: the relayed keys carry no signature of every client's SuperNode "
                               f"key (or {verify_keys} has not {self.b} keys); refusing to mask with them")
        for j, line in enumerate(lines):
            public = publics[j * secagg.KEY_BYTES:(j + 1) * secagg.KEY_BYTES]
            if not secagg.verify(line, secagg.advert(public, j, self.key.encode()), bytes.fromhex(signatures[j])):
                raise RuntimeError(f"client {self.index}: client {j}'s relayed public key is not signed by its "
                                   "SuperNode key; refusing to mask with it")

    def _keys(self, store: dict, state_dir: Path | None) -> tuple[bytes, bytes]:
        """``(private key, the peers' public keys)``, from the node's state folder after a restart."""
        if not store.get("secagg_publics"):
            path = state_dir / f"client{self.index}" / "secagg.npz" if state_dir else None
            if path is None or not path.exists():
                raise RuntimeError(f"client {self.index} has no secure-aggregation keys (restarted without its "
                                   "state folder); it is inactive until the run is resumed")
            with np.load(path) as z:
                store.update(secagg_private=z["private"].tobytes(), secagg_publics=z["publics"].tobytes())
        return store["secagg_private"], store["secagg_publics"]

    def _seed(self, store: dict, state_dir: Path | None, peer: int, k: int, chain: int) -> bytes:
        """This client's seed with ``peer`` in round ``k`` and chain ``chain``."""
        private, publics = self._keys(store, state_dir)
        public = publics[peer * secagg.KEY_BYTES:(peer + 1) * secagg.KEY_BYTES]
        cache = self.__dict__.setdefault("_secrets", {})
        pair = (private, public)
        if pair not in cache:
            cache[pair] = secagg.pair_secret(pair[0], self.index, peer, public, self.key.encode())
        return secagg.round_seed(cache[pair], k, chain)

    def _check_masks(self, msg: dict, store: dict, k: int, mask) -> None:
        """Refuse a secure round whose active sets :func:`~fedmcmc.runtime.messaging.secagg.check_mask`
        forbids (too few clients, or another set than this round and chain had), else remember them."""
        active = np.asarray(msg["active"][0], bool)
        if active.shape != (mask.shape[0], self.b) or not np.array_equal(active[:, self.index], mask):
            raise ValueError(f"round {k}: the active sets do not match this client's participation mask")
        masked = json.loads(store.get("secagg_masked", "[]"))
        for c in np.flatnonzero(mask):
            masked = secagg.check_mask(masked, k, int(c), np.flatnonzero(active[c]).tolist(), self.minimum)
        store["secagg_masked"] = json.dumps(masked)

    def _masked(self, msg: dict, store: dict, state_dir: Path | None, up, chains) -> dict:
        """The reply of a secure round: per chain, the grid integers masked for the chain's active
        clients (``msg["active"]``, ``[C, b]``); nothing else (not even the QSGD code's length)."""
        k = int(msg["k"])
        active = np.asarray(msg["active"][0], bool)
        reply: dict[str, Any] = {"chains": chains}
        for c in chains:
            peers = [int(j) for j in np.flatnonzero(active[c])]
            seeds = {j: self._seed(store, state_dir, j, k, c) for j in peers if j != self.index}
            own = secagg.self_seed(self._keys(store, state_dir)[0], k, c)
            reply[f"masked/{c}"] = [secagg.masked(np.asarray(up.value)[c, 0], self.index, peers, seeds, own)]
        return reply

    def _restore(self, state_dir: Path | None, k: int, store: dict) -> None:
        """Load the node's latest saved state from before round ``k`` into ``store``."""
        folder = state_dir / f"client{self.index}" if state_dir else None
        saved = sorted(int(p.stem[5:]) for p in folder.glob("round*.npz") if int(p.stem[5:]) < k) if folder else []
        if not saved:
            raise RuntimeError(f"client {self.index} has no saved state before round {k} in {state_dir}")
        with np.load(folder / f"round{saved[-1]}.npz") as z:
            store.update(committed=z["committed"].tobytes(), pending=z["pending"].tobytes(), k=saved[-1])

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
