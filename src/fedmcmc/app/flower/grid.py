"""The ServerApp's side of the wire: client indices to SuperNodes over a Flower ``Grid``
(:class:`GridTransport`, the transport of :class:`~fedmcmc.runtime.messaging.server.ServerRuntime`)."""

from __future__ import annotations

import time

from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from fedmcmc.app.flower.content import HOLD, from_content, log, message_type, to_content
from fedmcmc.runtime.settings import FlowerSettings


def _index(hello) -> int:
    return int(hello["index"]) if isinstance(hello, dict) else -1


class GridTransport:
    """Client indices to SuperNodes over a Flower ``Grid``.

    Before round 1 every node answers a ``hello`` (its ``partition-id``, client count and data
    shapes; kept in ``hellos``); a node that fails, a partition claimed twice or missing, another
    client count, or data shapes unlike the other nodes' stop the run with a message naming the
    SuperNode. Before each round, a SuperNode that joined since (a restarted node has a new node
    id) is greeted the same way, sent ``welcome`` if set (a ``[data]`` run's inputs), and takes
    over its partition: it rejoins the run from its own saved state. ``flower`` is the run's typed
    ``[flower]`` (its ``round_timeout``, ``poll_interval`` and ``hold``)."""

    def __init__(self, grid: Grid, num_clients: int, flower: FlowerSettings, wait: float = 300.0):
        self.grid, self.b, self.flower, self.shapes, self.refused = grid, num_clients, flower, None, set()
        self.welcome: dict | None = None
        self.holds: set[str] = set()  # ids of our ``hold`` messages not yet answered
        self.process: list[float] = []  # the clients' process seconds at their replies to rounds
        self.sizes: list[tuple[int, int]] = []  # array bytes of each round message and of its reply
        self.poll, self.hold = flower.poll_interval, flower.hold
        deadline = time.monotonic() + wait
        while len(ids := list(grid.get_node_ids())) < self.b:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids)} SuperNode(s) connected after {wait:.0f} s, the config has "
                                   f"{self.b} clients; start one SuperNode per client")
            time.sleep(0.2)
        self.node: dict[int, int] = {}
        self.hellos: dict[int, dict] = {}

        def every_partition(replies):  # Flower lists a dead node for up to a minute: do not wait for it
            answered = {int(from_content(r.content)["index"]) for r in replies if not r.has_error()}
            return answered >= set(range(self.b))

        for n, h in sorted(self._hello(ids, every_partition), key=lambda r: (isinstance(r[1], dict), _index(r[1]))):
            if isinstance(h, str):
                raise RuntimeError(h)
            i = self._check(n, h)
            if i in self.node:
                raise RuntimeError(f"two SuperNodes claim partition-id {i}; give each node its own partition-id")
            self.node[i], self.hellos[i] = n, h
        missing = sorted(set(range(self.b)) - set(self.node))
        if missing:
            raise RuntimeError(f"no SuperNode answered for client(s) {missing}")
        self.index = {n: i for i, n in self.node.items()}

    def _hello(self, nodes, enough=None) -> list[tuple[int, dict | str]]:
        """(node id, hello reply, or why the node failed) for each node that answered (all of
        them, or until ``enough(replies)``)."""
        return self._send(nodes, {"kind": "hello"}, enough)

    def _send(self, nodes, message: dict, enough=None) -> list[tuple[int, dict | str]]:
        sent = [Message(to_content(message), dst_node_id=int(n), message_type=MessageType.QUERY) for n in nodes]
        return [(int(r.metadata.src_node_id),
                 f"SuperNode {r.metadata.src_node_id} failed to start its client: {r.error.reason}"
                 if r.has_error() else from_content(r.content))
                for r in self.send_and_receive(sent, self.flower.round_timeout, enough)]

    def _check(self, n: int, h: dict) -> int:
        """The partition of node ``n`` from its hello ``h``, checked against the run and the other nodes."""
        i, name = int(h["index"]), f"SuperNode {n} (partition-id {h['index']})"
        if int(h["num_clients"]) != self.b:
            raise RuntimeError(f"{name} has {h['num_clients']} clients in its run config, the server "
                               f"{self.b}; every node needs the run's config")
        self.shapes = self.shapes or (name, h["shapes"])
        if h["shapes"] != self.shapes[1]:
            raise RuntimeError(f"{name} holds data of shapes {h['shapes']} per point, {self.shapes[0]} "
                               f"{self.shapes[1]}; every node's data needs the same features")
        return i

    def _rejoin(self) -> None:
        """Greet SuperNodes that joined since the last round; each takes over its partition."""
        new = set(map(int, self.grid.get_node_ids())) - set(self.index) - self.refused
        if not new:
            return
        self.refused |= new  # greeted once: a node that does not answer is not asked again
        for n, h in self._hello(sorted(new)):
            try:
                if isinstance(h, str):
                    raise RuntimeError(h)
                i = self._check(n, h)
                if self.welcome is not None:
                    welcomed = self._send([n], self.welcome)
                    if not welcomed or isinstance(welcomed[0][1], str):
                        raise RuntimeError(f"SuperNode {n} did not take the run's inputs")
            except RuntimeError as err:
                log.warning("ignoring a new SuperNode: %s", err)
                continue
            self.index.pop(self.node.get(i), None)
            self.node[i], self.index[n] = n, i
            log.warning("SuperNode %d joined as partition-id %d; it continues from its saved state", n, i)

    def send_and_receive(self, messages: list[Message], timeout: float | None, enough=None,
                         hold: bool = False) -> list[Message]:
        """Flower's ``Grid.send_and_receive`` with our poll interval: push, then pull every
        ``poll_interval`` seconds (Flower's own checks every 3 s) until every reply is in,
        ``enough(replies)``, or ``timeout`` seconds have passed (the missing clients are then inactive).
        With ``hold``, a ``hold`` message follows each message to its node (its reply is dropped)."""
        pending = set(self.grid.push_messages(messages))
        if hold:
            self.holds.update(self.grid.push_messages([
                Message(to_content({"kind": HOLD}), dst_node_id=m.metadata.dst_node_id, message_type=MessageType.QUERY)
                for m in messages]))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(pending | self.holds))
            self.holds.difference_update(r.metadata.reply_to_message_id for r in got)
            got = [r for r in got if r.metadata.reply_to_message_id in pending]
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if not pending or (enough and enough(replies)) or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll if deadline is None else max(0.0, min(self.poll, deadline - time.monotonic())))
        return replies

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]:
        if any(m["kind"] == "round" for m in messages.values()):
            self._rejoin()
        out: dict[int, dict | None] = {i: None for i in messages}
        sent = [Message(to_content(m), dst_node_id=self.node[i], message_type=message_type(m["kind"]))
                for i, m in messages.items()]
        replies = self.send_and_receive(sent, timeout, hold=self.hold)
        by_id = {m.metadata.message_id: m for m in sent}  # ids are given when pushed
        for r in replies:
            i = self.index.get(int(r.metadata.src_node_id))
            if i is None or i not in messages:
                continue
            if r.has_error():
                log.warning("client %d replied with an error: %s", i, r.error.reason)
                continue
            try:
                out[i] = from_content(r.content)
                if messages[i]["kind"] == "round":
                    self._note(by_id.get(r.metadata.reply_to_message_id), r, out[i])
            except Exception as err:  # noqa: BLE001 - malformed reply: client inactive
                log.warning("client %d sent an unreadable reply: %s", i, err)
        return out

    def _note(self, sent: Message | None, reply: Message, content: dict) -> None:
        """Record a round reply's process seconds and the array bytes of the message and reply."""
        if content.get("process_seconds") is not None:
            self.process.append(float(content["process_seconds"]))
        if sent is not None:
            self.sizes.append((array_bytes(sent), array_bytes(reply)))


def array_bytes(message: Message) -> int:
    """Bytes of the arrays a message carries."""
    return sum(r.count_bytes() for r in message.content.array_records.values())
