"""fedmcmc on Flower: the simulation engine, the wire, faults, resume (docs/flower.md); every registered
sampler gives the simulator's samples over the runtime in tests/core/test_conformance.py."""

from __future__ import annotations

import json
import socket
import signal
import subprocess
import sys
import time
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.app import config
from fedmcmc.compression import quantization
from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime
from fedmcmc.runtime.messaging.wire import MalformedUpload, decode_upload, encode_upload
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


def reference(text, base_dir=None, started=True):
    """The simulator's run of ``text``, from the starting points the Flower apps' server gives it
    (``started``): those of ``[run] init``; else from zeros, as a ``ServerRuntime`` built by
    ``config.from_text``."""
    cfg = tomllib.loads(text)
    built = config.build(cfg, base_dir)
    start = config.with_start(cfg, built).start if started else None
    r = cfg["run"]
    return simulate(r.get("seed", 0), built.sampler, built.data,
                    np.zeros((r["num_chains"], built.model.dim)) if start is None else start,
                    r["num_iterations"], num_chains=r["num_chains"], burn_in=r.get("burn_in", 0),
                    thinning=r.get("thinning", 1))


@pytest.mark.slow
def test_flower_simulation_engine_gives_the_simulators_samples_bit_for_bit(tmp_path):
    """The Flower apps on the simulation engine (every sampler over the runtime without Flower:
    tests/core/test_conformance.py)."""
    from fedmcmc.app.flower.launch import run_sim

    out = tmp_path / "qlsdpp"
    (tmp_path / "run.toml").write_text(QLSD_PP)
    payload = run_sim(tmp_path / "run.toml", out)
    ref = reference(QLSD_PP)
    chunks = sorted((out / "chunks").glob("chunk_*.npz"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    res_json = json.loads((out / "results.json").read_text())
    assert (out / "posterior.nc").exists()
    assert res_json == payload and res_json["flower"]["engine"] == "simulation"
    assert res_json["flower"]["wire_bits_mismatch"] == 0 and res_json["flower"]["rejected_uploads"] == 0
    assert res_json["flower"]["replayed_uploads"] == 0 and res_json["flower"]["copied_uploads"] == 0
    # the posterior check of a Flower run: the server of a [problem] finds the mode (too few rounds to conclude)
    assert res_json["laplace"]["available"] is True and res_json["posterior_check"]["passed"] is None
    assert res_json["upload_bits_per_chain"] == float(ref.total_bits_up.mean())
    np.testing.assert_array_equal(samples, ref.samples)  # bit for bit


@pytest.mark.slow
def test_a_whitened_run_gives_the_simulators_samples_bit_for_bit(tmp_path):
    """QLSD* with step_size = "auto" whitens ([run] whiten = "auto"): the server and its clients
    (``LocalTransport``, each built from the config as the Flower apps build them) make the same
    whitening and give the simulator's draws of z bit for bit; mapped back, the draws are theta's."""
    import functools

    text = QLSD_PP.replace('name = "qlsd++"', 'name = "qlsd*"').replace("step_size = 1e-3", 'step_size = "auto"')
    text = text.replace("batch_size = 5\nrefresh_every = 2\n", "")
    server = ServerRuntime(text, tmp_path, functools.partial(config.from_text, start=True))
    res = server.run(LocalTransport(text, server.b, config.from_text))
    assert server.built.whitening[1]["used"]
    np.testing.assert_array_equal(res.samples, reference(text).samples)
    theta = config.in_theta(server.built, res).samples
    np.testing.assert_allclose(theta, server.built.whitening[0].to_theta(res.samples), rtol=0)
    assert np.abs(theta.mean(axis=(0, 1)) - server.built.exact.mean).max() < 1.0  # near the posterior, not z's origin


def test_wire_rejects_malformed_uploads():
    like = [jax.ShapeDtypeStruct((4,), np.float32)]
    v = np.array([1.0, -2.0, 0.5, 0.0], np.float32)
    enc = encode_upload([v])
    out, bits, _ = decode_upload(enc.codecs, enc.blobs, like, 1e8)
    np.testing.assert_array_equal(out[0], v)
    assert bits == enc.bits == 128
    # a compressor's message travels whole, as its QSGD code, and comes back field for field
    q = quantization(16)
    message, _, info = q.apply(jax.random.key(0), jnp.asarray(v), q.init(v))
    message_like = [jax.eval_shape(lambda: message)]
    enc = encode_upload([jax.tree_util.tree_map(np.asarray, message)])
    fields, bits, _ = decode_upload(enc.codecs, enc.blobs, message_like, 1e8)
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


@pytest.mark.slow
def test_faults_failed_and_malformed_clients_are_inactive_and_never_applied(tmp_path, caplog):
    """Client 1's round-1 upload is garbage, client 0 is down in rounds 2 and 3 and restarts for
    round 4 from its own saved state (its Context.state lost), client 2 sends NaN in round 3:
    each is inactive in those rounds, on the server and on the client (QLSD++ memory terms stay
    in step: the server's sum equals the clients' committed memories)."""
    def faults(kind, k, i, reply):
        if kind != "round" or reply is None:
            return reply
        if (k, i) == (1, 1):
            for name in reply:
                if name.startswith("blob/"):
                    reply[name] = b"\xff\x00garbage"
        if (k, i) == (3, 2):
            for c in reply["chains"]:
                reply[f"codecs/{c}"] = ["f32"]
                reply[f"blob/{c}/0"] = np.full(5, np.nan, np.float32).tobytes()
        return reply

    class Down(LocalTransport):
        def exchange(self, messages, timeout):
            k = next(iter(messages.values())).get("k")
            if k in (2, 3):  # client 0's node is down, then restarts with an empty Context.state
                self.stores[0].clear()
                return {**super().exchange({i: m for i, m in messages.items() if i != 0}, timeout), 0: None}
            return super().exchange(messages, timeout)

    text = QLSD_PP.replace("participation = { p = 0.7, scaling = \"inverse_probability\" }", "")
    transport = Down(text, 3, config.from_text, faults)
    server = ServerRuntime(text, tmp_path, config.from_text)
    res = server.run(transport)
    assert np.all(np.isfinite(res.samples))
    assert server.stats["rejected_uploads"] == 2 and server.stats["missing_replies"] == 2
    # full participation: 3 clients x 6 rounds minus the four faults, per chain
    assert res.total_bits_up.shape == (2,)
    assert int(res.active.sum(axis=1)[0]) <= 3 * 6 - 4
    # each client's memory term: its pending result if the server applied it, else its committed one
    from fedmcmc.runtime.messaging.wire import unpack

    with np.load(tmp_path / "chunks" / "state.npz") as z:
        server_memory, last = z["ss1"], z["last_accepted"]  # QLSDPPState(position, memory)
    memories = []
    for i, client in transport.clients.items():
        store = transport.stores[i]
        pending, committed = unpack(store["pending"], client.cs_like), unpack(store["committed"], client.cs_like)
        memories.append(np.where((last[:, i] == store["k"])[:, None], np.asarray(pending.compressor.memory)[:, 0],
                                 np.asarray(committed.compressor.memory)[:, 0]))
    # float32 sums of 18 terms in another order: a few ulps of the largest term each
    atol = 18 * 4 * np.finfo(np.float32).eps * np.abs(memories).max()
    np.testing.assert_allclose(np.sum(memories, axis=0), server_memory, rtol=0, atol=atol)


#: QLSD++ with full participation and float32 uploads (no compression): one part, one f32 array per chain.
PLAIN = QLSD_PP.replace("compression = { bits = 4 }\n", "").replace(
    "participation = { p = 0.7, scaling = \"inverse_probability\" }\n", "")


@pytest.mark.slow
def test_an_upload_far_above_the_runs_own_norms_is_rejected_by_default(tmp_path):
    """``max_upload_norm = "auto"``: client 1's upload of norm 1e7 in round 3 (below the fixed 1e8
    that bounded uploads before) is rejected; every honest upload is applied."""
    def faults(kind, k, i, reply):
        if kind == "round" and (k, i) == (3, 1):
            for c in reply["chains"]:
                assert list(reply[f"codecs/{c}"]) == ["f32"]
                reply[f"blob/{c}/0"] = np.full(5, 1e7 / np.sqrt(5), np.float32).tobytes()
        return reply

    server = ServerRuntime(PLAIN, tmp_path, config.from_text)
    res = server.run(LocalTransport(PLAIN, 3, config.from_text, faults))
    assert server.stats["rejected_uploads"] == 1 and server.stats["missing_replies"] == 0  # the honest ones applied
    assert np.max(np.abs(res.samples)) < 1e3


def test_replayed_and_copied_uploads_are_counted(tmp_path):
    """Client 1 sends its round-1 bytes again in round 4 (a replay) and client 2 sends client 1's
    bytes of round 2 as its own (a copy): both counted per chain, and reported in the stats."""
    kept = {}

    def faults(kind, k, i, reply):
        if kind != "round":
            return reply
        blobs = {name: reply[name] for name in reply if name.startswith(("blob/", "codecs/"))}
        if (k, i) in ((1, 1), (2, 1)):
            kept[k] = blobs
        if (k, i) == (4, 1):
            reply.update(kept[1])
        if (k, i) == (2, 2):
            reply.update(kept[2])
        return reply

    server = ServerRuntime(PLAIN, tmp_path, config.from_text)
    server.run(LocalTransport(PLAIN, 3, config.from_text, faults))
    assert server.stats["replayed_uploads"] == 2 and server.stats["copied_uploads"] == 2
    assert server.stats["rejected_uploads"] == 0
    # the progress a launcher shows: the server's record after its last round
    record = json.loads((tmp_path / "progress.json").read_text())
    rounds = server.stats["round_seconds"]
    assert record["done"] == record["total"] == server.N == len(rounds) and record["remaining_seconds"] == 0
    assert record["seconds_per_round"] == float(np.median(rounds[1:][-20:]))


def test_a_deployments_progress_says_the_time_the_configured_rounds_take_and_the_time_left():
    from fedmcmc.app.flower.launch import Progress, duration

    lines = []
    show = Progress(lines.append, every=0)
    show({"done": 1, "total": 250_000, "seconds_per_round": 9.0, "remaining_seconds": 9.0 * 249_999})
    show({"done": 2, "total": 250_000, "seconds_per_round": 4.9, "remaining_seconds": 4.9 * 249_998})
    show({"done": 3, "total": 250_000, "seconds_per_round": 4.9, "remaining_seconds": 4.9 * 249_997})
    assert lines[1] == "fedmcmc: at the measured 4.9 s per round, the configured 250,000 rounds take about 14 days"
    assert lines[2] == "fedmcmc: round 2/250,000, 4.9 s per round, about 14 days left"
    assert len(lines) == 4 and lines[0].startswith("fedmcmc: round 1/250,000")  # the estimate once, from round 2
    assert [duration(s) for s in (42, 210, 7560, 1.2e6)] == ["42 s", "3.5 min", "2.1 h", "14 days"]
    quiet = []
    show = Progress(quiet.append)  # a line at most every 10 s, and the last round's
    for done in range(1, 6):
        show({"done": done, "total": 5, "seconds_per_round": 4.9, "remaining_seconds": 4.9 * (5 - done)})
    assert len(quiet) == 3 and quiet[-1] == "fedmcmc: round 5/5, 4.9 s per round, about 0 s left", quiet


@pytest.mark.slow
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
    other = QLSD_PP.replace("step_size = 1e-3", "step_size = 5e-4")
    with pytest.raises(ValueError, match=r"its run had \[sampler\] step_size = 0.001, this one 0.0005"):
        ServerRuntime(other, tmp_path, config.from_text, resume=True).run(transport)
    with pytest.raises(ValueError, match="holds a run .*--resume.*--overwrite"):
        ServerRuntime(QLSD_PP, tmp_path, config.from_text).run(transport)
    res = ServerRuntime(QLSD_PP, tmp_path, config.from_text, resume=True).run(transport)
    np.testing.assert_array_equal(res.samples, reference(QLSD_PP, started=False).samples)


@pytest.mark.slow
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


class InProcessGrid:
    """Flower's ``Grid`` (push, pull, node ids) answered in this process by a ``ClientApp``,
    one ``Context`` per node: real Flower messages, records and mods, without the engines.
    ``restart = (k, node)``: that node restarts after answering round ``k`` (a new node id, an
    empty ``Context.state``, the same node config)."""

    def __init__(self, app, n, text, restart=None, node_config=None):
        self.app, self.replies, self.text, self.restart = app, {}, text, restart
        self.node_config, self.in_client = node_config or {}, False
        self.contexts = {100 + i: self.context(100 + i, i) for i in range(n)}

    def context(self, node, i):
        from flwr.app import Context, RecordDict

        return Context(run_id=1, node_id=node, node_config={"partition-id": i, **self.node_config.get(i, {})},
                       state=RecordDict(), run_config={"config": self.text})

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        from fedmcmc.app.flower.content import from_content

        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id
            node = m.metadata.dst_node_id
            if node in self.contexts:
                self.in_client = True
                self.replies[m.object_id] = self.app(m, self.contexts[node])
                self.in_client = False
                if self.restart == (from_content(m.content).get("k"), node):
                    old = self.contexts.pop(node)
                    self.contexts[node + 100] = self.context(node + 100, old.node_config["partition-id"])
            ids.append(m.object_id)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


@pytest.fixture
def server_identity(monkeypatch):
    """What Flower sets in a ServerApp process (messages are made with it); the JAX compilation
    cache that the ClientApp sets for its node is put back afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)
    cache = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", cache)


@pytest.mark.slow
def test_round_messages_are_flower_train_messages_with_array_records_and_mods_wrap_the_client(tmp_path,
                                                                                            server_identity):
    """Uploads travel in an ArrayRecord of train messages, so Flower mods see them: a mod that
    records what it sees and the reply-size limit mod leave the samples bit for bit, with node 0
    restarted after round 1 (it rejoins under its partition from its saved state) and a ``hold``
    queued behind every message (``[flower] hold = true``: answered at once, its reply dropped);
    a limit below one upload's size refuses every upload (every client inactive, never applied)."""
    from fedmcmc.app.flower.apps import make_client_app, reply_limit_mod
    from fedmcmc.app.flower.content import ARRAYS, HOLD, from_content
    from fedmcmc.app.flower.grid import GridTransport

    seen = []

    def spy(msg, context, call_next):
        reply = call_next(msg, context)
        seen.append((msg.metadata.message_type, {k: v.dtype for k, v in reply.content[ARRAYS].items()},
                     from_content(msg.content)["kind"]))
        return reply

    base = QLSD_PP.replace("num_iterations = 6", "num_iterations = 4")
    for limit, out, text in ((10_000, tmp_path / "big", base + "\n[flower]\nhold = true\n"),
                             (8, tmp_path / "small", base)):
        grid = InProcessGrid(make_client_app([reply_limit_mod(limit), spy]), 3, text, restart=(1, 100))
        server = ServerRuntime(text, out, config.from_text)
        transport = GridTransport(grid, server.b, server.flower)
        res = server.run(transport)
        if limit == 10_000:
            np.testing.assert_array_equal(res.samples, reference(base, started=False).samples)  # bit for bit
            assert server.stats["missing_replies"] == 0 and 200 in transport.index  # node 0 rejoined
            kinds = [kind for _, _, kind in seen]
            # a hold behind each init and round message, answered; the one queued for node 0 as it
            # restarted went to its old node id
            assert kinds.count(HOLD) == kinds.count("init") + kinds.count("round") - 1 > 0
            seen.clear()
        else:
            assert server.stats["missing_replies"] > 0 and int(res.active.sum()) == 0  # none applied
    train = [arrays for kind, arrays, _ in seen if kind == "train"]
    assert train and all(arrays and all(dt == "uint8" for dt in arrays.values()) for arrays in train)


def test_a_node_with_other_data_shapes_is_refused_with_its_name(tmp_path, server_identity):
    """The hello exchange checks each node's client count and data shapes (here a mod makes
    partition 2 report a point of 6 features instead of 5)."""
    from fedmcmc.app.flower.apps import make_client_app
    from fedmcmc.app.flower.content import from_content, to_content
    from fedmcmc.app.flower.grid import GridTransport

    def other_data(msg, context, call_next):
        reply = call_next(msg, context)
        h = from_content(reply.content)
        if h.get("index") == 2:
            h["shapes"] = [[6] if s == [5] else s for s in h["shapes"]]
            reply.content = to_content(h)
        return reply

    grid = InProcessGrid(make_client_app([other_data]), 3, QLSD_PP)
    server = ServerRuntime(QLSD_PP, tmp_path, config.from_text)
    with pytest.raises(RuntimeError, match=r"SuperNode 102 \(partition-id 2\) holds data of shapes"):
        GridTransport(grid, server.b, server.flower)


def test_the_run_config_file_carries_the_runs_toml_whole(tmp_path):
    """What `flwr run --run-config FILE` reads (Flower flattens the file with tomli): the run's
    TOML text comes back as it was, quotes, backslashes, lists and non-ASCII included."""
    from flwr.common.config import parse_config_args

    from fedmcmc.app.flower.launch import run_config_file

    text = QLSD_PP + '[data]\nfiles = ["a b.csv", "c\\\\d.csv"]\ntarget = "Größe \\"x\\""\n'
    flat = parse_config_args([str(run_config_file(text, tmp_path, True, "deployment", tmp_path / "cfg"))])
    assert flat == {"config": text, "out": str(tmp_path), "resume": True, "engine": "deployment",
                    "data-dir": str(tmp_path / "cfg")}
    assert tomllib.loads(flat["config"])["data"]["files"] == ["a b.csv", "c\\d.csv"]


SITES = """
[data]
files = ["site-a.csv", "site-b.csv", "site-c.csv"]
target = "label"
classes = [0, 1]
test_fraction = 0.2
[model]
name = "logistic"
"""


def write_sites(folder):
    """Three hospitals' CSV files of breast-cancer rows (5 features): 60, 100 and 40 patients,
    20%, 50% and 85% of label 1."""
    from fedmcmc.data import load_dataset

    d = load_dataset("breast-cancer")
    rng = np.random.default_rng(0)
    ones, zeros = rng.permutation(np.flatnonzero(d.y == 1)), rng.permutation(np.flatnonzero(d.y == 0))
    used = [0, 0]
    for name, n, share in (("site-a.csv", 60, 0.2), ("site-b.csv", 100, 0.5), ("site-c.csv", 40, 0.85)):
        k = int(round(share * n))
        rows = np.concatenate([ones[used[1]:used[1] + k], zeros[used[0]:used[0] + n - k]])
        used[0], used[1] = used[0] + n - k, used[1] + k
        table = np.column_stack([d.x[rows, :5], d.y[rows]])
        np.savetxt(folder / name, table, delimiter=",", header="f0,f1,f2,f3,f4,label", comments="", fmt="%.10g")


@pytest.mark.slow
def test_each_node_reads_its_own_file_and_the_server_no_data(tmp_path, server_identity, monkeypatch):
    """Node-local data (docs/flower.md): three CSV files of different sizes and label balance, each
    read only by its node (node config ``data-path``; the config's file names exist nowhere, and
    reading a file outside a node's handler fails), give the simulator's samples of the same three
    files bit for bit with QLSD++ (FA-HMC: on the deployment engine, tests/runtime/test_flower_deploy.py),
    9 chains in the simulator's two blocks of 5 (without them, in one program of 9, a logistic model's
    draws differed in the last bit on an AMD EPYC); QLSD* (the mode needs the data) is refused."""
    from fedmcmc.app.flower import apps
    from fedmcmc.app.flower.launch import data_paths
    from fedmcmc.data import local

    write_sites(tmp_path)
    text = SITES + "[sampler]" + QLSD_PP.split("[sampler]")[1].replace("batch_size = 5", "batch_size = 10").replace(
        "num_chains = 2", "num_chains = 9")
    paths = data_paths(text, tmp_path)  # what `fedmcmc flower deploy` gives each SuperNode
    built, ref = config.build(tomllib.loads(text), tmp_path), reference(text, tmp_path)  # the simulator
    reads, read_client = [], local.read_client

    def node_only(section, source, base_dir=None):
        assert grid.in_client, f"{source} opened outside a node"
        reads.append(str(source))
        return read_client(section, source, base_dir)

    monkeypatch.setattr(local, "read_client", node_only)
    remote = text.replace("site-", "nowhere-")  # the server cannot find these; the nodes use data-path
    grid = InProcessGrid(apps.make_client_app(), 3, remote, node_config=paths)
    payload = apps.run_server(grid, remote, tmp_path / "out", False, "test")  # the ServerApp's whole work
    flower = payload["flower"]  # what `fedmcmc bench --flower` reads
    assert flower["median_round_message_bytes"] > flower["median_round_reply_bytes"] > 0
    assert flower["median_client_process_seconds"] > 0
    chunks = sorted((tmp_path / "out" / "chunks").glob("chunk_*"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    np.testing.assert_array_equal(samples, ref.samples)  # bit for bit
    assert [c["n_train"] for c in payload["inputs"]["clients"]] == list(np.asarray(built.data.counts))
    assert payload["laplace"]["available"] is True  # the chains start dispersed about the mode, as in the simulator
    assert payload["flower"]["ask_rounds"] == payload["laplace"]["rounds"] > 0  # the mode and the Hessian
    assert payload["inputs"]["scaling"] == built.inputs.scaling  # the pooled scaling from the nodes' moments
    assert sorted(set(reads)) == sorted(p["data-path"] for p in paths.values())
    monkeypatch.setattr(local, "read_client", read_client)
    # the held-out parts stay on the nodes too: one evaluate round gives the simulator's outputs
    import arviz as az

    (tmp_path / "sites.toml").write_text(text)
    config.run(tmp_path / "sites.toml", tmp_path / "sim", progress=False)
    got, want = (json.loads((tmp_path / d / "summary.json").read_text())["predictive"] for d in ("out", "sim"))
    assert got == want and got["overall"]["num_points"] == sum(c["n_test"] for c in payload["inputs"]["clients"]) > 0
    flown, simulated = (az.from_netcdf(tmp_path / d / "posterior.nc") for d in ("out", "sim"))
    for group in ("log_likelihood", "observed_data"):
        np.testing.assert_array_equal(flown[group]["y"].values, simulated[group]["y"].values)
    assert (tmp_path / "out" / "reliability.png").is_file()
    assert flower["evaluate"]["rounds"] == 1 and flower["evaluate"]["bytes_up"] > flower["evaluate"]["bytes_down"] > 0
    cg = SITES + "[sampler]\nname = \"cg-dsgld\"\nstep_size = \"auto\"\nlocal_steps = 2\n[run]\nnum_chains = 1\nnum_iterations = 2\n"
    with pytest.raises(config.ConfigError, match=r'cg-dsgld with step_size = "auto" cannot run on node-local data'):
        apps.start_server(InProcessGrid(apps.make_client_app(), 3, cg, node_config=paths), cg, tmp_path / "cg")


@pytest.mark.slow
def test_the_mode_the_automatic_step_and_the_whitening_are_flower_rounds(tmp_path, server_identity):
    """QLSD* with step_size = "auto" on node-local data: the server finds the federated mode, the
    curvature, the minibatch noise and the Laplace approximation by ask rounds, whitens, and tells
    the nodes the results; the draws are the simulator's on the same files, bit for bit, and so are
    the step, the mode and the starting points."""
    from fedmcmc.app.flower import apps
    from fedmcmc.app.flower.launch import data_paths

    write_sites(tmp_path)
    text = SITES + "[sampler]" + QLSD_PP.split("[sampler]")[1].replace("qlsd++", "qlsd*").replace(
        "refresh_every = 2\n", "").replace("step_size = 1e-3", 'step_size = "auto"').replace(
        "batch_size = 5", "batch_size = 10")
    paths = data_paths(text, tmp_path)
    cfg = tomllib.loads(text)
    built = config.with_start(cfg, config.build(cfg, tmp_path))
    ref = reference(text, tmp_path)
    remote = text.replace("site-", "nowhere-")
    grid = InProcessGrid(apps.make_client_app(), 3, remote, node_config=paths)
    payload = apps.run_server(grid, remote, tmp_path / "out", False, "test")
    chunks = sorted((tmp_path / "out" / "chunks").glob("chunk_*"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    assert payload["whitening"]["used"] is True and built.whitening[0] is not None
    np.testing.assert_array_equal(samples, ref.samples)  # bit for bit
    assert payload["step"]["value"] == built.step["value"] and payload["step"]["rule"] == built.step["rule"]
    assert payload["flower"]["ask_rounds"] >= built.step["rounds"]
    assert payload["flower"]["ask_bytes_up"] > 0 and payload["flower"]["ask_bytes_down"] > 0


def test_a_kept_program_is_loaded_by_another_process_and_gives_the_same_bits(tmp_path):
    """A client's compiled program kept on disk (fedmcmc.runtime.messaging.stored_programs) is loaded, not
    compiled again, and computes what the compiled program computes, bit for bit."""
    from fedmcmc.runtime.messaging import stored_programs as programs

    code = ("import sys, numpy as np, jax\n"
            "from fedmcmc.runtime.messaging import stored_programs as programs\n"
            "f = lambda k, x: {'y': x / (1 + jax.random.normal(k, x.shape) ** 2)}\n"
            "args = (np.asarray(jax.random.PRNGKey(0)), np.linspace(0, 1, 7, dtype=np.float32))\n"
            "p = programs.program(sys.argv[1], 'f', f, args)\n"
            "print(type(p).__name__, *np.asarray(p(*args)['y']).view(np.uint32))\n")
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
            .stdout.split() for _ in range(2)]
    assert runs[0][0] == "Compiled" and runs[1][0] == programs.Program.__name__ and runs[0][1:] == runs[1][1:]
    assert len(list(tmp_path.glob("*.exe"))) == 1


def test_a_program_is_checked_before_other_processes_can_load_it(tmp_path, monkeypatch):
    """The nodes of one machine share the programs folder: a program is loaded back and checked
    before it takes its place there, so another node's process never loads one that fails the
    check (an executable that JAX itself loaded from its persistent cache serialises without its
    kernels: a node once ran such a file in the moment before it was removed, and failed)."""
    import jax.numpy as jnp

    from fedmcmc.runtime.messaging import stored_programs as programs

    real_load, seen = programs._load, []

    def broken(path):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))  # what other processes could load now
        real_load(path)
        raise RuntimeError("NOT_FOUND: Function fusion not found")

    monkeypatch.setattr(programs, "_load", broken)
    args = (np.linspace(0, 1, 5, dtype=np.float32),)
    p = programs.program(tmp_path, "g", lambda x: jnp.tanh(x) * 3, args)
    np.testing.assert_allclose(np.asarray(p(*args)), np.tanh(args[0]) * 3, rtol=1e-6)  # the compiled program
    assert len(seen) == 1 and not any(name.endswith(".exe") for name in seen[0])  # only the checked .tmp
    assert list(tmp_path.iterdir()) == []  # the failed program is not kept


LEAN = """
import sys
import fedmcmc, fedmcmc.runtime, fedmcmc.app.flower.apps, fedmcmc.app.flower.node_worker
from fedmcmc.runtime.settings import FlowerSettings
lean = "jax" not in sys.modules
print(lean, FlowerSettings.from_section({"poll_interval": 0.5}).round_timeout, fedmcmc.runtime.simulate is fedmcmc.simulate)
"""


def test_a_clientapp_that_relays_to_a_worker_imports_no_jax():
    """What a ClientApp process with a node worker imports (fedmcmc, its ClientApp module, the worker
    client and the ``[flower]`` defaults) holds no JAX; the lazy names still resolve."""
    out = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "120.0", "True"]


def wait_for_key(folder, seconds: float = 60.0) -> None:
    """Return once the node worker in ``folder`` has written its key (it is listening then)."""
    from fedmcmc.app.flower.node_worker import KEY

    deadline = time.monotonic() + seconds
    while not (folder / KEY).exists():
        assert time.monotonic() < deadline, f"the node worker in {folder} wrote no key in {seconds:.0f} s"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_node_worker_answers_for_the_clientapps_with_the_same_samples(tmp_path, server_identity, monkeypatch,
                                                                         caplog):
    """Three nodes whose node config names one node worker (``worker``, a ``fedmcmc node-worker``
    process; docs/flower.md): the ClientApps relay every message to it, never answering by
    themselves, and the run gives the simulator's samples on the sites' files bit for bit, while
    a connection that never sends a request is open; a worker's error reaches the ClientApp as its
    own; with no worker in the folder, or a stopped one, the ClientApp answers by itself and says
    why; SIGTERM stops the worker and removes its socket, also while it still imports the
    samplers; a folder too long for a Unix socket is refused with the fix."""
    from fedmcmc.app.flower import apps, node_worker as worker, replies
    from fedmcmc.app.flower.launch import data_paths

    write_sites(tmp_path)
    text = SITES + "[sampler]" + QLSD_PP.split("[sampler]")[1].replace("batch_size = 5", "batch_size = 10")
    folder = tmp_path / "worker"
    proc = subprocess.Popen([sys.executable, "-m", "fedmcmc", "node-worker", str(folder), "--idle", "600"],
                            stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT)
    try:
        ref = reference(text, tmp_path)
        paths = {i: {**p, "worker": str(folder)} for i, p in data_paths(text, tmp_path).items()}
        answer = replies.answer
        monkeypatch.setattr(replies, "answer", lambda *a: pytest.fail("a ClientApp answered by itself"))
        wait_for_key(folder)
        silent = socket.socket(socket.AF_UNIX)  # connects and never speaks: it must hold up no ClientApp
        silent.connect(str(folder / worker.SOCKET))
        grid = InProcessGrid(apps.make_client_app(), 3, text, node_config=paths)
        apps.run_server(grid, text, tmp_path / "out", False, "test")
        silent.close()
        samples = np.concatenate([np.load(c)["positions"] for c in sorted((tmp_path / "out" / "chunks").glob("chunk_*"))],
                                 axis=1)
        np.testing.assert_array_equal(samples, ref.samples)  # bit for bit
        node = replies.NodeView({"partition-id": 0}, {"data-dir": str(tmp_path)})
        with pytest.raises(RuntimeError, match=f"node worker in {folder}: .*has not received the run's inputs"):
            worker.ask(folder, ({"kind": "init"}, text, 0, node, {}))
        monkeypatch.setattr(replies, "answer", lambda *request: ({"ok": 1}, request[-1]))
        with caplog.at_level("WARNING"):
            assert worker.ask(tmp_path / "nowhere", ({"kind": "init"}, text, 0, node, {"k": 1})) == ({"ok": 1}, {"k": 1})
        assert "no fedmcmc node worker in" in caplog.text and "answering in this process" in caplog.text
        # a stopped worker: the kernel still accepts the connection, but the worker never proves its
        # key; the ClientApp answers by itself after HANDSHAKE_TIMEOUT seconds instead of hanging
        monkeypatch.setattr(worker, "HANDSHAKE_TIMEOUT", 1.0)
        caplog.clear()
        proc.send_signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            with caplog.at_level("WARNING"):
                assert worker.ask(folder, ({"kind": "init"}, text, 0, node, {"k": 2})) == ({"ok": 1}, {"k": 2})
            assert time.monotonic() - start < 30
            assert "no progress in 1 s: the other side is stopped or stuck" in caplog.text, caplog.text
        finally:
            proc.send_signal(signal.SIGCONT)
        monkeypatch.setattr(replies, "answer", answer)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    assert not (folder / worker.SOCKET).exists()
    # stopped as soon as its key is written, while it still imports the samplers: it exits cleanly too
    early_folder = tmp_path / "early"
    early = subprocess.Popen([sys.executable, "-m", "fedmcmc", "node-worker", str(early_folder), "--idle", "600"])
    try:
        wait_for_key(early_folder)
    finally:
        early.terminate()
        assert early.wait(timeout=60) == 0
    assert not (early_folder / worker.SOCKET).exists()
    with pytest.raises(ValueError, match="over the 107 a Unix socket's path may have: choose a shorter folder"):
        worker.serve(tmp_path / ("x" * 120))
