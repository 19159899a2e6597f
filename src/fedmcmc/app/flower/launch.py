"""``fedmcmc flower sim|deploy``: run a config on Flower's simulation or deployment engine.

* :func:`run_sim` starts a local SuperLink with Flower's simulation engine (``--simulation``:
  ClientApps as Ray actors, one virtual SuperNode per client) and submits the app with ``flwr run``
  (Flower's supported path; ``flwr.simulation.run_simulation`` is deprecated).
* :func:`run_deploy` starts a local deployment on 127.0.0.1 -- a SuperLink and one SuperNode
  per client (``--node-config "partition-id=i"``), with free ports chosen at run time --
  submits the app folder shipped with the package with ``flwr run``.

Both wait for the output folder and stop every process they started. The run's config travels
in Flower's run config (:func:`run_config_file`); no node reads it from the server's disk.

The output folder is that of ``fedmcmc run`` (``results.json``, ``posterior.nc``,
``chunks/``): a folder that holds a run takes a new one only with ``resume=True`` or
``overwrite=True`` (:func:`fedmcmc.runtime.identity.claim`).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
#: The SuperNode's process launcher (``flower-superexec``, started by each SuperNode with the
#: SuperNode's environment) looks for a new message every second by default; a SuperNode of a
#: local deployment looks every 0.25 s (Flower's public setting; each look is a request to the
#: SuperNode, so a shorter one costs CPU on a busy machine; docs/flower.md, "Latency").
NODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25"}
APP_DIR = Path(__file__).parent / "flwr_app"


def prepare_config(path, clients: int | None = None) -> str:
    """The config's TOML text, checked, with ``[problem]`` resized to ``clients`` if given (a ``[data]``
    run's sampler and client count are checked here too, before any process starts)."""
    from fedmcmc.app import config as config_lib

    from fedmcmc.app.flower import nodes

    cfg = config_lib.load(path)
    text = Path(path).read_text()
    if "data" in cfg:
        nodes.check_sampler(cfg)
        nodes.num_clients(cfg["data"])
    if clients is not None:
        if clients < 1 or "problem" not in cfg:
            raise ValueError(f"--clients N resizes a [problem] (N >= 1, got {clients}); a [data] run has one "
                             "client per entry of files, or partition's num_clients")
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
    """The run's client count, without reading its data (``[data]``: :func:`fedmcmc.app.flower.nodes.num_clients`)."""
    from fedmcmc.app import config as config_lib
    from fedmcmc.app.flower import nodes

    cfg = tomllib.loads(text)
    return nodes.num_clients(cfg["data"]) if "data" in cfg else config_lib.from_text(text)[1].data.num_clients


def data_paths(text: str, base_dir) -> dict[int, dict]:
    """``{i: {"data-path": file i}}`` (absolute) for a config of ``[data] files = [...]`` (names of
    files, not LEAF users): each SuperNode of a local deployment reads its own file."""
    files = tomllib.loads(text).get("data", {}).get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return {}
    return {i: {"data-path": str((Path(base_dir) / f).absolute())} for i, f in enumerate(files)}


def run_sim(config_path, out, clients: int | None = None, resume: bool = False, overwrite: bool = False,
            echo=None) -> dict:
    """Run on Flower's simulation engine (``flwr run`` on a local SuperLink started with
    ``--simulation``, one virtual SuperNode per client); returns the ``results.json`` payload.
    The engine gives its virtual nodes no node config of ours: node i of a ``[data]`` run reads
    client i of the config's ``[data]`` (paths from the config's folder, the run config's ``data-dir``).
    ``echo``: as :func:`run_deploy`."""
    text, out = prepare_config(config_path, clients), _claimed(out, resume, overwrite)
    cfg_path = out / "run.toml"
    cfg_path.write_text(text)
    with LocalDeployment(num_clients(text), out / "simulation", simulation=True) as dep:
        return _watched(dep, cfg_path, out, resume, Path(config_path).parent, echo)


