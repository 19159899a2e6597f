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
APP_DIR = Path(__file__).parent / "flwr_app"


def prepare_config(path, clients: int | None = None) -> str:
    """The config's TOML text, checked, with ``[problem]`` resized to ``clients`` if given."""
    from fedmcmc.app import config as config_lib

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
    from fedmcmc.app import config as config_lib

    return config_lib.from_text(text)[1].data.num_clients


def run_sim(config_path, out, clients: int | None = None, resume: bool = False) -> dict:
    """Run on Flower's simulation engine; returns the ``results.json`` payload."""
    return run_sim_many([(prepare_config(config_path, clients), out)], resume=resume)[0]


def run_sim_many(runs: list[tuple[str, str]], resume: bool = False) -> list[dict]:
    """Runs ``[(config text, out), ...]`` (same number of clients) in one simulation engine."""
    os.environ.update(ENV)
    from flwr.simulation import run_simulation

    from fedmcmc.app.flower.apps import client_app, make_server_app

    sizes = {num_clients(text) for text, _ in runs}
    if len(sizes) != 1:
        raise ValueError(f"runs in one simulation need the same number of clients (got {sorted(sizes)})")
    for _, out in runs:
        Path(out).mkdir(parents=True, exist_ok=True)
    app = make_server_app([(text, str(out)) for text, out in runs], resume=resume, engine="simulation")
    run_simulation(app, client_app, num_supernodes=sizes.pop(),
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 1, "include_dashboard": False,
                                                 "log_to_driver": False}})
    if len(app.results) != len(runs):
        raise RuntimeError("the Flower simulation ended before its runs finished; see the log above")
    return app.results


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDeployment:
    """A SuperLink and ``n`` SuperNodes on 127.0.0.1 (context manager; every process it
    started is stopped on exit). ``tls=(ca, cert, key)`` paths switch TLS on."""

    def __init__(self, n: int, workdir, tls=None, node_config=None, auth_keys=None):
        self.n, self.workdir, self.tls = n, Path(workdir), tls
        self.node_config = node_config or {}
        self.auth_keys = auth_keys  # [(private key path, public key path)] per node, or None
        self.procs: list = []

    def __enter__(self):
        import shutil
        import subprocess
        import sys

        self.workdir.mkdir(parents=True, exist_ok=True)
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, **ENV, "FLWR_HOME": str(home), "PATH": bindir + os.pathsep + os.environ["PATH"]}
        self.bin = lambda name: shutil.which(name, path=self.env["PATH"]) or name  # noqa: E731
        self.port = free_port()
        security = ["--insecure"] if self.tls is None else [
            "--ssl-ca-certfile", str(self.tls[0]), "--ssl-certfile", str(self.tls[1]), "--ssl-keyfile", str(self.tls[2])]
        connection = 'insecure = true' if self.tls is None else f'root-certificates = "{self.tls[0]}"'
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.port}"\n{connection}\n')

        def start(args, log):
            out = open(self.workdir / log, "w")
            self.procs.append(subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))

        auth = ["--enable-supernode-auth"] if self.auth_keys else []
        start([self.bin("flower-superlink"), *security, *auth, "--port", str(self.port),
               "--disable-runtime-dependency-installation", "--database", str(self.workdir / "link.db")], "superlink.log")
        self._wait_for_port(self.port)
        node_security = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls[0])]
        if self.auth_keys:
            for _, public in self.auth_keys:
                self.register(public)
        for i in range(self.n):
            cfg = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                           for k, v in {"partition-id": i, **self.node_config.get(i, {})}.items())
            key = ["--auth-supernode-private-key", str(self.auth_keys[i][0])] if self.auth_keys else []
            start([self.bin("flower-supernode"), *node_security, *key, "--superlink", f"127.0.0.1:{self.port}",
                   "--port", str(free_port()), "--node-config", cfg], f"supernode{i}.log")
        return self

    def _wait_for_port(self, port: int, timeout: float = 120.0) -> None:
        import socket
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return
            except OSError:
                if self.procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink did not start; see {self.workdir / 'superlink.log'}") from None
                time.sleep(0.3)

    def register(self, public_key, timeout: float = 120.0) -> None:
        """``flwr supernode register`` (retried until the SuperLink is up)."""
        import subprocess
        import time

        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([self.bin("flwr"), "supernode", "register", str(public_key), "local"],
                                  env=self.env, capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not register {public_key}: {done.stdout[-1000:]} {done.stderr[-1000:]}")
            time.sleep(1.0)

    def supernode(self, i: int):
        return self.procs[1 + i]

    def run(self, cfg_path, out, resume: bool = False, timeout: float = 1800.0) -> dict:
        """Submit the app with ``flwr run`` and wait for ``out/results.json``."""
        return self.wait(self.submit(cfg_path, out, resume), timeout)

    def submit(self, cfg_path, out, resume: bool = False) -> Path:
        import subprocess

        out = Path(out).absolute()
        out.mkdir(parents=True, exist_ok=True)
        result = out / "results.json"
        for old in (result, out / "flower-error.txt"):
            if old.exists():
                old.unlink()
        run_config = f"config-path='{Path(cfg_path).absolute()}' out='{out}' resume={str(resume).lower()}"
        done = subprocess.run([self.bin("flwr"), "run", str(APP_DIR), "local", "--run-config", run_config],
                              env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"flwr run failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
        return result

    def wait(self, result: Path, timeout: float = 1800.0) -> dict:
        import json
        import time

        deadline = time.monotonic() + timeout
        error = result.with_name("flower-error.txt")
        while not result.exists():
            if error.exists():
                raise RuntimeError(f"the ServerApp failed: {error.read_text().strip()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {result} after {timeout:.0f} s; see the logs in {self.workdir}")
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"the SuperLink stopped; see {self.workdir / 'superlink.log'}")
            time.sleep(1.0)
        time.sleep(0.5)
        return json.loads(result.read_text())

    def kill_supernode(self, i: int) -> None:
        """Kill SuperNode ``i`` and the processes it started (a crashed institution)."""
        import signal

        self._kill(self.supernode(i), signal.SIGKILL)

    def _kill(self, proc, sig) -> None:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc):
        import signal

        family = {p.pid: _descendants(p.pid) for p in self.procs}  # Flower detaches some children
        for p in self.procs:
            self._kill(p, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self._kill(p, signal.SIGKILL)
        for pids in family.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return False


def _descendants(pid: int) -> list[int]:
    """Process ids of every descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_deploy(config_path, out, clients: int | None = None, resume: bool = False) -> dict:
    """Run on a local deployment (SuperLink + one SuperNode per client on 127.0.0.1)."""
    text = prepare_config(config_path, clients)
    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "run.toml"
    cfg_path.write_text(text)
    with LocalDeployment(num_clients(text), out / "deployment") as dep:
        return dep.run(cfg_path, out, resume=resume)
