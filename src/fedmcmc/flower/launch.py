"""``fedmcmc flower sim|deploy``: run a config on Flower's simulation or deployment engine.

* :func:`run_sim` runs the ServerApp in this process and the ClientApps on Flower's
  simulation engine (Ray actors), one virtual SuperNode per client.
* :func:`run_deploy` starts a local deployment on 127.0.0.1 -- a SuperLink and one SuperNode
  per client (``--node-config "partition-id=i"``), with free ports chosen at run time --
  submits the app folder shipped with the package with ``flwr run``, waits for the output
  folder and stops every process it started.

Both write the output folder of ``fedmcmc run`` (``results.json``, ``posterior.nc``,
``chunks/``) and resume with ``resume=True``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
APP_DIR = Path(__file__).parent / "app"


def prepare_config(path, clients: int | None = None) -> str:
    """The config's TOML text, checked, with ``[problem]`` resized to ``clients`` if given."""
    from fedmcmc import config as config_lib

    cfg = config_lib.load(path)
    text = Path(path).read_text()
    if clients is not None:
        if clients < 1:
            raise ValueError(f"--clients must be >= 1 (got {clients})")
        key = "num_shards" if cfg["problem"]["name"] == "gaussian-blobs" else "num_clients"
        text = _set_key(text, "problem", key, clients)
        config_lib.validate(tomllib.loads(text))
    return text


def _set_key(text: str, section: str, key: str, value) -> str:
    lines, out, current, done = text.splitlines(), [], None, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            if current == section and not done:
                out.append(f"{key} = {value}")
                done = True
            current = stripped.strip("[]").strip()
        elif current == section and stripped.split("=")[0].strip() == key:
            line, done = f"{key} = {value}", True
        out.append(line)
    if current == section and not done:
        out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


def num_clients(text: str) -> int:
    from fedmcmc.flower.runtime import build_problem

    return build_problem(text)[1]["data"].num_clients


def run_sim(config_path, out, clients: int | None = None, resume: bool = False) -> dict:
    """Run on Flower's simulation engine; returns the ``results.json`` payload."""
    os.environ.update(ENV)
    from flwr.simulation import run_simulation

    from fedmcmc.flower.apps import client_app, make_server_app

    text = prepare_config(config_path, clients)
    b = num_clients(text)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    app = make_server_app(text, out, resume=resume, engine="simulation")
    run_simulation(app, client_app, num_supernodes=b,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 1, "include_dashboard": False,
                                                 "log_to_driver": False}})
    if not hasattr(app, "result"):
        raise RuntimeError("the Flower simulation ended without results; see the log above")
    return app.result
