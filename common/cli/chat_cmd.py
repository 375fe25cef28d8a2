"""`starling chat`: talk to an agent from the terminal, through the bus exactly like a gateway (instance "cli")."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
import uuid

from common import bus, db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError
from common.secrets import session_secret
from common.stores import approval_store, turn_store
from schema import messages as m

INSTANCE = "cli"
DONE_STATES = ("done", "failed", "waiting")


def register(verbs) -> None:
    chat = verbs.add_parser("chat", help="talk to an agent from the terminal (through the bus, like a gateway)")
    chat.add_argument("--agent", default="default", help="the agent to talk to (default: default)")
    chat.add_argument("--chat", default="", help="conversation name (default: your user name)")
    chat.add_argument("-m", "--message", help="send one message, print the answer, exit")
    chat.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for an answer (default 180)")
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    chat_id = args.chat or getpass.getuser()
    return asyncio.run(Chat(ctx, args.agent, chat_id, args.timeout).run(args.message))


class Chat:
    def __init__(self, ctx: Context, agent: str, chat: str, timeout: float) -> None:
        self.ctx = ctx
        self.agent = agent
        self.chat = chat
        self.timeout = timeout
        self.worker = f"cli:{uuid.uuid4().hex[:8]}"
        self.sender = getpass.getuser()

    async def run(self, one_message: str | None) -> int:
        key = bus.bus_key(session_secret(self.ctx.paths))
        endpoints = self.ctx.endpoints
        self.client = bus.WriterClient(endpoints.writer, key, name="chat", deadline_s=30)
        self.events = bus.EventSubscriber(endpoints.events, key, [m.topic_outbox(INSTANCE)])
        async with self.client:
            if not await self.client.ping(5):
                raise StarlingError("Starling is not running for this home: start it with `starling up`")
            self.reader = await asyncio.to_thread(db.wait_for_schema, self.ctx.paths.db_file, 10.0)
            self.events.start()
            try:
                if one_message is not None:
                    return await self.exchange(one_message)
                return await self.interactive()
            finally:
                self.events.close()

    async def interactive(self) -> int:
        print(output.paint(f"Talking to {self.agent} as {self.sender} (conversation {self.chat!r}). "
                           "/help for commands, Ctrl-D to leave.", "dim"))
        while True:
            try:
                line = await asyncio.to_thread(input, output.paint("you> ", "bold"))
            except EOFError:
                print()
                return 0
            if line.strip():
                await self.exchange(line)

    async def exchange(self, text: str) -> int:
        """Send one message and print what comes back until the agent's turn is over."""
        accepted = await self.client.call(m.Inbound(
            agent=self.agent, instance=INSTANCE, chat=self.chat, sender=self.sender, sender_name=self.sender,
            text=text, dedupe_keys=[f"cli:{uuid.uuid4().hex}"]))
        deadline = time.monotonic() + self.timeout
        watched = [accepted.turn_id]
        while time.monotonic() < deadline:
            await self.deliver()
            if all(self.turn_over(t) for t in watched):
                resumed = self.resumed_turn(text, watched)
                if resumed is not None:  # /approve ID: the agent's parked turn goes on; show its answer too
                    watched.append(resumed)
                    continue
                if await self.deliver() == 0:
                    return 0
            await self.events.drain(0.5)
        print(output.paint(f"No answer within {self.timeout:.0f}s. Are runners running? See `starling status`"
                           " and `starling logs runner`.", "yellow"), file=sys.stderr)
        return 1

    async def deliver(self) -> int:
        """Claim this chat's outbox rows, print them, and mark them sent: what a gateway does."""
        claim = await self.client.call(m.ClaimOutbox(worker=self.worker, instances=[INSTANCE], chats=[self.chat],
                                                     limit=16, lease_s=30))
        for item in claim.items:
            body = item.body if item.kind == "text" else f"[file] {item.file_path}" + (f" {item.body}" if item.body else "")
            print(output.paint(f"{self.agent}> ", "green") + body, flush=True)
            await self.client.call(m.OutboxSent(id=item.id, worker=self.worker))
        return len(claim.items)

    def resumed_turn(self, text: str, watched: list[int]) -> int | None:
        """The parked turn an /approve or /deny just decided, when it is not watched yet."""
        words = text.split()
        if len(words) < 2 or words[0] not in ("/approve", "/deny"):
            return None
        with db.read_tx(self.reader):
            approval = approval_store.get(self.reader, words[1].upper())
        if approval is None or approval.state == "pending" or not approval.turn_id or approval.turn_id in watched:
            return None
        return approval.turn_id

    def turn_over(self, turn_id: int) -> bool:
        with db.read_tx(self.reader):
            turn = turn_store.get(self.reader, turn_id)
        return turn is not None and turn.state in DONE_STATES
