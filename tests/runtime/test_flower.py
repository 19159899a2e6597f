"""fedmcmc on Flower: the simulation engine, the wire, faults, resume (docs/flower.md); every registered
sampler gives the simulator's samples over the runtime in tests/core/test_conformance.py."""

from __future__ import annotations

import json
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.app import config
from fedmcmc.compression import quantization
from fedmcmc.runtime.flower.server import LocalTransport, ServerRuntime
from fedmcmc.runtime.flower.wire import MalformedUpload, decode_upload, encode_upload
from fedmcmc.runtime.simulator import simulate

QLSD_PP = """
[problem]
name = "heterogeneous-gaussian"
num_clients = 3
dim = 5
[sampler]
name = "qlsd++"
step_size = 1e-3
batch_size = 5
refresh_every = 2
compression = { bits = 4 }
participation = { p = 0.7, scaling = "inverse_probability" }
[run]
seed = 3
num_chains = 2
num_iterations = 6
burn_in = 2
thinning = 2
chunk_size = 4
"""

#: Also run on the deployment engine (tests/runtime/test_flower_deploy.py).
FA_HMC = """
[problem]
name = "heterogeneous-gaussian"
num_clients = 3
dim = 4
min_size = 10
max_size = 30
[sampler]
name = "fa-hmc"
step_size = 0.05
num_leapfrog = 3
local_steps = 4
clock = "leapfrog"
correlation = 0.5
debiased = true
compression = { bits = 8 }
[run]
seed = 1
num_chains = 2
num_iterations = 4
"""


def reference(text):
    cfg = tomllib.loads(text)
    built = config.build(cfg)
    r = cfg["run"]
    return simulate(r.get("seed", 0), built.sampler, built.data, np.zeros(built.model.dim),
                    r["num_iterations"], num_chains=r["num_chains"], burn_in=r.get("burn_in", 0),
                    thinning=r.get("thinning", 1))


