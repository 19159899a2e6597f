"""``[privacy]`` through the command line: a budget picks the clipping bound and the run records
the (epsilon, delta) it met, or writes only what it covers (release = "draws"); a bound that misses the budget, a sampler without a bound and bad
keys are refused in one line with exit code 2, and nothing is written."""

import json
import re

import h5netcdf
import pytest

from fedmcmc.app.cli import main

CONFIG = """
[problem]
name = "heterogeneous-gaussian"
num_clients = 4
dim = 3

[sampler]
name = "{sampler}"
step_size = 1e-3
batch_size = 10
compression = {{ bits = 4 }}

[run]
seed = 1
num_chains = 2
num_iterations = 60

[privacy]
{privacy}
"""


def write(tmp_path, privacy, sampler="qlsd#"):
    path = tmp_path / "run.toml"
    text = CONFIG.format(privacy=privacy, sampler=sampler.split()[0])
    if sampler.endswith("seedless"):
        text = text.replace("seed = 1\n", "")
    if sampler.endswith("fixed"):  # uploads on secure aggregation's integer grid
        text = text.replace("{ bits = 4 }", "{ bits = 4, fixed_point = { fraction_bits = 16, max_abs = 1000.0 } }")
    path.write_text(text)
    return path


@pytest.mark.slow
def test_a_budget_picks_the_clip_and_the_run_records_what_it_met(tmp_path):
    """... and release = "draws" writes the same draws with only what the accountant covers."""
    path = write(tmp_path, "delta = 1e-5\nepsilon = 2.0")
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--workers", "1"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    record = results["privacy"]
    assert record["budget"] == {"epsilon": 2.0, "level": "client"} and record["rounds"] == 60
    assert 1.99 < record["client"]["epsilon"] <= 2.0 and record["client"]["delta"] == 1e-5
    assert record["clip"] > 0 and record["record"]["epsilon"] > record["client"]["epsilon"]  # replace vs add/remove
    assert record["release"] == "all" and "upload_bits_per_chain" in results
    assert "seed" not in results["config"]["run"] and not record["publish_seed"]  # the noise's secret, by default
    with h5netcdf.File(tmp_path / "out" / "posterior.nc", "r") as f:  # ArviZ's attributes carry it too
        assert json.loads(f.attrs["privacy"])["clip"] == record["clip"] and "sample_stats" in f.groups
        assert "seed" not in json.loads(f.attrs["config"])["run"]
        theta = f.groups["posterior"].variables["theta"][...]
    path = write(tmp_path, "delta = 1e-5\nepsilon = 2.0\nrelease = \"draws\"")
    assert main(["run", str(path), "--out", str(tmp_path / "draws"), "--no-progress", "--workers", "1"]) == 0
    results = json.loads((tmp_path / "draws" / "results.json").read_text())
    assert set(results) == {"config", "sampler", "num_draws", "num_stored_draws", "stored_every", "diagnostics", "step",
                            "privacy", "inputs", "provenance"}  # the commit and machine: no data
    assert results["privacy"]["not_covered"] != record["not_covered"] and results["privacy"]["clip"] == record["clip"]
    assert "seed" not in results["config"]["run"]  # the noise's secret
    with h5netcdf.File(tmp_path / "draws" / "posterior.nc", "r") as f:
        assert list(f.groups) == ["posterior"] and (f.groups["posterior"].variables["theta"][...] == theta).all()


