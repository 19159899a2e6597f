"""The deployment engine, for real: a SuperLink and SuperNodes on 127.0.0.1 with TLS and
SuperNode authentication (certificates and keys generated here), one deployment serving
several checks: same samples as the simulator for QLSD++ on node-local data (each SuperNode
reads its own CSV file), with its ServerApp killed and the run resumed; an unauthenticated node kept out, a SuperNode killed and restarted mid-run
(it rejoins under its partition) and a malformed reply (docs/flower.md); secure aggregation with a
node failing, the plain run's samples (docs/privacy.md)."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from test_flower import QLSD_PP, SITES, reference, write_sites
from test_secagg import GRID

from fedmcmc.app import config
from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime

from fedmcmc.app.flower.launch import LocalDeployment, data_paths, free_port

pytestmark = pytest.mark.slow

#: fedmcmc's apps with the test-only fault mod on the ClientApp (``fault`` in a node config)
FAULTS_APP = Path(__file__).parent / "flwr_faults"


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_tls(folder):
    """A CA and a server certificate for 127.0.0.1 / localhost: (ca.crt, server.pem, server.key)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fedmcmc test CA")).issuer_name(_name("fedmcmc test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def make_node_keys(folder, n):
    """One P-384 key pair per SuperNode, OpenSSH format: [(private, public)]."""
    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = folder / f"node{i}", folder / f"node{i}.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                         serialization.PublicFormat.OpenSSH))
        out.append((private, public))
    return out


def short(text, rounds, extra=""):
    text = text.replace("num_iterations = 6", f"num_iterations = {rounds}").replace(
        "num_iterations = 4", f"num_iterations = {rounds}")
    text = text.replace("burn_in = 2", "burn_in = 0").replace("thinning = 2", "thinning = 1").replace(
        "chunk_size = 4", "chunk_size = 1")
    return text + "\n[flower]\n" + extra + "\n"


@pytest.fixture
def deployment(tmp_path):
    tls = make_tls(tmp_path)
    keys = make_node_keys(tmp_path, 3)
    # node i reads site i's CSV file in a [data] run (`fedmcmc flower deploy`'s node config); node 2
    # answers round 2 with undecodable bytes (only the fault run has a round 2; flwr_faults/faults.py)
    write_sites(tmp_path)
    nodes = data_paths(SITES, tmp_path)
    nodes[2]["fault"] = "malformed@2"
    with LocalDeployment(3, tmp_path / "deployment", tls=tls, auth_keys=keys, node_config=nodes,
                         app_dir=FAULTS_APP) as dep:
        yield dep


def test_deployment_with_tls_and_auth_same_samples_faults(deployment, tmp_path):
    import subprocess

    dep = deployment
    # a SuperNode without a registered key must not join (its partition-id 7 would break the run)
    intruder = subprocess.Popen([dep.bin("flower-supernode"), "--root-certificates", str(dep.tls[0]),
                                 "--superlink", f"127.0.0.1:{dep.port}", "--port", str(free_port()),
                                 "--node-config", "partition-id=7"], env=dep.env,
                                stdout=open(tmp_path / "intruder.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
    dep.procs.append(intruder)
    # QLSD++ on the sites' CSV files, each node reading its own (FA-HMC over Flower: test_flower.py and
    # the conformance test); the ServerApp is killed after round 0 and the run resumed (`hold`
    # messages: in process, tests/runtime/test_flower.py, where they cost no process each)
    text = short(SITES + "[sampler]" + QLSD_PP.split("[sampler]")[1], 2, "round_timeout = 600")
    ref = reference(text, tmp_path)
    text = text.replace("site-", "nowhere-")  # the nodes read their data-path; the server reads none
    path = tmp_path / "qlsdpp.toml"
    path.write_text(text)
    result = dep.submit(path, tmp_path / "qlsdpp")
    _wait_for(tmp_path / "qlsdpp" / "chunks" / "chunk_000000.npz")
    dep.kill_serverapp()
    assert not result.exists()
    payload = dep.run(path, tmp_path / "qlsdpp", resume=True, timeout=900)
    chunks = sorted((tmp_path / "qlsdpp" / "chunks").glob("chunk_*.npz"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    np.testing.assert_array_equal(samples, ref.samples)  # bit for bit, TLS + auth on
    assert payload["flower"]["engine"] == "deployment" and payload["flower"]["missing_replies"] == 0
    assert payload["flower"]["rounds_this_session"] == 1
    # faults (full participation): node 0 is killed after round 0 and restarted at once with a new
    # key (a new node id; it fails rounds 1 and 2 if they reach it, and rejoins for round 3), node 2
    # sends garbage in round 2; the run goes on without them
    text = short(QLSD_PP, 4, "round_timeout = 30").replace("seed = 3", "seed = 4").replace(
        'participation = { p = 0.7, scaling = "inverse_probability" }', "")
    path = tmp_path / "faults.toml"
    path.write_text(text)
    result = dep.submit(path, tmp_path / "faults")
    _wait_for(tmp_path / "faults" / "nodes" / "client0" / "round0.npz")
    dep.kill_supernode(0)
    (tmp_path / "new").mkdir()
    dep.restart_supernode(0, {"fault": "fail@1,2"}, keys=make_node_keys(tmp_path / "new", 1)[0])
    payload = dep.wait(result, timeout=900)
    flower = payload["flower"]
    assert flower["missing_replies"] >= 2  # client 0 in rounds 1 and 2 (and 0 if killed before replying)
    assert flower["rejected_uploads"] == 1  # client 2's garbage in round 2
    assert (tmp_path / "faults" / "nodes" / "client0" / "round3.npz").exists()  # node 0 rejoined
    samples = np.concatenate([np.load(c)["positions"] for c in sorted((tmp_path / "faults" / "chunks").glob("chunk_*"))],
                             axis=1)
    assert samples.shape == (2, 4, 5) and np.all(np.isfinite(samples))
    assert payload["mean_active_clients"] <= 9 / 4  # 12 participations minus at least 2 lost and 1 rejected
    # secure aggregation (full participation, uploads on a fixed-point grid): node 0 still fails
    # round 1, so the survivors reveal their seeds with it; the samples are those of the plain
    # run with the same failure, bit for bit (in process; tests/runtime/test_secagg.py)
    # (round_timeout as in the first run: a node's first answer compiles its programs, which under
    # load took longer than the faults run's 30 s; an injected failure is an error reply, not a wait)
    text = text.replace("num_iterations = 4", "num_iterations = 2").replace("{ bits = 4 }", GRID).replace(
        "round_timeout = 30", "round_timeout = 600")
    served = functools.partial(config.from_text, start=True)  # the chains start where the apps' server starts them
    plain = ServerRuntime(text, tmp_path / "plain", served).run(LocalTransport(
        text, 3, config.from_text, faults=lambda kind, k, i, reply: None if (kind, k, i) == ("round", 1, 0) else reply))
    path = tmp_path / "secure.toml"
    path.write_text(text + "secure_aggregation = true\n")
    flower = dep.run(path, tmp_path / "secure", timeout=900)["flower"]
    chunks = sorted((tmp_path / "secure" / "chunks").glob("chunk_*"))
    samples = np.concatenate([np.load(c)["positions"] for c in chunks], axis=1)
    np.testing.assert_array_equal(samples, plain.samples)  # bit for bit
    assert flower["missing_replies"] == 1 and flower["secagg_recoveries"] == 2  # both chains' sums unmasked
    log = (tmp_path / "intruder.log").read_text()
    assert "SuperNode ID" not in log and "Connection attempt failed" in log  # refused by the SuperLink


def _wait_for(path, timeout=600):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)
