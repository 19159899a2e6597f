"""Secure aggregation (docs/privacy.md, "Secure aggregation"): the masking protocol with a dropout,
the fixed-point grid it sums, and a secure run's samples equal to the plain run's (the loopback
deployment: tests/runtime/test_flower_deploy.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.app import config
from fedmcmc.app.bench.secure_aggregation import protocol_seconds
from fedmcmc.compression import FixedPointMessage, decode, encode, resolve_compressor
from fedmcmc.runtime.messaging import secagg
from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime

from test_flower import QLSD_PP, reference

#: QLSD++ of test_flower.py with its uploads on the grid 2^-16 Z (one p for all clients).
GRID = "{ bits = 4, fixed_point = { fraction_bits = 16, max_abs = 1000.0 } }"
QLSD_PP_GRID = QLSD_PP.replace("{ bits = 4 }", GRID)


def test_double_masks_cancel_a_dropout_is_unmasked_and_a_late_upload_stays_masked():
    """Four clients; the pair secrets agree on both sides; each masked upload looks nothing like
    its integers; the survivors' sum is unmasked exactly with their self seeds after client 2 drops
    out, with only the seeds of this round and chain revealed (another round's seed differs).
    Client 2's late upload with every seed revealed for it stays masked by its self-mask, which no
    client reveals: a client declared dropped keeps its self seed, and a client answers one
    dropped set per round and chain (Bonawitz's double masking)."""
    n, d, k, chain, context = 4, 1000, 7, 1, b"run"
    keys = [secagg.keypair() for _ in range(n)]
    secret = {(i, j): secagg.pair_secret(keys[i][0], i, j, keys[j][1], context)
              for i in range(n) for j in range(n) if i != j}
    assert all(secret[(i, j)] == secret[(j, i)] for i, j in secret)
    rng = np.random.default_rng(0)
    q = rng.integers(-2 ** 20, 2 ** 20, size=(n, d)).astype(np.int32)
    active = list(range(n))
    seeds = {i: {j: secagg.round_seed(secret[(i, j)], k, chain) for j in active if j != i} for i in active}
    own = {i: secagg.self_seed(keys[i][0], k, chain) for i in active}
    y = {i: secagg.masked(q[i], i, active, seeds[i], own[i]) for i in active}
    assert all(np.mean(y[i].view(np.int32) == q[i]) < 0.01 for i in active)  # masked
    np.testing.assert_array_equal(secagg.unmask(y, [], {}, own), q.sum(axis=0))  # masks cancel
    survivors = {i: y[i] for i in active if i != 2}
    revealed = {(j, 2): seeds[j][2] for j in survivors}
    np.testing.assert_array_equal(secagg.unmask(survivors, [2], revealed, own), q[[0, 1, 3]].sum(axis=0))
    assert secagg.round_seed(secret[(0, 2)], k + 1, chain) != revealed[(0, 2)]
    assert secagg.self_seed(keys[0][0], k + 1, chain) != own[0]
    with pytest.raises(KeyError):
        secagg.unmask(survivors, [2], {}, own)
    pairwise_only = y[2].copy()  # the late upload, its pairwise masks removed with the revealed seeds
    for j in survivors:
        m = secagg.mask(revealed[(j, 2)], d)
        pairwise_only = pairwise_only - m if j > 2 else pairwise_only + m
    late = pairwise_only.view(np.int32)
    assert np.mean(late == q[2]) < 0.01  # still hidden by its self-mask
    np.testing.assert_array_equal(late - secagg.mask(own[2], d).view(np.int32), q[2])  # ... and by it alone
    masked = secagg.check_mask([], k, chain, active)
    answered = secagg.check_reveal([], k, chain, 0, [2], masked, "keys")
    with pytest.raises(ValueError, match="declared dropped"):
        secagg.check_reveal(answered, k, chain, 2, [2], masked, "keys")  # client 2 keeps its self seed
    with pytest.raises(ValueError, match="was already answered for the dropped clients"):
        secagg.check_reveal(answered, k, chain, 0, [], masked, "keys")  # ... and client 0 its other set
    with pytest.raises(ValueError, match="older than"):
        secagg.check_reveal([[k + secagg.MEMORY + 1, 0, [], "keys"]], k, chain, 0, [], masked, "keys")
    assert set(protocol_seconds(3, 10, repeats=1)) == {"clients_masking", "server_unmasking",
                                                       "server_unmasking_one_dropout"}  # the bench runs
    # sums beyond the int32 range wrap alike in the protocol and in the sampler's int32 sum
    big = np.full((2, 3), 2 ** 30 + 5, np.int32)
    pair = {0: {1: seeds[0][1]}, 1: {0: seeds[1][0]}}
    wrapped = secagg.unmask({i: secagg.masked(big[i], i, [0, 1], pair[i], own[i]) for i in (0, 1)}, [], {}, own)
    np.testing.assert_array_equal(wrapped, np.asarray(jnp.sum(jnp.asarray(big), axis=0, dtype=jnp.int32)))


@pytest.mark.slow
def test_fixed_point_sums_integers_travels_as_its_inner_message_and_refuses_unequal_weights():
    comp = resolve_compressor({"bits": 4, "fixed_point": {"fraction_bits": 16, "max_abs": 2.0}})
    v = jnp.array([0.3, -1.7, 5.0, 0.0])
    msg, _, info = comp.apply(jax.random.PRNGKey(0), v, comp.init(v, 0))
    assert int(jnp.max(jnp.abs(msg.value))) <= 2 * 2 ** 16  # clipped to max_abs
    np.testing.assert_array_equal(comp.decode(msg), np.asarray(msg.value, np.float32) / 2 ** 16)
    wire = encode(msg)
    assert wire.codec == "qsgd/16" and wire.bits == int(info.bits)  # the grid costs no bit
    back = decode(wire.codec, wire.data, jax.eval_shape(lambda: msg)).message
    assert isinstance(back, FixedPointMessage) and not back.value.any()  # the receiver recomputes q
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), back, back, back)
    total = comp.aggregate(jnp.array([0.5, 0.0, 0.5]), stacked)
    np.testing.assert_array_equal(total, 0.5 * (2 * np.asarray(msg.value, np.float32) / 2 ** 16))
    with pytest.raises(ValueError, match="does not travel"):
        encode(msg._replace(offset=msg.value))
    with pytest.raises(ValueError, match="fraction_bits"):
        resolve_compressor({"levels": 4, "fixed_point": {"fraction_bits": 40, "max_abs": 1.0}})
    text = QLSD_PP_GRID.replace("p = 0.7,", "p = [0.7, 0.8, 0.9],")
    with pytest.raises(ValueError, match="participation weight must be the same for every client"):
        config.from_text(text)


