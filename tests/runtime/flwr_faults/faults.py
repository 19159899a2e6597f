"""Faults injected into fedmcmc's ClientApp, for the tests only: the ClientApp of this test app
(``pyproject.toml`` beside this file) is fedmcmc's, wrapped in :func:`fault_mod`.

A node config ``fault="KIND@ROUND[,ROUND...]"`` makes that node misbehave in those rounds:
``fail`` raises before answering (the SuperNode sends an error reply), ``malformed`` replaces the
first upload of its reply with undecodable bytes."""

from __future__ import annotations

from flwr.app import Context, Message

from fedmcmc.app.flower.apps import make_client_app
from fedmcmc.app.flower.content import from_content, to_content


def faults(node_config) -> dict[int, str]:
    """The rounds of the node config's ``fault`` and the fault of each (none without one)."""
    spec = str(node_config.get("fault", ""))
    if "@" not in spec:
        return {}
    kind, _, rounds = spec.partition("@")
    return {int(k): kind for k in rounds.split(",")}


def fault_mod(msg: Message, context: Context, call_next) -> Message:
    """A Flower mod making the node fail, or garble its upload, in the rounds of its ``fault``."""
    m = from_content(msg.content)
    fault = faults(context.node_config).get(m.get("k")) if m["kind"] == "round" else None
    if fault == "fail":
        index = int(context.node_config.get("partition-id", -1))
        raise RuntimeError(f"client {index}: injected failure in round {m['k']}")
    reply = call_next(msg, context)
    if fault != "malformed" or reply.has_error():
        return reply
    content = from_content(reply.content)
    for name in content:  # undecodable bytes in place of the first upload
        if name.startswith("blob/"):
            content[name] = b"\xff\x00garbage"
            break
    return Message(to_content(content), reply_to=msg)


client_app = make_client_app([fault_mod])