def test_flower_simulation_engine_gives_the_simulators_samples_bit_for_bit(tmp_path):
    """The Flower apps on the simulation engine (every sampler over the runtime without Flower:
    tests/core/test_conformance.py)."""
    from fedmcmc.app.flower.launch import run_sim_many

    out = tmp_path / "qlsdpp"
    payload, = run_sim_many([(QLSD_PP, out)])
    ref = reference(QLSD_PP)
    chunks = sorted((out / "chunks").glob("chunk_*.npz"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    res_json = json.loads((out / "results.json").read_text())
    assert (out / "posterior.nc").exists()
    assert res_json == payload and res_json["flower"]["engine"] == "simulation"
    assert res_json["flower"]["wire_bits_mismatch"] == 0 and res_json["flower"]["rejected_uploads"] == 0
    assert res_json["upload_bits_per_chain"] == float(ref.total_bits_up.mean())
    np.testing.assert_array_equal(samples, ref.samples)  # bit for bit


def test_wire_rejects_malformed_uploads():
    like = [jax.ShapeDtypeStruct((4,), np.float32)]
    v = np.array([1.0, -2.0, 0.5, 0.0], np.float32)
    enc = encode_upload([v])
    out, bits = decode_upload(enc.codecs, enc.blobs, like, 1e8)
    np.testing.assert_array_equal(out[0], v)
    assert bits == enc.bits == 128
    # a compressor's message travels whole, as its QSGD code, and comes back field for field
    q = quantization(16)
    message, _, info = q.apply(jax.random.key(0), jnp.asarray(v), q.init(v))
    message_like = [jax.eval_shape(lambda: message)]
    enc = encode_upload([jax.tree_util.tree_map(np.asarray, message)])
    fields, bits = decode_upload(enc.codecs, enc.blobs, message_like, 1e8)
    assert enc.codecs == ["qsgd/16"] and bits == enc.bits == int(info.bits)
    for got, want in zip(fields, message):
        np.testing.assert_array_equal(got, np.asarray(want))
    with pytest.raises(MalformedUpload):  # a message must come as its code, not as floats
        decode_upload(["f32"], [encode_upload([v]).blobs[0]], message_like, 1e8)
    bad = [(["f32"], [b"\x00" * 12]),                                  # wrong length
           (["f32"], [np.array([np.nan, 0, 0, 0], np.float32).tobytes()]),  # NaN
           (["f32"], [np.array([1e9, 0, 0, 0], np.float32).tobytes()]),     # absurd norm
           (["qsgd/16"], [b"\xff\xff\xff"]),                              # undecodable
           (["raw"], [v.tobytes()]),                                     # wrong codec for the dtype
           (["f32", "f32"], [v.tobytes(), v.tobytes()])]                 # wrong number of arrays
    for codecs, blobs in bad:
        with pytest.raises(MalformedUpload):
            decode_upload(codecs, blobs, like, 1e8)


def test_faults_failed_and_malformed_clients_are_inactive_and_never_applied(tmp_path, caplog):
    """Client 1's round-1 upload is garbage, client 0 fails in round 2, client 2 sends NaN in
    round 3: each is inactive that round, on the server and on the client (QLSD++ memory terms
    stay in step: the server's sum equals the clients' committed memories)."""
    def faults(kind, k, i, reply):
        if kind != "round" or reply is None:
            return reply
        if (k, i) == (1, 1):
            for name in reply:
                if name.startswith("blob/"):
                    reply[name] = b"\xff\x00garbage"
        if (k, i) == (2, 0):
            return None
        if (k, i) == (3, 2):
            for c in reply["chains"]:
                reply[f"codecs/{c}"] = ["f32"]
                reply[f"blob/{c}/0"] = np.full(5, np.nan, np.float32).tobytes()
        return reply

    text = QLSD_PP.replace("participation = { p = 0.7, scaling = \"inverse_probability\" }", "")
    transport = LocalTransport(text, 3, config.from_text, faults)
    server = ServerRuntime(text, tmp_path, config.from_text)
    res = server.run(transport)
    assert np.all(np.isfinite(res.samples))
    assert server.stats["rejected_uploads"] == 2 and server.stats["missing_replies"] == 1
    # full participation: 3 clients x 6 rounds minus the three faults, per chain
    assert res.total_bits_up.shape == (2,)
    assert int(res.active.sum(axis=1)[0]) <= 3 * 6 - 3
    # each client's memory term: its last result if the server accepted it, else the one before
    from fedmcmc.runtime.flower.wire import unpack

    with np.load(tmp_path / "chunks" / "state.npz") as z:
        server_memory, accepted = z["ss1"], z["accepted"]  # QLSDPPState(position, memory)
    memories = []
    for i, client in transport.clients.items():
        pending = unpack(transport.stores[i]["pending"], client.cs_like)
        committed = unpack(transport.stores[i]["committed"], client.cs_like)
        memories.append(np.where(accepted[:, i, None], np.asarray(pending.compressor.memory)[:, 0],
                                 np.asarray(committed.compressor.memory)[:, 0]))
    np.testing.assert_allclose(np.sum(memories, axis=0), server_memory, rtol=1e-5, atol=1e-5)


def test_server_resumes_after_a_restart_with_the_same_samples(tmp_path):
    class Crash(RuntimeError):
        pass

    def crash_in_round_5(kind, k, i, reply):
        if kind == "round" and k == 5:
            raise Crash("server killed")
        return reply

    transport = LocalTransport(QLSD_PP, 3, config.from_text, crash_in_round_5)
    with pytest.raises(Crash):
        ServerRuntime(QLSD_PP, tmp_path, config.from_text).run(transport)
    transport.faults = None
    transport.stores = {i: {} for i in range(3)}  # a new run: the nodes' Context.state is gone
    res = ServerRuntime(QLSD_PP, tmp_path, config.from_text, resume=True).run(transport)
    np.testing.assert_array_equal(res.samples, reference(QLSD_PP).samples)


def test_no_raw_data_leaves_a_client(tmp_path):
    """Every reply of every client is inspected: only uploads of the sampler's size, and no
    data point's bytes (nor the data set's) appear in any of them."""
    text = QLSD_PP.replace("num_iterations = 6", "num_iterations = 4")
    replies = []

    def record(kind, k, i, reply):
        replies.append((i, reply))
        return reply

    transport = LocalTransport(text, 3, config.from_text, record)
    ServerRuntime(text, tmp_path, config.from_text).run(transport)
    data = config.build(tomllib.loads(text)).data
    d = 5
    assert {r[0] for r in replies} == {0, 1, 2}
    for i, reply in replies:
        raw = data.unpadded(i)
        assert set(reply) <= {"index", "ok", "chains", "bits", "wire_bits"} | {
            f"{p}/{c}" for p in ("codecs",) for c in range(2)} | {f"blob/{c}/0" for c in range(2)}
        for name, value in reply.items():
            if isinstance(value, bytes):
                assert len(value) <= 4 * d + 8  # at most one float32 vector of dimension d
                for row in np.asarray(raw, np.float32).reshape(len(raw), -1):
                    assert row.tobytes() not in value
