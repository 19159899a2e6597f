"""``secure_aggregation``: what secure aggregation adds to a QLSD++ round, in bits and in time.

The run is QLSD++ (8-bit QSGD on the fixed-point grid ``2^-16 Z``, ``|x| <= 1000``, full
participation, minibatches of 5, one chain) on the heterogeneous Gaussian problem with
``clients`` clients and dimension ``dim``, over :class:`~fedmcmc.runtime.messaging.server.ServerRuntime`
and :class:`~fedmcmc.runtime.messaging.server.LocalTransport` (the server and every client in this
process, no Flower): ``plain`` (the QSGD code travels), ``secure`` (masked grid integers,
:mod:`fedmcmc.runtime.messaging.secagg`) and ``secure_dropout`` (client 0 fails every round, so
the survivors reveal their seeds with it each round). The three runs are interleaved,
``repeats`` times; a run's time per round is the median of its rounds, the best over repeats.

Reported per client and round: the upload bits (the sampler's QSGD count in the plain run; the
masked upload, ``32 d``, and the revealed seeds in the secure runs) and their ratio, and of them
the self seeds of double masking (256 bits per chain, revealed every round); the
key exchange's bits once per run; and the time ratios ``secure / plain`` and
``secure_dropout / plain`` (the secure runs skip the QSGD code's host coding, which the plain run
pays), and the protocol's own seconds per round (every client's masking, the server's
unmasking, with and without a dropout, :func:`protocol_seconds`) over a plain round. On a
deployment a round also pays for moving ``4 d`` bytes per client instead of the QSGD code, and
one more message exchange, the survivors' seeds (docs/privacy.md, "Secure aggregation").
There is no target: the cost is measured, not bounded.

With ``fedmcmc bench --flower``, :func:`deployment` runs the same QLSD++ (the ``--flower``
problem: 3 clients, ``d = 10``, 2 chains) plain and secure on the loopback deployment of
:mod:`fedmcmc.app.bench.flower`, one after the other, and reports the ratio of their median
seconds per round and reply bytes (``flower_secagg_round_ratio``).
"""

from __future__ import annotations

import numpy as np

CONFIG = """
[problem]
name = "heterogeneous-gaussian"
num_clients = {clients}
dim = {dim}
[sampler]
name = "qlsd++"
step_size = 1e-4
batch_size = 5
refresh_every = 10
compression = {{ bits = 8, fixed_point = {{ fraction_bits = 16, max_abs = 1000.0 }} }}
[run]
seed = 0
num_chains = 1
num_iterations = {rounds}
chunk_size = {rounds}
"""


def deployment(dep, out, problem: str, run: str, rounds: int) -> dict:
    """Plain and secure QLSD++ on a running ``LocalDeployment`` ``dep``: their ``flower`` entries
    and the ratios ``secure / plain`` of the median round seconds and reply bytes."""
    sampler = CONFIG.format(clients=0, dim=0, rounds=0).split("[sampler]")[1].split("[run]")[0]
    got = {}
    for name, extra in (("plain", ""), ("secure", "secure_aggregation = true\n")):
        path = out / f"qlsd++-grid-{name}.toml"
        path.write_text(problem + "[sampler]" + sampler + run.format(rounds=rounds) + extra)
        flower = dep.run(path, out / f"qlsd++-grid-{name}", timeout=3600)["flower"]
        got[name] = {k: flower[k] for k in ("median_round_seconds", "max_round_seconds", "median_round_reply_bytes",
                                            "missing_replies")}
    return {"flower_secagg_round_ratio": got["secure"]["median_round_seconds"] / got["plain"]["median_round_seconds"],
            "flower_secagg_reply_bytes_ratio": (got["secure"]["median_round_reply_bytes"]
                                                / got["plain"]["median_round_reply_bytes"]),
            "flower_secagg_target": None, "flower_secagg": got}


def _run(text: str, folder, faults=None) -> tuple[float, dict, float]:
    from fedmcmc.app import config
    from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime

    server = ServerRuntime(text, folder, config.from_text)
    res = server.run(LocalTransport(text, server.b, config.from_text, faults=faults))
    return float(np.median(server.stats["round_seconds"])), server.stats, float(res.total_bits_up.mean())