def _claimed(out, resume: bool, overwrite: bool) -> Path:
    """The output folder, absolute and made, once :func:`fedmcmc.runtime.identity.claim` lets the run use it."""
    from fedmcmc.runtime import identity

    out = Path(out).absolute()
    identity.claim(out, resume, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_config_file(text: str, out: Path, resume: bool, engine: str, data_dir=None) -> Path:
    """The file given to ``flwr run --run-config``: the run's TOML travels whole, as the run config's
    ``config`` value (Flower flattens a run-config file into keys the app declares, with int, float,
    bool or str values, so the sections and lists of a ``fedmcmc run`` TOML cannot be flattened);
    ``data-dir`` is where the config's relative paths start (its folder)."""
    path = out / "flower-run.toml"
    path.write_text(f"config = {json.dumps(text, ensure_ascii=False)}\n"
                    f"out = {json.dumps(str(out), ensure_ascii=False)}\n"
                    f"resume = {str(resume).lower()}\nengine = {json.dumps(engine)}\n"
                    f"data-dir = {json.dumps(str(Path(data_dir or out).absolute()), ensure_ascii=False)}\n")
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDeployment:
    """A SuperLink and ``n`` SuperNodes on 127.0.0.1 (context manager; every process it
    started is stopped on exit). ``tls=(ca, cert, key)`` paths switch TLS on. Each SuperNode
    has a node worker (:mod:`fedmcmc.app.flower.node_worker`, folder ``workdir/workerI``) unless
    ``workers=False``. With ``simulation=True`` the SuperLink runs Flower's simulation engine
    with ``n`` virtual SuperNodes instead (no SuperNode processes). :meth:`submit` submits the app
    folder ``app_dir`` (default: the app shipped with the package, ``flwr_app/``)."""

    def __init__(self, n: int, workdir, tls=None, node_config=None, auth_keys=None, simulation: bool = False,
                 workers: bool = True, app_dir=APP_DIR):
        self.n, self.workdir, self.tls, self.simulation = n, Path(workdir), tls, simulation
        self.app_dir = Path(app_dir)
        self.workers = workers and not simulation
        self.node_config = node_config or {}
        self.auth_keys = auth_keys  # [(private key path, public key path)] per node, or None
        self.procs: list = []

    def __enter__(self):
        import shutil
        import sys

        self.workdir.mkdir(parents=True, exist_ok=True)
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, **ENV, **NODE_ENV, "FLWR_HOME": str(home), "PATH": bindir + os.pathsep + os.environ["PATH"]}
        self.bin = lambda name: shutil.which(name, path=self.env["PATH"]) or name  # noqa: E731
        self.port = free_port()
        security = ["--insecure"] if self.tls is None else [
            "--ssl-ca-certfile", str(self.tls[0]), "--ssl-certfile", str(self.tls[1]), "--ssl-keyfile", str(self.tls[2])]
        connection = 'insecure = true' if self.tls is None else f'root-certificates = "{self.tls[0]}"'
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.port}"\n{connection}\n')

        self.node_args: dict[int, list] = {}
        self.nodes: dict = {}
        self.node_workers: dict = {}

        auth = ["--enable-supernode-auth"] if self.auth_keys else []
        simulation = ["--simulation"] if self.simulation else []
        self._start([self.bin("flower-superlink"), *security, *auth, *simulation, "--port", str(self.port),
                     "--disable-runtime-dependency-installation"],
                    "superlink.log")
        self._wait_for_port(self.port)
        node_security = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls[0])]
        if self.auth_keys:
            for _, public in self.auth_keys:
                self.register(public)
        for i in range(0 if self.simulation else self.n):
            key = ["--auth-supernode-private-key", str(self.auth_keys[i][0])] if self.auth_keys else []
            self.node_args[i] = [sys.executable, "-m", "fedmcmc", "supernode", *node_security, *key, "--superlink",
                                 f"127.0.0.1:{self.port}", "--port", str(free_port())]
            self._start_node(i, self.node_config.get(i, {}))
        return self

    def _start_node(self, i: int, extra: dict, mode: str = "w") -> None:
        """SuperNode ``i`` with the node config ``extra``, and its worker (``workers=True``)."""
        import sys

        if self.workers:
            folder = self.workdir / f"worker{i}"
            self.node_workers[i] = self._start([sys.executable, "-m", "fedmcmc", "node-worker", str(folder)],
                                               f"worker{i}.log", mode)
            extra = {"worker": str(folder), **extra}
        config = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in {"partition-id": i, **extra}.items())
        self.nodes[i] = self._start(self.node_args[i] + ["--node-config", config], f"supernode{i}.log", mode)

    def _start(self, args, log: str, mode: str = "w"):
        import subprocess

        out = open(self.workdir / log, mode)
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        return self.procs[-1]

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
        """The latest process of SuperNode ``i``."""
        return self.nodes[i]

    def run(self, cfg_path, out, resume: bool = False, timeout: float = 1800.0, data_dir=None,
            progress=None) -> dict:
        """Submit the app with ``flwr run`` and wait for ``out/results.json`` (``progress``: :meth:`wait`)."""
        return self.wait(self.submit(cfg_path, out, resume, data_dir), timeout, progress)

    def submit(self, cfg_path, out, resume: bool = False, data_dir=None) -> Path:
        """Submit the run of the config file ``cfg_path`` (its text travels in the run config;
        relative data paths start at ``data_dir``, default: its folder)."""
        out = Path(out).absolute()
        out.mkdir(parents=True, exist_ok=True)
        result = out / "results.json"
        from fedmcmc.runtime.messaging.server import PROGRESS

        for old in (result, out / "flower-error.txt", out / "flower-done.txt", out / PROGRESS):
            if old.exists():
                old.unlink()
        engine = "simulation" if self.simulation else "deployment"
        run_config = run_config_file(Path(cfg_path).read_text(), out, resume, engine, data_dir or Path(cfg_path).parent)
        self.flwr_run(self.app_dir, run_config)
        return result

    def flwr_run(self, app_dir, run_config: Path) -> None:
        """``flwr run APP_DIR`` on this deployment with the run-config file ``run_config``."""
        import subprocess

        federation = ["--federation-config", f"num-supernodes={self.n} client-resources-num-cpus=1 "
                      "init-args-num-cpus=1 init-args-log-to-driver=false"] if self.simulation else []
        done = subprocess.run([self.bin("flwr"), "run", str(app_dir), "local", "--run-config", str(run_config),
                               *federation], env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"flwr run failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")

    def wait(self, result: Path, timeout: float = 1800.0, progress=None) -> dict:
        """Wait for the ServerApp to finish the run (``flower-done.txt``); its ``results.json``.
        ``progress(record)`` is called with each new record of the server's ``progress.json``
        (:func:`fedmcmc.runtime.messaging.server.write_progress`)."""
        import time

        from fedmcmc.runtime.messaging.server import PROGRESS

        deadline = time.monotonic() + timeout
        error, done = result.with_name("flower-error.txt"), result.with_name("flower-done.txt")
        seen = None
        while not done.exists():
            if progress is not None:
                seen = _new_progress(result.with_name(PROGRESS), seen, progress)
            if error.exists():
                raise RuntimeError(f"the ServerApp failed: {error.read_text().strip()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not finish in {timeout:.0f} s; see the logs in {self.workdir}")
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"the SuperLink stopped; see {self.workdir / 'superlink.log'}")
            time.sleep(0.2)
        return json.loads(result.read_text())

    def restart_supernode(self, i: int, node_config: dict | None = None, keys=None) -> None:
        """Start SuperNode ``i`` again: same partition, node config ``node_config`` (default: as
        before). With SuperNode authentication the SuperLink knows a node by its key and reactivates
        it under its node id only once it has marked it offline (two missed heartbeats, up to 60 s);
        ``keys=(private, public)`` registers a new key pair instead, which gets a new node id at once."""
        args = list(self.node_args[i])
        if keys is not None:
            self.register(keys[1])
            args[args.index("--auth-supernode-private-key") + 1] = str(keys[0])
        self.node_args[i] = args
        self._start_node(i, self.node_config.get(i, {}) if node_config is None else node_config, "a")

    def kill_serverapp(self) -> None:
        """Kill the running ServerApp process (a crashed server; the SuperLink and nodes stay)."""
        import signal

        for pid in _descendants(self.procs[0].pid):
            try:
                if "flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def kill_supernode(self, i: int) -> None:
        """Kill SuperNode ``i``, the processes it started and its worker (a crashed institution)."""
        import signal

        for proc in (self.supernode(i), self.node_workers.get(i)):
            if proc is not None:
                self._kill(proc, signal.SIGKILL)

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


