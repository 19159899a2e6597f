"""The command line: outputs, resume after a kill, and one-line errors for bad input."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def fedmcmc(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "fedmcmc", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=ENV, cwd=ROOT)


def refused(*args):
    """The command line run in this process, for input it refuses before running anything (the
    subprocess tests above and below check the same exit codes end to end), or for a short run:
    its exit code and printed lines, as :func:`fedmcmc` returns them. The worker count it sets is
    put back."""
    from fedmcmc.app import cli
    from fedmcmc.runtime import cpu

    workers, out, err = cpu.default_workers(), io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as exit_:  # argparse's own errors
                code = exit_.code
    finally:
        cpu.tune(workers)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


CONFIG = """
[problem]
name = "heterogeneous-gaussian"
num_clients = 5
dim = 4

[sampler]
name = "{sampler}"
step_size = {step}
batch_fraction = 0.2
compression = {compression}
participation = {participation}

[run]
seed = 3
num_chains = 4
num_iterations = {iterations}
burn_in = {burn_in}
thinning = 5
chunk_size = {chunk}
"""


def write_config(path, sampler="qlsd*", step=1e-3, compression="{ bits = 4 }",
                 participation="{ p = 0.8, scaling = \"inverse_probability\" }", iterations=2000, burn_in=1000,
                 chunk=500):
    path.write_text(CONFIG.format(sampler=sampler, step=step, compression=compression, participation=participation,
                                  iterations=iterations, burn_in=burn_in, chunk=chunk))
    return path


def assert_one_line_error(proc, *fragments, code=2):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmcmc: error:")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_list_names_experiments_and_samplers():
    proc = fedmcmc("list")
    assert proc.returncode == 0
    for name in ("qlsd-toy-gaussian", "qlsd*", "qlsd++", "sgld", "heterogeneous-gaussian"):
        assert name in proc.stdout


@pytest.mark.slow
def test_run_writes_inference_data_json_and_plots(tmp_path):
    import arviz

    cfg = write_config(tmp_path / "c.toml")
    proc = fedmcmc("run", cfg, "--out", tmp_path / "out", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["sampler"] == "qlsd*" and results["num_draws"] == 200
    assert results["upload_bits_per_chain"] > 0 and 0 < results["mean_active_clients"] <= 5
    idata = arviz.from_netcdf(tmp_path / "out" / "posterior.nc")
    assert idata.posterior["theta"].shape == (4, 200, 4)
    assert set(idata.sample_stats.data_vars) >= {"bits_up", "bits_down", "active_clients"}
    assert (tmp_path / "out" / "trace.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_draws_stored_are_counted_where_the_draws_are(tmp_path):
    """``[run] max_stored_draws`` thins posterior.nc evenly; the printed line, results.json and
    posterior.nc agree on both counts."""
    import arviz

    cfg = write_config(tmp_path / "c.toml", iterations=400, burn_in=200, chunk=200)
    cfg.write_text(cfg.read_text() + "max_stored_draws = 15\n")
    proc = refused("run", cfg, "--out", tmp_path / "out", "--no-progress", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert (results["num_draws"], results["num_stored_draws"], results["stored_every"]) == (40, 13, 3)
    assert "; 13 draws per chain stored in posterior.nc (every 3rd; [run] max_stored_draws)" in proc.stdout
    assert arviz.from_netcdf(tmp_path / "out" / "posterior.nc").posterior["theta"].shape == (4, 13, 4)
    cfg.write_text(cfg.read_text().replace("max_stored_draws = 15", "max_stored_draws = -1"))
    assert_one_line_error(refused("run", cfg, "--out", tmp_path / "never"), "max_stored_draws must be an integer >= 0")


@pytest.mark.slow
def test_run_keeps_its_compiled_programs_in_the_users_cache_folder(tmp_path):
    """With no compilation cache set for JAX, the command line keeps its programs in the user's
    cache folder (``FEDMCMC_CACHE``, then ``xla/``), bounded in size: the same run again, into
    another output folder, loads its chunk programs from there and gives the same samples."""
    cfg = write_config(tmp_path / "c.toml", iterations=200, burn_in=100, chunk=100)
    env = {**{k: v for k, v in ENV.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))},
           "FEDMCMC_CACHE": str(tmp_path / "cache"), "JAX_LOG_COMPILES": "1"}
    logs = []
    for out in ("a", "b"):
        proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", str(cfg), "--out", str(tmp_path / out),
                               "--no-progress"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        logs.append(proc.stderr)
    assert any(p.name.startswith("jit_run_chunk") for p in (tmp_path / "cache" / "xla").iterdir())
    # JAX logs every chunk program it gets ("Finished XLA compilation"), and a hit before those it loads
    got = [log.count("Finished XLA compilation of jit(run_chunk)") for log in logs]
    hits = [log.count("Persistent compilation cache hit for 'jit_run_chunk'") for log in logs]
    assert hits[0] < got[0]  # the first run compiled its chunk program (its workers then load it)
    assert 0 < hits[1] == got[1]  # the second run loads every one
    import arviz

    a, b = (arviz.from_netcdf(tmp_path / out / "posterior.nc").posterior["theta"].values for out in "ab")
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_samples(tmp_path):
    import arviz

    cfg = write_config(tmp_path / "c.toml", iterations=40000, burn_in=0, chunk=500)
    straight = fedmcmc("run", cfg, "--out", tmp_path / "a", "--no-progress")
    assert straight.returncode == 0, straight.stderr

    proc = subprocess.Popen([sys.executable, "-m", "fedmcmc", "run", str(cfg), "--out", str(tmp_path / "b"),
                             "--no-progress"], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    chunks = tmp_path / "b" / "chunks"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(chunks.glob("chunk_*.npz"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(chunks.glob("chunk_*.npz")))
    assert 3 <= done < 80, f"the run was not interrupted mid-way ({done} chunks)"
    resumed = fedmcmc("run", cfg, "--out", tmp_path / "b", "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    a = arviz.from_netcdf(tmp_path / "a" / "posterior.nc").posterior["theta"].values
    b = arviz.from_netcdf(tmp_path / "b" / "posterior.nc").posterior["theta"].values
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of a few rounds: its config and output folder (tests that change it copy it)."""
    from fedmcmc.app.cli import main

    folder = tmp_path_factory.mktemp("finished")
    cfg = write_config(folder / "c.toml", iterations=20, burn_in=0, chunk=10)
    assert main(["run", str(cfg), "--out", str(folder / "out"), "--no-progress", "--workers", "1"]) == 0
    return cfg, folder / "out"


