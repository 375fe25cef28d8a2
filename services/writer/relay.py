"""Streaming drafts: the writer relays a runner's ShowDraft hint as an AnswerDraft event, with no commit and no ack.

A draft is the whole answer so far of one model step (schema/messages.py ``AnswerDraft``), so a lost one
loses nothing: the next draft, or the final outbox row, carries all of it. Hence none of the rule of
durability applies: nothing is stored, the sender is never answered (it never waits or resends), and the
topic (``draft/<instance>/``) keeps a sequence of its own, outside ``Writer.seqs``, so WriterBeat never
names it and a subscriber that loses a draft never re-reads its pending work.
"""

from __future__ import annotations

import zmq

from common import bus
from schema import messages as m

_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_NOBLOCK = int(zmq.NOBLOCK)


class Relay:
    """Publishes drafts on the writer's PUB socket (which never blocks: past a subscriber's HWM a draft is lost)."""

    def __init__(self, pub: zmq.Socket, signer: bus.Signer, epoch: str) -> None:
        self.pub = pub
        self.signer = signer
        self.epoch = epoch
        self.seqs: dict[str, int] = {}  # per draft topic: for a gateway that wants to drop a stale draft
        self.relayed = 0

    def show(self, op: m.ShowDraft) -> None:
        topic = m.topic_draft(op.instance)
        seq = self.seqs.get(topic, 0) + 1
        self.seqs[topic] = seq
        payload = bus.encode(m.AnswerDraft(
            epoch=self.epoch, seq=seq, instance=op.instance, chat=op.chat, thread=op.thread,
            session_id=op.session_id, turn_id=op.turn_id, step=op.step, text=op.text, done=op.done))
        raw_topic = topic.encode()
        try:
            self.pub.send(raw_topic, _SNDMORE_NOBLOCK)
            self.pub.send(self.signer.mac(payload, raw_topic), _SNDMORE_NOBLOCK)
            self.pub.send(payload, _NOBLOCK)
        except zmq.ZMQError:  # PUB drops rather than refuses; whatever else, a draft is never worth an error
            return
        self.relayed += 1
