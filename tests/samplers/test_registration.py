"""A sampler registered with the two required fields of ``Registered`` (builder and summary) goes
through everything: the simulator, the message runtime's messages, a run config, the bench and the
catalogue; ``step_size = "auto"`` and ``[privacy]`` are refused for it in one line."""

import json

import numpy as np
import pytest

from fedmcmc.app import config
from fedmcmc.app.bench import chains
from fedmcmc.app.flower import nodes
from fedmcmc.estimators import gradients
from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import NOT_ACCOUNTED, REGISTRY, Registered
from fedmcmc.samplers.qlsd import qlsd


def toy(model, step_size=1e-3, name="toy"):
    """Plain federated Langevin: every client uploads its full gradient, the server sums them and
    takes a Langevin step (QLSD without compression or minibatches)."""
    return qlsd(model, step_size, gradients.minibatch_gradient(model, None), name=name)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """``toy`` in the registry for one test, removed after it."""
    monkeypatch.setitem(REGISTRY, "toy", Registered(toy, "plain federated Langevin (a test's toy)"))


TEXT = """[problem]
name = "heterogeneous-gaussian"
num_clients = 3
dim = 3
min_size = 10
max_size = 30
[sampler]
name = "toy"
{sampler}
[run]
seed = 4
num_chains = 2
num_iterations = 4
chunk_size = 2
{extra}"""


def _text(sampler: str = "", extra: str = "") -> str:
    return TEXT.format(sampler=sampler, extra=extra)


def _simulate(cfg, built):
    r = cfg["run"]
    return simulate(r["seed"], built.sampler, built.data, np.zeros(built.model.dim), r["num_iterations"],
                    num_chains=r["num_chains"], chunk_size=r["chunk_size"])


def test_the_config_takes_the_builders_keys_and_its_defaults():
    assert config.sampler_keys("toy") == {"step_size": False}
    cfg = config.example("toy")
    assert cfg["sampler"] == {"name": "toy"} and cfg["problem"] == {"name": "heterogeneous-gaussian"}
    assert config.build(cfg).sampler.name == "toy"


def test_the_simulator_and_the_flower_messages_give_the_same_draws(tmp_path):
    """The server and clients of the message runtime without Flower (``LocalTransport``), each
    built from the config text, give the simulator's draws and bits."""
    text = _text("step_size = 1e-3")
    cfg, built = config.from_text(text)
    ref = _simulate(cfg, built)
    assert np.all(np.isfinite(ref.samples)) and not np.array_equal(ref.samples[:, :1], ref.samples[:, -1:])
    server = ServerRuntime(text, tmp_path, config.from_text)
    res = server.run(LocalTransport(text, server.b, config.from_text))
    np.testing.assert_array_equal(res.samples, ref.samples)
    np.testing.assert_array_equal(res.total_bits_up, ref.total_bits_up)
    assert server.stats["wire_bits_mismatch"] == 0


def test_a_config_run_writes_its_results(tmp_path):
    (tmp_path / "run.toml").write_text(_text())
    payload = config.run(tmp_path / "run.toml", tmp_path / "out", progress=False)
    assert payload["sampler"] == "toy" and payload["step"] == {"value": None, "rule": "given"}
    assert json.loads((tmp_path / "out" / "results.json").read_text())["sampler"] == "toy"


def test_the_bench_times_its_example():
    """The chain-scaling bench's case: the example on its problem, two rounds of its chains timed."""
    sampler, data, dim, rounds = chains.cases(["toy"])["toy"]
    assert sampler.name == "toy" and dim == 50 and rounds == chains.ROUNDS
    chains._timer(sampler, data, dim, chains.CHAINS, 2)()


def test_the_catalogue_builds_it():
    from catalog import samplers
    from fedmcmc.app import problems

    problem = problems.heterogeneous_gaussian(num_clients=3, dim=3)
    assert samplers(problem.data, problem.model)["toy"][0].name == "toy"


def test_flower_on_node_local_data_takes_it():
    assert nodes.refused("toy") is None


def test_auto_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        config.from_text(_text('step_size = "auto"'))
    assert str(err.value) == ('toy has no step_size = "auto": no step rule is registered for it '
                              '(fedmcmc.samplers.Registered.step); give step_size (a number)')


def test_privacy_is_refused_in_one_line_naming_the_reason():
    _, built = config.from_text(_text(extra="[privacy]\ndelta = 1e-5\n"))
    assert built.privacy["client"] == built.privacy["record"] == {"refused": NOT_ACCOUNTED}
    with pytest.raises(config.ConfigError) as err:
        config.from_text(_text(extra="[privacy]\ndelta = 1e-5\nepsilon = 1.0\n"))
    assert str(err.value) == f"[privacy] epsilon for toy at level 'client': {NOT_ACCOUNTED}"