@pytest.mark.slow
def test_secure_run_gives_the_plain_runs_samples_with_a_dropout(tmp_path):
    """In process (LocalTransport): client 1 fails in round 2; the survivors reveal their seeds with
    it, and the secure run's samples, its server killed in round 3 and resumed from round 2 (the
    clients' keys lost and exchanged again), equal the plain run's bit for bit; without the failure the plain
    run is the simulator's, so the grid is the same chain in every runtime. A malformed masked
    upload for one chain drops that client from that chain only (its seeds revealed there), with
    the key advertisements signed by the SuperNodes' keys (unsigned or foreign keys refused). A
    QLSD# run with [privacy] clip (inside the grid) gives the simulator's samples securely too."""
    class Crash(RuntimeError):
        pass

    def drop(kind, k, i, reply):
        return None if (kind == "round" and k == 2 and i == 1) else reply

    def crash(kind, k, i, reply):  # the secure server is killed in round 3, then resumed
        if kind == "round" and k == 3:
            raise Crash("server killed")
        return drop(kind, k, i, reply)

    # every chain keeps 2 active clients or more in every round, client 1's failure included (a secure round
    # with fewer survivors applies no client, where the plain run applies the survivor's upload)
    text = (QLSD_PP_GRID.replace("num_iterations = 6", "num_iterations = 4").replace("chunk_size = 4", "chunk_size = 2")
            .replace("p = 0.7", "p = 0.8").replace("seed = 3", "seed = 6"))
    runs = {}
    for secure, faults in ((False, None), (False, drop), (True, crash)):
        t = text + ("\n[flower]\nsecure_aggregation = true\n" if secure else "")
        folder, transport = tmp_path / f"{secure}{faults is None}", LocalTransport(t, 3, config.from_text, faults)
        if secure:
            with pytest.raises(Crash):
                ServerRuntime(t, folder, config.from_text).run(transport)
            transport.faults, transport.stores = drop, {i: {} for i in range(3)}  # new Context.state: new keys
        server = ServerRuntime(t, folder, config.from_text, resume=secure)
        runs[secure, faults is None] = server.run(transport).samples
        stats = server.stats
    np.testing.assert_array_equal(runs[False, True], reference(text, started=False).samples)
    np.testing.assert_array_equal(runs[True, False], runs[False, False])
    assert not np.array_equal(runs[False, False], runs[False, True])  # the dropout mattered
    assert stats["missing_replies"] == 1 and stats["secagg_recoveries"] >= 1  # round 2, after the resume
    assert stats["secagg_bits_down"] > 0 and stats["rejected_uploads"] == 0

    def garble(kind, k, i, reply):  # client 2's upload for chain 0 of round 1 only
        if kind == "round" and k == 1 and i == 2 and "masked/0" in reply:
            reply["masked/0"] = [reply["masked/0"][0].astype(np.int64)]
        return reply

    from test_flower_deploy import make_node_keys  # SuperNode authentication keys sign the key advertisements

    t = text + "\n[flower]\nsecure_aggregation = true\n"
    server = ServerRuntime(t, tmp_path / "garbled", config.from_text)
    transport = LocalTransport(t, 3, config.from_text, faults=garble)
    keys = make_node_keys(tmp_path, 3)
    (tmp_path / "verify").write_bytes(b"".join(public.read_bytes() + b"\n" for _, public in keys))
    for i in range(3):
        transport.stores[i].update(secagg_signing_key=str(keys[i][0]), secagg_verify_keys=str(tmp_path / "verify"))
    res = server.run(transport)
    assert server.stats["rejected_uploads"] == 1 and server.stats["secagg_recoveries"] == 1
    assert server.stats["secagg_self_bits"] > 0  # double masking: the survivors' self seeds, every round
    ask = {"kind": "secagg_reveal", "state_dir": None, "k": 1, "chains": [0], "dropped": [[2]]}
    with pytest.raises(ValueError, match="declared dropped"):  # client 2's self seed of chain 0 stays secret
        transport.clients[2].handle(ask, transport.stores[2])
    with pytest.raises(ValueError, match="was already answered for the dropped clients"):  # once per round, chain
        transport.clients[0].handle({**ask, "dropped": [[]]}, transport.stores[0])
    publics = b"".join(secagg.keypair()[1] for _ in range(3))  # a man in the middle's keys, relayed unsigned
    with pytest.raises(RuntimeError, match="carry no signature"):
        transport.clients[0].handle({"kind": "secagg_peers", "publics": publics}, transport.stores[0])
    signatures = [secagg.sign(keys[j][0].read_bytes(), secagg.advert(publics[32 * j:32 * (j + 1)], j, b"x")).hex()
                  for j in range(3)]  # signed, but not for this run
    with pytest.raises(RuntimeError, match="client 0's relayed public key is not signed"):
        transport.clients[1].handle({"kind": "secagg_peers", "publics": publics, "signatures": signatures},
                                    transport.stores[1])
    assert np.isfinite(res.samples).all() and not np.array_equal(res.samples, runs[False, True])
    # differential privacy with secure aggregation: QLSD# clipped inside the grid, the simulator's samples
    private = (text.replace('"qlsd++"', '"qlsd#"').replace("refresh_every = 2\n", "")
               + "\n[privacy]\ndelta = 1e-5\nclip = 0.05\n")
    server = ServerRuntime(private + "\n[flower]\nsecure_aggregation = true\n", tmp_path / "dp", config.from_text)
    res = server.run(LocalTransport(private + "\n[flower]\nsecure_aggregation = true\n", 3, config.from_text))
    np.testing.assert_array_equal(res.samples, reference(private, started=False).samples)
    assert server.built.privacy["client"]["epsilon"] > 0 and server.built.sampler.name == "qlsd#"
    with pytest.raises(ValueError, match="secure_aggregation needs uploads on a fixed-point grid"):
        ServerRuntime(QLSD_PP + "\n[flower]\nsecure_aggregation = true\n", tmp_path / "no", config.from_text)
    with pytest.raises(ValueError, match="secure_aggregation must be true or false"):
        ServerRuntime(text + "\n[flower]\nsecure_aggregation = 1\n", tmp_path / "no", config.from_text)


