"""A run's identity: a resume never mixes two runs, and a folder's run is never replaced silently."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import harness as h
from fedmcmc import simulate
from fedmcmc.compression import quantization
from fedmcmc.data.federated import from_clients
from fedmcmc.estimators import gradients
from fedmcmc.runtime import identity
from fedmcmc.runtime.records import save_npz
from fedmcmc.samplers import qlsd_star

DATA = h.problem()
MODEL = h.model_for(DATA)
GAMMA = 0.5 / DATA.total
THETA0 = np.array([1.0, -2.0, 0.5], np.float32)
KWARGS = dict(num_chains=2, thinning=2, chunk_size=4)

DESCRIBE = """
import json, sys
sys.path.insert(0, {tests!r})
import harness as h
from fedmcmc.compression import quantization
from fedmcmc.estimators import gradients
from fedmcmc.runtime import identity
from fedmcmc.samplers import qlsd_star
data = h.problem()
model = h.model_for(data)
gamma = 0.5 / data.total
print(json.dumps([identity.identity(sampler=qlsd_star(model, g, gradients.find_mode(model, data), [3, 4, 5, 6],
                                                      quantization(4))) for g in (gamma, gamma / 2)]))
"""


def sampler(step=GAMMA):
    return qlsd_star(MODEL, step, gradients.find_mode(MODEL, DATA), [3, 4, 5, 6], quantization(4))


@pytest.mark.slow
def test_the_sampler_is_described_alike_in_two_processes_and_by_its_settings():
    """The structural description holds no address or id: another process (with another hash
    seed) gives the same JSON, and it names the step size, which tells two settings apart."""
    tests = os.path.dirname(os.path.dirname(__file__))
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", DESCRIBE.format(tests=tests)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    there = json.loads(out.stdout.splitlines()[-1])
    here = [json.loads(json.dumps(identity.identity(sampler=sampler(g)))) for g in (GAMMA, GAMMA / 2)]
    assert here == there
    differ = [key for key in here[0] if here[0][key] != here[1].get(key)]
    assert differ and all(key.endswith("step_size") for key in differ), differ
    assert not any("0x" in str(value) for value in here[0].values())


@pytest.mark.slow
def test_a_resume_with_other_data_or_settings_is_refused_naming_what_differs(tmp_path):
    simulate(7, sampler(), DATA, THETA0, 8, out_dir=tmp_path, **KWARGS)
    chunks = sorted(p.name for p in (tmp_path / "chunks").iterdir())
    clients = h.client_arrays(DATA)
    clients[2] = clients[2].copy()
    clients[2][0, 0] += 1.0  # one value of one client
    other = from_clients(clients)
    with pytest.raises(ValueError, match=r"cannot resume from .*: its run had data\.client_2 = \w+, this one \w+"):
        simulate(7, sampler(), other, THETA0, 8, out_dir=tmp_path, resume=True, **KWARGS)
    with pytest.raises(ValueError, match=r"its run had sampler\..*step_size = .*, this one .*; use another --out"):
        simulate(7, sampler(GAMMA / 2), DATA, THETA0, 8, out_dir=tmp_path, resume=True, **KWARGS)
    assert sorted(p.name for p in (tmp_path / "chunks").iterdir()) == chunks


@pytest.mark.slow
def test_a_folder_holding_a_run_takes_another_only_with_overwrite(tmp_path):
    first = simulate(7, sampler(), DATA, THETA0, 8, out_dir=tmp_path, **KWARGS)
    before = {p.name: p.read_bytes() for p in (tmp_path / "chunks").iterdir()}
    with pytest.raises(ValueError, match=r"holds a run \(chunks/\); continue it with resume=True .* overwrite=True"):
        simulate(8, sampler(), DATA, THETA0, 8, out_dir=tmp_path, **KWARGS)
    assert {p.name: p.read_bytes() for p in (tmp_path / "chunks").iterdir()} == before
    again = simulate(7, sampler(), DATA, THETA0, 8, out_dir=tmp_path, resume=True, **KWARGS)  # finished: as it was
    np.testing.assert_array_equal(again.samples, first.samples)
    other = simulate(8, sampler(), DATA, THETA0, 8, out_dir=tmp_path, overwrite=True, **KWARGS)
    resumed = simulate(8, sampler(), DATA, THETA0, 8, out_dir=tmp_path, resume=True, **KWARGS)
    np.testing.assert_array_equal(resumed.samples, other.samples)
    assert not np.array_equal(other.samples, first.samples)


def test_a_checkpoint_without_an_identity_is_refused(tmp_path):
    simulate(7, sampler(), DATA, THETA0, 8, out_dir=tmp_path, **KWARGS)
    state = tmp_path / "chunks" / "state.npz"
    with np.load(state) as z:
        save_npz(state, **{name: z[name] for name in z.files if name != "identity"})
    with pytest.raises(ValueError, match="written by an older fedmcmc .*--overwrite to start over"):
        simulate(7, sampler(), DATA, THETA0, 8, out_dir=tmp_path, resume=True, **KWARGS)


@pytest.mark.slow
def test_a_study_into_a_folder_holding_its_run_needs_resume_or_overwrite(tmp_path):
    from types import SimpleNamespace

    from fedmcmc.app.studies import runner

    def science(cfg, run):
        res = run.simulate(cfg["seed"], sampler(cfg["step_size"]), DATA, THETA0, 8, folder="qlsd", **KWARGS)
        return runner.Findings(settings=cfg, results={"mean": float(res.samples.mean())})

    study = SimpleNamespace(NAME="tiny", SUMMARY="", FULL={"seed": 7, "step_size": GAMMA}, QUICK={}, science=science)
    first = runner.run_study(study, tmp_path, progress=False)
    with pytest.raises(ValueError, match=f"{tmp_path} holds a run; continue it with --resume, or replace it with "
                                         "--overwrite"):
        runner.run_study(study, tmp_path, progress=False, settings={"step_size": GAMMA / 2})
    with pytest.raises(ValueError, match=r"its run had step_size = .*, this one"):
        runner.run_study(study, tmp_path, progress=False, settings={"step_size": GAMMA / 2}, resume=True)
    assert runner.run_study(study, tmp_path, progress=False, resume=True)["mean"] == first["mean"]
    other = runner.run_study(study, tmp_path, progress=False, settings={"step_size": GAMMA / 2}, overwrite=True)
    assert other["mean"] != first["mean"]