def contents(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_resume_with_another_step_size_is_refused_and_keeps_the_run(finished, tmp_path):
    cfg, out = finished
    before = contents(out)
    changed = write_config(tmp_path / "c.toml", step=5e-4, iterations=20, burn_in=0, chunk=10)
    proc = refused("run", changed, "--out", out, "--resume", "--no-progress", "--workers", "1")
    assert_one_line_error(proc, f"cannot resume from {out}: its run had [sampler] step_size = 0.001, this one 0.0005",
                          "--overwrite")
    assert contents(out) == before  # the chunks, the checkpoint and the outputs as they were


@pytest.mark.slow
def test_a_folder_holding_a_run_is_refused_and_replaced_only_with_overwrite(finished, tmp_path):
    cfg, out = finished
    before = contents(out)
    proc = refused("run", cfg, "--out", out, "--no-progress", "--workers", "1")
    assert_one_line_error(proc, f"{out} holds a run", "--resume", "--overwrite")
    assert contents(out) == before
    assert_one_line_error(refused("run", cfg, "--out", out, "--resume", "--overwrite"), "not both")
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "chunks" / "chunk_000099.npz").write_bytes(b"an old run's")
    changed = write_config(tmp_path / "c.toml", step=5e-4, iterations=20, burn_in=0, chunk=10)
    proc = refused("run", changed, "--out", copy, "--overwrite", "--no-progress", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if "--overwrite" in line] == [
        f"fedmcmc: --overwrite: removed the run that was in {copy}"]
    assert sorted(p.name for p in (copy / "chunks").iterdir()) == ["chunk_000000.npz", "chunk_000001.npz", "state.npz"]
    assert "step_size = 0.0005" in (copy / "config.toml").read_text()
    assert contents(copy)[Path("posterior.nc")] != before[Path("posterior.nc")]