def test_a_grid_whose_sum_could_wrap_is_refused_where_it_is_chosen():
    """40 clients at max_abs = 1000 on the grid 2^-16: 40 B = 2.6e9 >= 2^31, so 40 uploads of about
    994 would sum to a wrapped int32; refused in one line naming the largest fraction_bits that fits."""
    spec = {"bits": 4, "fixed_point": {"fraction_bits": 16, "max_abs": 1000.0}}
    with pytest.raises(ValueError, match=r"40 clients x .* reaches 2\*\*31.*set fraction_bits <= 15$"):
        resolve_compressor(spec, clients=40)
    assert resolve_compressor(spec, clients=32).name.startswith("fixed_point")  # 32 B < 2^31
    text = QLSD_PP_GRID.replace("num_clients = 3", "num_clients = 40")
    assert "num_clients = 40" in text
    with pytest.raises(ValueError, match="the int32 sum of the uploads can wrap; set fraction_bits <= 15"):
        config.from_text(text)


def test_a_sum_of_fewer_than_two_clients_is_never_revealed():
    """The client's rules: it masks a round and chain for at least secure_min_clients (2) active
    clients and for one active set only (a server that sends the round again with the client alone
    is refused), and reveals only for a round and chain it masked, while 2 of its active clients
    survive, once per key pair and for one dropped set whatever the keys."""
    k, chain = 5, 0
    with pytest.raises(ValueError, match="1 active client"):
        secagg.check_mask([], k, chain, [0])
    masked = secagg.check_mask([], k, chain, [0, 1])
    assert secagg.check_mask(masked, k, chain, [1, 0]) == masked  # the same set again (a resumed server)
    with pytest.raises(ValueError, match="was masked for the active clients"):
        secagg.check_mask(masked, k, chain, [0, 2])
    with pytest.raises(ValueError, match="fewer than the 2"):
        secagg.check_reveal([], k, chain, 0, [1], masked, "keys")  # the survivor's sum is its upload
    with pytest.raises(ValueError, match="was not masked by this client"):
        secagg.check_reveal([], k + 1, chain, 0, [], masked, "keys")
    answered = secagg.check_reveal([], k, chain, 0, [], masked, "keys")
    with pytest.raises(ValueError, match="already answered"):
        secagg.check_reveal(answered, k, chain, 0, [], masked, "keys")
    assert secagg.check_reveal(answered, k, chain, 0, [], masked, "new keys")[-1] == [k, chain, [], "new keys"]
    with pytest.raises(ValueError, match="already answered"):  # new keys, another dropped set: another sum
        secagg.check_reveal(answered, k, chain, 0, [1], secagg.check_mask([], k, chain, [0, 1, 2]), "new keys")


