"""FA-HMC rounds against dimension (Liang et al. 2024, Section 5.2, Figure 2), tiny settings:
the sampled law of theta follows the exact law of the leapfrog clock."""

import numpy as np
import pytest

from fedmcmc.app.studies import fahmc_dimension as E
from fedmcmc.app.studies.runner import run_study


@pytest.mark.slow
def test_fahmc_dimension_sampled_rounds_follow_the_exact_law(tmp_path):
    r = run_study(E, tmp_path, quick=True, progress=False,
              settings=dict(dims=[1, 16], sample_dims=[1], num_chains=400, max_rounds=5000))
    v = r["dims"]["1"]
    # the population mean and variance after the last round, from 400 runs, against the exact law (5 s.e.)
    assert abs(v["final_mean"] - v["exact_final_mean"]) < 5 * v["final_mean_se"], v
    assert abs(v["final_var"] - v["exact_final_var"]) < 5 * v["final_var_se"], v
    assert np.isfinite(v["rounds"]) and abs(v["rounds"] - v["exact_rounds"]) <= 0.2 * v["exact_rounds"], v
    assert "rounds" not in r["dims"]["16"]  # exact law only
    assert r["dims"]["16"]["exact_rounds"] > v["exact_rounds"] and r["fit"]["exact"]["exponent"] > 0
    assert (tmp_path / "runs" / "d1" / "posterior.nc").exists()
