"""A node worker: the long-lived process a SuperNode's per-message ClientApp processes hand
their work to.

Flower starts a new ClientApp process for every message (docs/flower.md, "Latency per round"),
so a ClientApp that answers by itself imports JAX, reads its data, builds the run and loads
its compiled programs once per message. With ``worker='FOLDER'`` in a SuperNode's node config
the ClientApp process imports Flower and NumPy only: it sends the message, the run's config
text, the node's ``Context`` fields and its stored state to the worker listening in
``FOLDER`` and relays the answer; JAX, the node's data, its built runs and compiled programs
stay loaded in the worker between messages. The worker runs
:func:`fedmcmc.app.flower.replies.answer`, as the ClientApp process would, so the replies are the
same bit for bit; the node's state still travels in Flower's ``Context.state``, so a worker
holds nothing that a restart would lose. If no worker answers in ``FOLDER`` (not started,
killed, or stopped or stuck so that it does not prove its key within ``HANDSHAKE_TIMEOUT``
seconds), the ClientApp process answers by itself and logs why.

Start one per SuperNode, as the SuperNode's user, before or after the SuperNode::

    fedmcmc node-worker /srv/fedmcmc/node0-worker &
    fedmcmc supernode ... --node-config "partition-id=0 worker='/srv/fedmcmc/node0-worker'"

(``fedmcmc flower deploy`` does this for its SuperNodes.) The folder is made private to the
user (mode 0700); it holds the Unix socket and a random key with which the ClientApp processes
authenticate (:mod:`multiprocessing.connection`'s HMAC challenge), since requests and answers
are pickled. The worker answers one message at a time (a connection that never sends its
request holds up only its own thread, for ``HANDSHAKE_TIMEOUT`` seconds), and exits after
``idle`` seconds without one (default one hour) or on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import struct
import threading
import time
import tomllib
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path

from fedmcmc.app.flower import replies
from fedmcmc.runtime.settings import FlowerSettings

log = logging.getLogger("fedmcmc.runtime.messaging")

SOCKET, KEY = "socket", "key"
#: The longest path of a Unix socket on Linux (``sun_path`` holds 108 bytes with the final NUL).
MAX_SOCKET_PATH = 107
#: Seconds a ClientApp process waits for the worker at each step of connecting (the key challenge
#: both ways) and at each read or write of a message before answering by itself: a worker that is
#: stopped still completes the socket's connection in the kernel, and would then never answer.
HANDSHAKE_TIMEOUT = 60.0


def serve(folder, idle: float = 3600.0) -> None:
    """Answer the requests of the node's ClientApp processes (module docstring) until ``idle``
    seconds pass without one; a request that fails is answered with its error."""
    folder = Path(folder).absolute()
    address = folder / SOCKET
    if len(os.fsencode(address)) > MAX_SOCKET_PATH:
        raise ValueError(f"the worker's socket {address} is {len(os.fsencode(address))} bytes long, over the "
                         f"{MAX_SOCKET_PATH} a Unix socket's path may have: choose a shorter folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    except OSError as err:
        raise ValueError(f"cannot make the worker's folder {folder} ({err.strerror}): choose a folder you can write") from None

    key = secrets.token_bytes(32)
    # before the socket exists: a SIGTERM at any time after removes it (the samplers' import below
    # takes seconds, in which a launcher that saw the key may already stop the node)
    signal.signal(signal.SIGTERM, lambda *_: (address.unlink(missing_ok=True), os._exit(0)))
    address.unlink(missing_ok=True)
    # no authkey here: the challenge is run per connection, in its own thread, so a process that
    # connects and then stays silent holds up only that thread, never the next ClientApp
    with Listener(str(address), "AF_UNIX") as listener:
        _write_private(folder / KEY, key)  # after the socket exists: a ClientApp that reads the key can connect
        replies.lib()  # JAX and the samplers, while the first ClientApp process connects
        last, busy = [time.monotonic()], threading.Lock()

        def watch():  # exit when idle; never in the middle of an answer
            while True:
                time.sleep(min(idle, 30.0))
                with busy:
                    if time.monotonic() - last[0] > idle:
                        log.info("node worker %s: idle for %.0f s, exiting", folder, idle)
                        address.unlink(missing_ok=True)
                        os._exit(0)

        def handle(conn):  # one connection: the key proved both ways, one request, its answer
            with conn:
                try:
                    _limit(conn, HANDSHAKE_TIMEOUT)  # a silent or stopped ClientApp frees this thread
                    deliver_challenge(conn, key)
                    answer_challenge(conn, key)
                    request = conn.recv()
                except (OSError, EOFError, AuthenticationError) as err:  # a wrong key, or a dropped client
                    log.warning("node worker %s: refused or lost a connection: %s", folder, _why(err))
                    return
                with busy:  # one answer at a time
                    try:
                        try:
                            conn.send(("ok", *replies.answer(*request)))
                        except Exception as err:  # noqa: BLE001 -- the ClientApp raises it as its own error
                            conn.send(("error", f"{type(err).__name__}: {err}"))
                    except (OSError, EOFError) as err:  # the ClientApp process went away
                        log.warning("node worker %s: lost a ClientApp process: %s", folder, err)
                    last[0] = time.monotonic()

        threading.Thread(target=watch, daemon=True).start()
        while True:
            try:
                conn = listener.accept()
            except OSError as err:
                log.warning("node worker %s: accept failed: %s", folder, err)
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()


def ask(folder, request: tuple) -> tuple[dict, dict]:
    """``(reply, store)`` of :func:`fedmcmc.app.flower.replies.answer` for ``request``
    (``(m, text, index, node, store)``), from the worker in ``folder`` or, if none answers
    there, from this process."""
    m, text = request[:2]
    folder = Path(folder)
    try:
        conn = _connect(folder / SOCKET, (folder / KEY).read_bytes(), HANDSHAKE_TIMEOUT)
    except (OSError, EOFError, AuthenticationError) as err:
        log.warning("no fedmcmc node worker in %s (%s); answering in this process (start one with "
                    "`fedmcmc node-worker %s`)", folder, _why(err), folder)
        return replies.answer(*request)
    timeout = FlowerSettings.from_section(tomllib.loads(text).get("flower")).round_timeout  # the server waits no longer
    with conn:
        conn.send(request)
        if not conn.poll(timeout):
            raise TimeoutError(f"the node worker in {folder} gave no answer to a {m['kind']} message in {timeout:.0f} s")
        status, *answer = conn.recv()
    if status != "ok":
        raise RuntimeError(f"node worker in {folder}: {answer[0]}")
    return answer[0], answer[1]


def _connect(address: Path, key: bytes, timeout: float) -> Connection:
    """A connection to the worker listening at ``address``, both sides' knowledge of ``key``
    proved (:mod:`multiprocessing.connection`'s challenge). Connecting, and every later read or
    write on the connection, fails with an ``OSError`` after ``timeout`` seconds without
    progress (the socket's ``SO_RCVTIMEO`` and ``SO_SNDTIMEO``), so a worker that stops answering
    never holds the ClientApp process; waiting for an answer is :meth:`Connection.poll`'s."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(address))
        sock.setblocking(True)  # a Connection reads a blocking descriptor; the kernel keeps the limits
        conn = Connection(sock.detach())
    try:
        _limit(conn, timeout)
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    except BaseException:
        conn.close()
        raise
    return conn


def _limit(conn: Connection, timeout: float) -> None:
    """Every later read or write on ``conn`` (a socket) fails with an ``OSError`` after ``timeout``
    seconds without progress: the socket's ``SO_RCVTIMEO`` and ``SO_SNDTIMEO``."""
    limit = struct.pack("ll", int(timeout), int(timeout % 1 * 1e6))  # struct timeval
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # the same socket; closing the copy keeps it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)


def _why(err: BaseException):
    """``err``, or what it means if it is one of :func:`_limit`'s time limits."""
    if isinstance(err, (TimeoutError, BlockingIOError)):
        return f"no progress in {HANDSHAKE_TIMEOUT:g} s: the other side is stopped or stuck"
    return err


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by this user only, replacing it in one step."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