def run_deploy(config_path, out, clients: int | None = None, resume: bool = False, overwrite: bool = False,
               echo=None, tls=None, auth_keys=None) -> dict:
    """Run on a local deployment (SuperLink + one SuperNode per client on 127.0.0.1); with
    ``[data] files = [...]``, SuperNode i reads file i from its node config (``data-path``).

    ``echo(line)`` (default: standard error) gets the run's progress (:class:`Progress`) and, at
    the end, the warnings that ``fedmcmc run`` prints (the ServerApp's own go to its log).
    ``tls`` and ``auth_keys``: as :class:`LocalDeployment`'s (TLS, SuperNode authentication)."""
    text, out = prepare_config(config_path, clients), _claimed(out, resume, overwrite)
    cfg_path = out / "run.toml"
    cfg_path.write_text(text)
    folder = Path(config_path).parent
    with LocalDeployment(num_clients(text), out / "deployment", tls=tls, node_config=data_paths(text, folder),
                         auth_keys=auth_keys) as dep:
        return _watched(dep, cfg_path, out, resume, folder, echo)


def _watched(dep, cfg_path, out, resume, folder, echo) -> dict:
    """``dep.run``, its progress and then its warnings to ``echo`` (default: standard error)."""
    echo = echo or _stderr
    payload = dep.run(cfg_path, out, resume=resume, data_dir=folder, progress=Progress(echo))
    for line in warnings(out, payload):
        echo(f"fedmcmc: warning: {line}")
    return payload