@pytest.mark.parametrize("change, fragments", [
    (dict(step=0.0), ["step_size must be > 0"]),
    (dict(step=-1e-3), ["step_size must be > 0"]),
    (dict(compression="{ levels = 0 }"), ["levels", ">= 1"]),
    (dict(participation="{ p = 1.5 }"), ["(0, 1]"]),
    (dict(participation="{ p = 0.0 }"), ["(0, 1]"]),
    (dict(sampler="qlsd-magic"), ["unknown sampler", "qlsd*"]),
])
def test_bad_config_values_give_one_clear_line(tmp_path, change, fragments):
    proc = refused("run", write_config(tmp_path / "c.toml", **change), "--out", tmp_path / "o")
    assert_one_line_error(proc, *fragments)


def test_missing_and_malformed_files(tmp_path):
    assert_one_line_error(fedmcmc("run", tmp_path / "nope.toml"), "not found")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sampler\nname = 'qlsd'")
    assert_one_line_error(refused("run", bad), "not valid TOML")
    typo = tmp_path / "typo.toml"
    typo.write_text(write_config(tmp_path / "c.toml").read_text().replace("num_clients = 5", "num_clients = 'five'"))
    assert_one_line_error(refused("run", typo), "num_clients must be")
    partial = tmp_path / "partial.toml"
    partial.write_text("[problem]\nname = 'heterogeneous-gaussian'\n")
    assert_one_line_error(refused("run", partial), "[sampler]")
    schedule = write_config(tmp_path / "schedule.toml", iterations=2001)  # thinning = 5
    assert_one_line_error(refused("run", schedule, "--out", tmp_path / "never"), "multiple of thinning")
    assert not (tmp_path / "never").exists()  # refused before anything is written


def test_unknown_experiment_and_bad_overrides():
    assert_one_line_error(fedmcmc("reproduce", "no-such-study"), "unknown experiment", "fedmcmc list")
    assert_one_line_error(refused("reproduce", "qlsd-toy-gaussian", "--set", "gamma=1"), "KEY one of", "step_size")
    assert_one_line_error(refused("reproduce", "qlsd-toy-gaussian", "--set", "step_size=-1"), "step_size must be > 0")


@pytest.mark.slow
def test_divergence_names_the_step_size_to_lower(tmp_path):
    cfg = write_config(tmp_path / "c.toml", sampler="qlsd#", step=5.0, compression='"none"', participation="1.0")
    proc = fedmcmc("run", cfg, "--out", tmp_path / "o", "--no-progress")
    assert_one_line_error(proc, "diverged", "lower the step size (now 5)", "2.5", 'step_size = "auto"', code=3)


def test_divergence_after_an_auto_step_names_a_smaller_one_from_its_curvature(tmp_path, monkeypatch):
    from fedmcmc.runtime import simulator
    from fedmcmc.runtime.records import DivergenceError

    def diverges(*args, **kwargs):
        raise DivergenceError(7, [0])

    monkeypatch.setattr(simulator, "simulate", diverges)
    cfg = write_config(tmp_path / "c.toml", sampler="qlsd#", step='"auto"', compression='"none"', participation="1.0")
    proc = refused("run", cfg, "--out", tmp_path / "o", "--no-progress", "--workers", "1")
    step = float(proc.stdout.split("step_size = auto: ")[1].split()[0])
    lam = proc.stdout.split("lambda_max = ")[1].split()[0]
    assert_one_line_error(proc, "by iteration 7", f"lambda_max = {lam}", f"e.g. step_size = {step / 2:.3g}", code=3)


@pytest.mark.parametrize("failure", ["worker process 1 exited (code -9); its error, if any, is printed above",
                                     "worker 0 failed with RuntimeError: out of memory"])
def test_a_worker_that_dies_or_fails_is_one_line_and_exit_code_3(tmp_path, monkeypatch, failure):
    from fedmcmc.app import config
    from fedmcmc.runtime.workers import WorkerError

    def dies(*args, **kwargs):
        raise WorkerError(failure)

    monkeypatch.setattr(config, "run", dies)
    proc = refused("run", write_config(tmp_path / "c.toml"), "--out", tmp_path / "o")
    assert_one_line_error(proc, failure, "--resume", "--workers 1", code=3)