def protocol_seconds(clients: int, dim: int, repeats: int = 5) -> dict:
    """Seconds of the protocol alone in one round of one chain: every client's masking (key
    agreement with its peers, seeds, masks) and the server's unmasking, with and without one
    client dropped (the survivors' seeds revealed); best of ``repeats``."""
    import time

    from fedmcmc.runtime.messaging import secagg as protocol

    keys = [protocol.keypair() for _ in range(clients)]
    q = np.random.default_rng(0).integers(-2 ** 20, 2 ** 20, (clients, dim)).astype(np.int32)
    active, best = list(range(clients)), {"clients_masking": float("inf"), "server_unmasking": float("inf"),
                                          "server_unmasking_one_dropout": float("inf")}
    for _ in range(repeats):
        t0 = time.perf_counter()
        seeds = {i: {j: protocol.round_seed(protocol.pair_secret(keys[i][0], i, j, keys[j][1], b"bench"), 1, 0)
                     for j in active if j != i} for i in active}
        own = {i: protocol.self_seed(keys[i][0], 1, 0) for i in active}
        y = {i: protocol.masked(q[i], i, active, seeds[i], own[i]) for i in active}
        t1 = time.perf_counter()
        protocol.unmask(y, [], {}, own)
        t2 = time.perf_counter()
        protocol.unmask({i: y[i] for i in active[1:]}, [0], {(j, 0): seeds[j][0] for j in active[1:]}, own)
        t3 = time.perf_counter()
        for name, t in zip(best, (t1 - t0, t2 - t1, t3 - t2)):
            best[name] = min(best[name], t)
    return best


def run(folder, quick: bool = False, clients: int = 3, dim: int | None = None, rounds: int | None = None,
        repeats: int | None = None) -> dict:
    """Measure (module docstring); ``folder`` holds the runs' outputs."""
    dim = dim or (200 if quick else 2_000)
    rounds = rounds or (10 if quick else 40)
    repeats = repeats or (2 if quick else 3)
    base = CONFIG.format(clients=clients, dim=dim, rounds=rounds)
    secure = base + "\n[flower]\nsecure_aggregation = true\n"
    def drop(kind, k, i, reply):
        return None if (kind == "round" and i == 0) else reply

    cases = {"plain": (base, None), "secure": (secure, None), "secure_dropout": (secure, drop)}
    best = {name: float("inf") for name in cases}
    stats, plain_bits = {}, 0.0
    for r in range(repeats):
        for name, (text, faults) in cases.items():
            seconds, stats[name], bits = _run(text, f"{folder}/{name}{r}", faults)
            best[name] = min(best[name], seconds)
            plain_bits = bits if name == "plain" else plain_bits
    per = rounds * clients
    up = {"plain": plain_bits / per, "secure": stats["secure"]["secagg_bits_up"] / per,
          "secure_dropout": stats["secure_dropout"]["secagg_bits_up"] / (rounds * (clients - 1))}
    keys = {"up": clients * 256, "down": clients * clients * 256}
    for name in ("secure", "secure_dropout"):  # the key exchange, reported apart
        up[name] -= keys["up"] / (per if name == "secure" else rounds * (clients - 1))
    protocol = protocol_seconds(clients, dim)
    return {
        "upload_bits_per_client_round": up,
        "protocol_seconds_per_round": protocol,
        "protocol_over_plain_round": (protocol["clients_masking"] + protocol["server_unmasking"]) / best["plain"],
        "upload_bits_ratio_secure_over_plain": up["secure"] / up["plain"],
        "double_masking_bits_per_client_round": stats["secure"]["secagg_self_bits"] / per,
        "key_exchange_bits_per_run": keys,
        "round_seconds_in_process": best,
        "round_time_ratio_secure_over_plain": best["secure"] / best["plain"],
        "round_time_ratio_secure_dropout_over_plain": best["secure_dropout"] / best["plain"],
        "target": None,
        "settings": {"sampler": "qlsd++", "bits": 8, "fraction_bits": 16, "clients": clients, "dim": dim,
                     "rounds": rounds, "repeats": repeats, "transport": "LocalTransport (in process)"},
    }