def warnings(out: Path, payload: dict) -> list[str]:
    """The warnings that ``fedmcmc run`` prints, of the run finished in ``out`` (``payload``: its
    ``results.json``): the convergence diagnostics' (``summary.json``) and a failed posterior check's."""
    from fedmcmc.app import posterior

    path = Path(out) / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    checked = payload.get("posterior_check") or {}
    flagged = posterior.message(checked) if "flagged" in checked else None  # as config.report
    return list(summary.get("warnings", [])) + ([flagged] if flagged else [])


class Progress:
    """Prints a deployment's progress from the server's ``progress.json`` records: once the
    rounds after the first (which compiles) are timed, how long the configured rounds take at that
    latency; then the rounds done and the time left, at most every ``every`` seconds and at the end."""

    def __init__(self, echo, every: float = 10.0):
        import time

        self.echo, self.every, self.clock = echo, every, time.monotonic
        self.estimated, self.last = False, -float("inf")

    def __call__(self, record: dict) -> None:
        done, total, per = record["done"], record["total"], record["seconds_per_round"]
        if per is None:
            return
        if not self.estimated and (done >= 2 or done == total):
            self.estimated = True
            self.echo(f"fedmcmc: at the measured {per:.3g} s per round, the configured {total:,} rounds take about "
                      f"{duration(per * total)}")
        if self.clock() - self.last < self.every and done < total:
            return
        self.last = self.clock()
        self.echo(f"fedmcmc: round {done:,}/{total:,}, {per:.3g} s per round, about "
                  f"{duration(record['remaining_seconds'])} left")


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``14 days``."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.2g} {unit}" if seconds < 10 * size else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _new_progress(path: Path, seen, progress):
    """Call ``progress`` with ``path``'s record if it is new; the record last seen."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return seen
    if record != seen:
        progress(record)
    return record


def _stderr(line: str) -> None:
    import sys

    sys.stderr.write(line + "\n")
    sys.stderr.flush()