def run_fails(capsys, tmp_path, privacy, *fragments, sampler="qlsd#"):
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, privacy, sampler)), "--out", str(out), "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedmcmc: error:"), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("privacy,sampler,fragments", [
    ("delta = 1e-5\nepsilon = 2.0\nclip = 5.0", "qlsd#",
     ("client-level epsilon is", "> epsilon = 2; set [privacy] clip <= ", "or [run] num_iterations <= ")),
    ("delta = 1e-5\nepsilon = 2.0", "qlsd++", ("epsilon for qlsd++ at level 'client'", "memory terms")),
    ("delta = 1e-5\nepsilon = 2.0\nlevel = \"record\"", "qlsd#", ("record_clip (uncompressed uploads) or clip",)),
    ("epsilon = 2.0", "qlsd#", ("[privacy] needs delta in (0, 1)",)),
    ("delta = 1e-5\nclip = -1", "qlsd#", ("[privacy] clip must be a finite number > 0",)),
    ("delta = 1e-5\nsigma = 1", "qlsd#", ("unknown key(s) ['sigma'] in [privacy]",)),
    ("delta = 1e-5\nclip = 1.0\nrelease = \"some\"", "qlsd#", ("[privacy] release must be one of ('all', 'draws')",)),
    ("delta = 1e-5\nclip = 1.0\nrelease = \"draws\"", "qlsd# seedless", ('needs a secret [run] seed',)),
    ("delta = 1e-5\nclip = 1.0\nrelease = \"draws\"\npublish_seed = true", "qlsd#",
     ('publish_seed = true contradicts release = "draws"',)),
    ("delta = 1e-5\nclip = 1e-6", "qlsd# fixed", ("[privacy] clip: a clip of 1e-06 cannot hold on the grid 2**-16",
                                                 "raise fixed_point fraction_bits")),
])
def test_refusals_are_one_line_exit_2_nothing_written(tmp_path, capsys, privacy, sampler, fragments):
    run_fails(capsys, tmp_path, privacy, *fragments, sampler=sampler)


def test_release_draws_refuses_draws_that_depend_on_the_data_without_noise():
    from fedmcmc.app.privacy import _draws_only

    run = {"run": {"seed": 7}}
    for cfg, fragment in (({**run, "sampler": {"step_size": "auto"}}, "needs a numeric [sampler] step_size"),
                          ({**run, "sampler": {}, "data": {"builtin": "breast-cancer"}}, "standardise = false")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            _draws_only(cfg, ValueError)
    _draws_only({**run, "sampler": {}, "data": {"standardise": False}}, ValueError)


@pytest.mark.parametrize("sampler,privacy,level", [
    ('name = "fa-ld"\nstep_size = 1e-3\nlocal_steps = 1', "delta = 1e-5\nepsilon = 5.0", "client"),
    ('name = "dsgld"\nstep_size = 1e-3\nlocal_steps = 5\nbatch_size = 10', "delta = 1e-5\nepsilon = 5.0",
     "client"),  # a replaced shard: its record_clip is chosen
    ('name = "qlsd++"\nstep_size = 1e-3\nbatch_size = 10\nmemory = false\ncompression = {{ bits = 4 }}',
     "delta = 1e-5\nepsilon = 5.0\nlevel = \"record\"", "record"),  # through the client's clip
])
def test_fa_ld_and_dsgld_meet_a_budget_with_their_builders_defaults(sampler, privacy, level):
    from fedmcmc.app import config

    text = CONFIG.replace('name = "{sampler}"\nstep_size = 1e-3\nbatch_size = 10\ncompression = {{ bits = 4 }}',
                          sampler).format(privacy=privacy)
    _, built = config.from_text(text)
    assert 4.99 < built.privacy[level]["epsilon"] <= 5.0
    assert built.privacy["record_clip" if "dsgld" in sampler else "clip"] is not None
    assert "qlsd++" not in sampler or built.privacy["client"]["epsilon"] < 5.0  # add/remove vs replace


def chains_config(chains: int, accountant: str) -> str:
    """CONFIG's QLSD# with 1/p participation (p = 0.5), ``chains`` chains of 200 rounds and clip C = 5."""
    text = CONFIG.format(sampler="qlsd#", privacy=f'delta = 1e-5\nclip = 5.0\naccountant = "{accountant}"')
    return text.replace("compression = { bits = 4 }\n", "compression = { bits = 4 }\n"
                        'participation = { p = 0.5, scaling = "inverse_probability" }\n').replace(
        "num_chains = 2\nnum_iterations = 60", f"num_chains = {chains}\nnum_iterations = 200")


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_the_recorded_epsilon_composes_every_released_chain(accountant):
    """Each chain is an independent run of the mechanism on the same data and posterior.nc
    releases them all: the record's epsilon is dp_accounting's for rounds x chains mechanisms,
    recomputed here from the mechanism itself (QLSD#, gamma = 1e-3, C = 5, p = 0.5 with 1/p weights:
    z = sqrt(2 / gamma) / (C / p) = 4.472136; a record moves one upload within C: z / 2, no sampling)."""
    import dp_accounting
    from dp_accounting import pld, rdp

    from fedmcmc.app import config

    z = (2 / 1e-3) ** 0.5 / (5.0 / 0.5)
    assert z == pytest.approx(4.472136, abs=1e-6)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    for chains in (1, 2, 4) if accountant == "rdp" else (1, 2):  # PLD composes 800 mechanisms in a minute
        _, built = config.from_text(chains_config(chains, accountant))
        record = built.privacy
        assert record["rounds"] == 200 and record["chains"] == chains
        events = {"client": dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(z)),
                  "record": dp_accounting.GaussianDpEvent(z / 2)}
        for level, event in events.items():
            acc = pld.PLDAccountant(relation) if accountant == "pld" else rdp.RdpAccountant(neighboring_relation=relation)
            acc.compose(dp_accounting.SelfComposedDpEvent(event, 200 * chains))
            assert record[level]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12), (level, chains)
        if chains == 2 and accountant == "rdp":  # 400 mechanisms, not the 200 of one chain (8.31)
            assert record["client"]["epsilon"] == pytest.approx(12.54, abs=0.01)


