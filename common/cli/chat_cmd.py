"""`starling chat`: talk to an agent from the terminal, through the bus exactly like a gateway (instance "cli").

Interactive, on a terminal (prompt_toolkit): line editing and a history (data/chat-history, 0600); Enter
sends, Alt-Enter or a trailing backslash starts a new line, and a bracketed paste is inserted whole, so a
pasted paragraph is one message. Everything the outbox holds for this chat (answers, approval requests,
answers to an approval decided elsewhere, cron messages to `cli:<chat>`) is printed as it arrives, above
the prompt, while idle too. Ctrl-C while waiting for an answer stops waiting (the answer still shows up
when it comes) and Ctrl-C at the prompt clears the line; Ctrl-D leaves. `/approve ID` and `/deny ID` go to
the agent as on the platforms, and the turn they resume is waited for too.

`chat -m TEXT` sends one message, prints what comes back and exits: 0 when the agent's turn ended well
(or waits for an approval), 1 when it failed (no API key, the model refused, ...) or no answer came.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import signal
import sys
import time
import uuid

from common import bus, chat_commands, db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError
from common.home import write_private_file
from common.secrets import session_secret
from common.stores import approval_store, turn_store
from schema import messages as m

INSTANCE = "cli"
DONE_STATES = ("done", "failed", "waiting")
HISTORY_FILE = "chat-history"
HISTORY_MAX_BYTES = 1024 * 1024
POLL_S = 0.1
HELP = """\
Enter sends; Alt-Enter, or a line ending in \\, starts a new line; a paste is one message.
Ctrl-C stops waiting for an answer (it still shows up when it comes), Ctrl-D leaves.
/approve ID [always], /deny ID: decide what the agent asked; /new: a fresh conversation; /status."""


def register(verbs) -> None:
    chat = verbs.add_parser("chat", help="talk to an agent from the terminal (through the bus, like a gateway)")
    chat.add_argument("--agent", default="default", help="the agent to talk to (default: default)")
    chat.add_argument("--chat", default="", help="conversation name (default: your user name)")
    chat.add_argument("-m", "--message", help="send one message, print the answer, exit (1 if the turn failed)")
    chat.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for an answer (default 180)")
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    chat_id = args.chat or getpass.getuser()
    return asyncio.run(Chat(ctx, args.agent, chat_id, args.timeout).run(args.message))


def trim_history(path, max_bytes: int = HISTORY_MAX_BYTES) -> None:
    """Keep the newest half of a history grown past ``max_bytes``, cut at an entry's start (prompt_toolkit's
    FileHistory appends forever and reads it all at every start)."""
    data = path.read_bytes()
    if len(data) <= max_bytes:
        return
    cut = data.find(b"\n\n# ", len(data) - max_bytes // 2)
    if cut < 0:
        return
    write_private_file(path, data[cut + 2:])


class Chat:
    def __init__(self, ctx: Context, agent: str, chat: str, timeout: float) -> None:
        self.ctx = ctx
        self.agent = agent
        self.chat = chat
        self.timeout = timeout
        self.worker = f"cli:{uuid.uuid4().hex[:8]}"
        self.sender = getpass.getuser()
        self._delivering = asyncio.Lock()

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
                    return await self.one(one_message)
                if sys.stdin.isatty() and sys.stdout.isatty():
                    return await self.interactive()
                return await self.lines()
            finally:
                self.events.close()
                self.reader.close()

    # ------------------------------------------------------------ the three ways in

    async def one(self, text: str) -> int:
        """`chat -m`: one message; its turn's outcome is the exit code."""
        watched = await self.send(text)
        ended = await self.wait(watched, text, deliver=True)
        await self.deliver()
        if not ended:
            self.no_answer()
            return 1
        return 1 if any(self.state(t) == "failed" for t in watched) else 0

    async def lines(self) -> int:
        """Not a terminal (a pipe, a file): each line of stdin is a message, answered before the next."""
        while line := await asyncio.to_thread(sys.stdin.readline):
            if line.strip():
                text = line.rstrip("\n")
                if not await self.wait(await self.send(text), text, deliver=True):
                    self.no_answer()
        await self.deliver()
        return 0

    async def interactive(self) -> int:
        from prompt_toolkit.patch_stdout import patch_stdout

        session = self._prompt_session()
        print(output.paint(f"Talking to {self.agent} as {self.sender} (conversation {self.chat!r}). "
                           "/help for help, Ctrl-D to leave.", "dim"))
        with patch_stdout(raw=True):  # what arrives while the prompt is shown is printed above it
            listener = asyncio.create_task(self.listen())
            try:
                while True:
                    try:
                        text = await session.prompt_async("you> ")
                    except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, not an exit
                        continue
                    except EOFError:
                        return 0
                    if text.strip() == "/help":
                        print(HELP)
                    elif text.strip():
                        try:
                            await self.wait_interruptibly(text)
                        except StarlingError as exc:  # the writer down or restarting: the chat goes on
                            output.error(f"{exc}; the message may not have been sent")
            finally:
                listener.cancel()

    def _prompt_session(self):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.key_binding import KeyBindings

        history = self.ctx.paths.data_dir / HISTORY_FILE
        os.close(os.open(history, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.chmod(history, 0o600)  # what a person typed to their agent is theirs alone
        trim_history(history)
        keys = KeyBindings()

        @keys.add("enter")
        def _enter(event) -> None:
            buffer = event.current_buffer
            if buffer.document.is_cursor_at_the_end and buffer.text.endswith("\\"):
                buffer.delete_before_cursor(1)
                buffer.insert_text("\n")
            else:
                buffer.validate_and_handle()

        @keys.add("escape", "enter")
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        return PromptSession(history=FileHistory(str(history)), key_bindings=keys, multiline=True,
                             prompt_continuation=lambda width, line, wrap: "... ".rjust(width),
                             enable_open_in_editor=False)

    # ------------------------------------------------------------ sending and waiting

    async def send(self, text: str) -> list[int]:
        """The message as an inbound write; the turns to wait for (an /approve also resumes a parked one)."""
        accepted = await self.client.call(m.Inbound(
            agent=self.agent, instance=INSTANCE, chat=self.chat, sender=self.sender, sender_name=self.sender,
            text=text, dedupe_keys=[f"cli:{uuid.uuid4().hex}"]))
        return [accepted.turn_id]

    async def wait(self, watched: list[int], text: str, deliver: bool = False) -> bool:
        """Until every watched turn is over (and the turn an /approve resumes); False after the timeout."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if deliver:
                await self.deliver()
            if all(self.state(t) in DONE_STATES for t in watched):
                resumed = self.resumed_turn(text, watched)
                if resumed is None:
                    return True
                watched.append(resumed)
                continue
            if deliver:
                await self.events.drain(0.5)
            else:
                await asyncio.sleep(POLL_S)
        return False

    async def wait_interruptibly(self, text: str) -> None:
        """Send, and wait for the answer; Ctrl-C (SIGINT: no prompt reads the keys meanwhile) stops waiting."""
        async def send_and_wait() -> bool:
            return await self.wait(await self.send(text), text)

        waiting = asyncio.create_task(send_and_wait())
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, waiting.cancel)
        try:
            ended = await waiting
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            print(output.paint("(stopped waiting; the answer shows up here when it comes)", "dim"))
            return
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        await self.deliver()  # the answer before the next prompt, not just after it
        if not ended:
            self.no_answer()

    async def listen(self) -> None:
        """Print this chat's outbox rows whenever they come: a hint on the bus, or every few seconds."""
        while True:
            try:
                await self.deliver()
            except StarlingError as exc:  # the writer restarting: say so once a round, keep listening
                output.warn(f"cannot fetch messages: {exc}")
                await asyncio.sleep(2)
            await self.events.drain(2.0)

    async def deliver(self) -> int:
        """Claim this chat's outbox rows, print them, and mark them sent: what a gateway does."""
        async with self._delivering:
            claim = await self.client.call(m.ClaimOutbox(worker=self.worker, instances=[INSTANCE], chats=[self.chat],
                                                         limit=16, lease_s=30))
            for item in claim.items:
                body = item.body if item.kind == "text" else f"[file] {item.file_path}" + (f" {item.body}" if item.body else "")
                print(output.paint(f"{self.agent}> ", "green") + body, flush=True)
                await self.client.call(m.OutboxSent(id=item.id, worker=self.worker))
            return len(claim.items)

    def no_answer(self) -> None:
        print(output.paint(f"No answer within {self.timeout:.0f}s. Are runners running? See `starling status`"
                           " and `starling logs runner`.", "yellow"), file=sys.stderr)

    def resumed_turn(self, text: str, watched: list[int]) -> int | None:
        """The parked turn an /approve or /deny just decided, when it is not watched yet."""
        decided = chat_commands.decision(text)
        if decided is None:
            return None
        with db.read_tx(self.reader):
            approval = approval_store.get(self.reader, decided[1])
        if approval is None or approval.state == "pending" or not approval.turn_id or approval.turn_id in watched:
            return None
        return approval.turn_id

    def state(self, turn_id: int) -> str | None:
        with db.read_tx(self.reader):
            turn = turn_store.get(self.reader, turn_id)
        return turn.state if turn is not None else None