@pytest.mark.slow
def test_a_secure_server_refuses_one_survivor_replays_and_forged_words(tmp_path):
    """In process: two clients active in a chain, one failing, leave one survivor: its upload is not
    unmasked (no client applied, counted). A client's masked upload replayed from an earlier round,
    and random words, unmask to a sum outside n B and are rejected (counted); a client asked to mask
    a round again with itself alone refuses."""
    text = QLSD_PP_GRID.replace("num_iterations = 6", "num_iterations = 4").replace("chunk_size = 4", "chunk_size = 2")
    text += "\n[flower]\nsecure_aggregation = true\n"  # chain 1 of round 0: clients 0 and 1 active

    def drop(kind, k, i, reply):
        return None if (kind == "round" and k == 0 and i == 1) else reply

    server = ServerRuntime(text, tmp_path / "one", config.from_text)
    transport = LocalTransport(text, 3, config.from_text, drop)
    server.run(transport)
    assert server.stats["secagg_too_few"] >= 1 and server.stats["missing_replies"] == 1
    alone = {"kind": "round", "state_dir": None, "k": 0, "secure": 1, "keep": 4,
             "broadcast": [], "mask": [np.array([True, True])], "accepted_round": [np.array([-1, -1], np.int32)],
             "active": [np.array([[True, False, False], [True, False, False]])]}
    with pytest.raises(ValueError, match="1 active client"):
        transport.clients[0].handle(alone, transport.stores[0])
    again = {**alone, "active": [np.array([[True, False, True], [True, True, True]])]}
    with pytest.raises(ValueError, match="was masked for the active clients"):
        transport.clients[0].handle(again, transport.stores[0])

    first = {}

    def replay(kind, k, i, reply):  # client 0 sends its round-0 upload again in round 2; client 2 random words
        if kind == "round" and i == 0 and reply is not None:
            if k == 0:
                first.update({key: value for key, value in reply.items() if key.startswith("masked/")})
            elif k == 2:
                reply.update({key: value for key, value in first.items() if key in reply})
        if kind == "round" and i == 2 and k == 3 and reply is not None:
            rng = np.random.default_rng(1)
            reply.update({key: [rng.integers(0, 2 ** 32, len(value[0]), dtype=np.uint64).astype(np.uint32)]
                          for key, value in reply.items() if key.startswith("masked/")})
        return reply

    server = ServerRuntime(text, tmp_path / "replay", config.from_text)
    res = server.run(LocalTransport(text, 3, config.from_text, replay))
    assert server.stats["secagg_out_of_range"] >= 2 and np.isfinite(res.samples).all()