def test_the_seed_is_left_out_unless_published_and_then_listed_as_not_covered():
    """Whoever knows the seed knows the noise: release = "all" writes the config without it; with
    publish_seed = true it is written and listed in not_covered, as is the public default seed."""
    from fedmcmc.app import config
    from fedmcmc.app.privacy import released

    payload = {"config": {"run": {"seed": 1, "num_chains": 2}}, "settings": {"config": {"run": {"seed": 1}}}}
    for privacy, seeded, fragment in (("delta = 1e-5\nclip = 1.0", True, None),
                                      ("delta = 1e-5\nclip = 1.0\npublish_seed = true", True, "publish_seed = true"),
                                      ("delta = 1e-5\nclip = 1.0", False, "the default, 0, is public")):
        text = CONFIG.format(privacy=privacy, sampler="qlsd#")
        _, built = config.from_text(text if seeded else text.replace("seed = 1\n", ""))
        seeds = [entry for entry in built.privacy["not_covered"] if entry.startswith("the seed")]
        assert seeds == ([] if fragment is None else [seeds[0]]) and (fragment is None or fragment in seeds[0])
        out = released(built.privacy, payload)
        published = built.privacy["publish_seed"]
        assert ("seed" in out["config"]["run"]) == published == ("seed" in out["settings"]["config"]["run"])
        assert out["config"]["run"]["num_chains"] == 2


@pytest.mark.parametrize("chains", [1, 2])
def test_secure_aggregation_records_epsilon_against_a_client_that_sees_participation(chains):
    """Under secure aggregation every active client receives the active sets, so Poisson
    participation does not amplify against it: the record's another_client is dp_accounting's
    Gaussian of z over K rounds at delta / 2, K the 1 - delta / 2 quantile of Binomial(rounds x
    chains, p) (the rounds the protected client enters), recomputed here."""
    import dp_accounting
    from dp_accounting import rdp
    from scipy.stats import binom

    from fedmcmc.app import config

    text = chains_config(chains, "rdp").replace(
        "bits = 4", "bits = 4, fixed_point = { fraction_bits = 16, max_abs = 100.0 }") + \
        "\n[flower]\nsecure_aggregation = true\n"
    record = config.from_text(text)[1].privacy
    z, entered = (2 / 1e-3) ** 0.5 / (5.0 / 0.5), int(binom.isf(0.5e-5, 200 * chains, 0.5))
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), entered))
    assert record["another_client"] == {"epsilon": pytest.approx(acc.get_epsilon(0.5e-5), rel=1e-12),
                                        "delta": 1e-5, "rounds_entered": entered}
    assert record["another_client"]["epsilon"] > record["client"]["epsilon"]  # no amplification
    assert "another_client" not in config.from_text(chains_config(chains, "rdp"))[1].privacy
