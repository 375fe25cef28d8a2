"""The gateway process: runs a platform's channels under one Runtime, takes what they receive to the
writer, delivers what the outbox holds for them, and shows a typing sign while agents work.

Inbound is the kit's, once for every platform (``take``): the channel's parser makes the event a message
(or a Skip), then, one at a time per chat (services/gateway/order.py), the access check, the downloads
of its files (``Channel.download``, only for a sender who passed it) and the hand-off to the writer
(``submit``). The channel acknowledges the event to its platform only once ``take`` returned. ``submit``
holds while the writer's condition lasts (a full disk, an I/O error, a busy or restarting writer:
common/holding.py), however long. An event refused for itself (it fails validation), or failing for a
reason of its own SUBMIT_TRIES times, is kept whole as a dead letter (services/gateway/dead_letters.py)
and passed over. A platform whose retries end sooner than a writer outage may last (``Channel.spools``:
Slack) acknowledges once the event is in the process's spool (services/gateway/spool.py), replayed
through ``take`` at the next start before anything new is received.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from common import chat_commands, db, holding, service_args
from common.errors import StarlingError
from common.held_files import SPOOL_SUFFIX, SpoolEntry
from common.programs import serving
from common.runtime import Runtime
from common.service import Service, boot
from schema import messages as m
from services.gateway import attachments
from services.gateway.access import Access, Verdict
from services.gateway.channel import Channel, FileRef, InboundMessage, Skip
from services.gateway.dead_letters import DeadLetters
from services.gateway.delivery import Deliverer
from services.gateway.drafts import Drafts
from services.gateway.order import ChatOrder
from services.gateway.spool import Spool
from services.gateway.typing_sign import Typing
from services.gateway.webhook import WebhookServers

MAX_TEXT = 32_000  # characters of one inbound message kept (platforms cap lower; a forged event may not)
START_RETRY_S = (2.0, 60.0)  # a channel that cannot start retries with this backoff (first, max)
SUBMIT_TRIES = 5  # an event failing for a reason of its own (not the writer's condition): then a dead letter

MakeChannel = type[Channel]  # a platform's Channel class, made once per configured instance


class Gateway:
    def __init__(self, rt: Runtime, platform: str, instances: list, make_channel: MakeChannel) -> None:
        self.rt = rt
        self.svc = rt.svc
        self.paths = rt.svc.paths
        self.platform = platform
        self.log = rt.log.bind(platform=platform)
        # <name>@<host>/<boot>, unique to the process: a restart under the name takes back the rows its gone
        # predecessor held at once (Runtime.enlist); a live twin under the name is refused
        self.worker = rt.identity.worker
        self.reader = None
        self.webhooks = WebhookServers(self.log)
        self.channels: dict[str, Channel] = {cfg.id: make_channel(self, cfg) for cfg in instances}
        self.access = {cfg.id: Access(cfg.id, [make_channel.normalize_id(a) for a in cfg.allow], lambda: self.reader,
                                      make_channel.senders_in_groups) for cfg in instances}
        self.lines = {cid: ChatOrder(channel.reorder) for cid, channel in self.channels.items()}
        self.typing = Typing(self)
        self.deliverer = Deliverer(self)
        self.drafts = Drafts(self)  # streamed answers shown while the model writes (streaming = "draft")
        self.dead_letters = DeadLetters(self)
        self.spool: Spool | None = None
        if make_channel.spools:  # one per process: data/spool/<process name>.spool
            self.spool = Spool(self.paths.spool_dir / f"{rt.svc.name}{SPOOL_SUFFIX}", self.log)
            self.spool.on_failure = self._spooled_failed
        rt.describe = self.detail  # each heartbeat carries every channel's current state to `starling status`

    async def call(self, op: m.WriteOp, key: str | None = None):
        return await self.rt.client.call(op, key=key)

    def reload_allow(self, cfg) -> None:
        """`starling reload` (SIGHUP): each served instance's ``allow`` list as config.toml says now."""
        for gw in getattr(cfg.gateways, self.platform):
            if gw.id in self.access:
                normalize = type(self.channels[gw.id]).normalize_id
                self.access[gw.id].allow = frozenset(normalize(a) for a in gw.allow)

    # ------------------------------------------------------------ life

    async def run(self, _rt: Runtime) -> None:
        self.reader = await asyncio.to_thread(db.wait_for_schema, self.paths.db_file, 120.0, stop=self.svc.stopping)
        if self.spool is not None:
            self.spool.open()
            unknown = self.spool.pending_instances() - set(self.channels)
            if unknown:
                self.log.error("spool_unknown_instances", instances=sorted(unknown), path=str(self.spool.path),
                               note="kept in the spool until an instance of that id is served by this process again")
        moving = asyncio.create_task(self.dead_letters.move_file_into_table())
        for channel in self.channels.values():
            channel.register_webhooks()
        await self.webhooks.start()
        try:
            await asyncio.gather(*(self._start(c, first=True) for c in self.channels.values()))
            await self.rt.announce_ready("ready", self.detail())
            tasks = [asyncio.create_task(self.deliverer.run()), asyncio.create_task(self.drafts.run())]
            tasks += [asyncio.create_task(self._serve(c)) for c in self.channels.values()]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self.deliverer.release_all()
        finally:
            moving.cancel()
            self.typing.close()
            self.drafts.close()
            await self.webhooks.close()
            if self.spool is not None:
                await self.spool.close()
            for channel in self.channels.values():
                try:
                    await channel.close()
                except Exception as exc:  # closing is best effort
                    channel.log.warning("close_failed", error=str(exc))

    async def _start(self, channel: Channel, first: bool = False) -> bool:
        try:
            await channel.start()
            channel.started = True
            return True
        except StarlingError as exc:
            channel.status = f"error: {exc}"
            channel.log.error("channel_start_failed", error=str(exc))
            if not first:
                await self.rt.beat(detail=self.detail())
            return False

    async def _serve(self, channel: Channel) -> None:
        """Start (again, with backoff, while it fails: a rejected token, a secret not set yet) and receive."""
        delay = START_RETRY_S[0]
        while not channel.started:
            await asyncio.sleep(delay)
            delay = min(delay * 2, START_RETRY_S[1])
            if await self._start(channel):
                await self.rt.beat(detail=self.detail())
        if self.spool is not None:  # what a predecessor acknowledged and the writer had not stored: first
            replayed = self.spool.replay(channel.id, lambda event: lambda: self.take(channel, event))
            if replayed:
                channel.log.info("spool_replayed", events=replayed)
        await channel.receive()

    def detail(self) -> str:
        text = "; ".join(f"{c.id}: {c.status}" for c in self.channels.values())
        if self.spool is not None and self.spool.spooled:
            events, size = self.spool.stats()
            text += f"; spool: {events} events not yet stored ({size / 1024:.0f} KB)"
        return text

    async def _spooled_failed(self, entry: SpoolEntry, exc: BaseException) -> None:
        await self.dead_letters.keep(self.channels[entry.instance], entry.key, entry.event,
                                     f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ inbound

    async def take(self, channel: Channel, event: object) -> str:
        """One platform event, the whole inbound path: what became of it (skipped, accepted, duplicate,
        pairing, ignored, not_addressed, answered, dead_letter) once it is stored; only then may the
        channel acknowledge it. A chat's messages go one at a time, in order (``Channel.reorder``)."""
        parsed = channel.parse(event)
        if isinstance(parsed, Skip):
            channel.log.info(f"{channel.event_name}_skipped", reason=parsed.reason)
            return "skipped"
        msg = parsed.msg
        async with self.lines[channel.id].turn(msg.chat, msg.sent_at):
            msg.addressed = channel.addressed(msg)  # judged once the chat's earlier messages are stored
            outcome = await self.submit(channel, msg, parsed.files, raw=event)
        if outcome == "accepted":
            channel.stored(msg)
        return outcome

    async def submit(self, channel: Channel, msg: InboundMessage, files: list[FileRef] | tuple = (),
                     raw: object = None) -> str:
        """Hand one received message to the writer; return what became of it (accepted, duplicate,
        pairing, ignored, not_addressed, answered, dead_letter) once the writer stored it. While the
        writer's condition lasts this holds, with backoff, however long (cancel it to give up: the event
        is then not acknowledged). ``files`` are downloaded only for a sender who passed the access check.
        ``raw``: the event as the platform sent it, kept whole should it be passed over (refused for
        itself, or failing for a reason of its own SUBMIT_TRIES times)."""
        log = channel.log.bind(chat=msg.chat, platform_msg_id=msg.platform_msg_id)
        backoff = holding.Backoff()
        held = failures = 0
        while True:
            attempt = dataclasses.replace(msg, attachments=list(msg.attachments))
            try:
                outcome = await self._submit_once(channel, attempt, files, log)
            except Exception as exc:
                error = str(exc) or type(exc).__name__
                if holding.condition(exc):  # the writer's, not the event's: never passed over
                    held += 1
                    delay = backoff.next()
                    if held == 1 or held % holding.LOG_EVERY == 0:
                        log.warning("inbound_held", error=error, tries=held, retry_in_s=delay)
                    await asyncio.sleep(delay)
                    continue
                failures += 1
                if not holding.refusal(exc) and failures < SUBMIT_TRIES:
                    log.warning("inbound_failed", error=error, kind=type(exc).__name__, attempt=failures)
                    await asyncio.sleep(backoff.next())
                    continue
                try:
                    await self.dead_letters.keep(channel, (msg.dedupe_keys or [""])[0], raw if raw is not None else
                                                 dataclasses.asdict(msg), f"{type(exc).__name__}: {error}")
                except OSError:  # neither the writer nor the file can keep it: held like the writer's condition
                    await asyncio.sleep(backoff.next())
                    continue
                return "dead_letter"
            if held:
                log.info("inbound_stored_after_hold", tries=held)
            return outcome

    async def _submit_once(self, channel: Channel, msg: InboundMessage, files, log) -> str:
        key = msg.dedupe_keys[0]
        verdict = self.access[channel.id].verdict(msg.sender, msg.room or msg.chat, msg.private)
        if verdict is Verdict.IGNORE:
            log.info("inbound_ignored", reason="group not allowed", sender=msg.sender)
            return "ignored"
        if verdict is Verdict.PAIR:
            answer = await self.call(m.RequestPairing(instance=channel.id, sender=msg.sender, chat=msg.chat,
                                                      sender_name=msg.sender_name), key=f"{key}:pair")
            notice = self.access[channel.id].notice(answer, msg.sender)
            log.info("inbound_stranger", sender=msg.sender, pairing=answer.status, notified=notice is not None)
            if notice:
                await self.reply(channel, msg.chat, notice, key=f"{key}:pair-notice")
            return "pairing"
        if not msg.private and not msg.addressed and channel.cfg.groups == "mention":
            log.info("inbound_not_addressed", sender=msg.sender)
            return "not_addressed"
        if msg.command == chat_commands.START:
            await self.reply(channel, msg.chat, f"Hi! I'm {channel.agent}. Write to me to talk; /help lists the"
                             " commands.", key=f"{key}:start")
            return "answered"
        if files:
            into = attachments.Into(self.paths.attachments_dir, channel.agent, channel.id,
                                    int(channel.cfg.max_attachment_mb * 1024 * 1024), msg.sent_at or time.time())
            await attachments.attach_all(msg, list(files), channel.download, into, log, channel.fetch_budget_s())
        text = msg.text if len(msg.text) <= MAX_TEXT else msg.text[:MAX_TEXT] + "\n[message cut: too long]"
        accepted: m.Accepted = await self.call(m.Inbound(
            agent=channel.agent, instance=channel.id, chat=msg.chat, sender=msg.sender, sender_name=msg.sender_name,
            text=text, dedupe_keys=msg.dedupe_keys, platform_msg_id=msg.platform_msg_id, reply_to=msg.reply_to,
            attachments=msg.attachments, thread=msg.thread, chat_kind=msg.chat_kind, edit_of=msg.edit_of,
            sent_at=msg.sent_at), key=key)
        log.info("inbound", turn_id=accepted.turn_id, session_id=accepted.session_id, duplicate=accepted.duplicate)
        if accepted.duplicate:
            return "duplicate"
        self.typing.watch(channel, msg.chat, accepted.turn_id, msg.platform_msg_id)
        return "accepted"

    async def reply(self, channel: Channel, chat: str, text: str, key: str) -> None:
        """A message from the gateway itself (a pairing code, a welcome), through the outbox like any other."""
        await self.call(m.EnqueueOutbox(instance=channel.id, chat=chat, replies=[m.Reply(text=text)]), key=key)


def _options(platform: str):
    def add(parser: service_args.Options) -> None:
        parser.add_argument("--instance", action="append", default=[], metavar="ID",
                            help=f"serve this [[gateways.{platform}]] id (repeatable), whatever its process")
        parser.add_argument("--process", metavar="NAME",
                            help=f"serve the instances with process = \"NAME\" (default: the NAME in a process name"
                                 f" gateway-{platform}-NAME, else the instances without a process)")
    return add


def main(platform: str, make_channel: MakeChannel, argv: list[str] | None = None) -> int:
    """`python -m services.gateway.<platform> [--instance ID ... | --process NAME]`: serve the platform's
    instances that have no ``process`` (the platform's program), those with ``process = "NAME"`` (a
    process of their own, gateway-<platform>-NAME), or only the named ones."""
    svc: Service = boot(f"gateway-{platform}", argv, description=f"Starling's {platform} gateway",
                        add_arguments=_options(platform))
    ours = svc.args
    configured = getattr(svc.cfg.gateways, platform)
    unknown = sorted(set(ours.instance) - {gw.id for gw in configured})
    if unknown:
        svc.log.error("startup_failed", error=f"--instance {', '.join(unknown)}: no such [[gateways.{platform}]] id"
                      f" in {svc.paths.home / 'config.toml'}")
        return 1
    process = ours.process
    if process is None:
        process = svc.name.removeprefix(f"gateway-{platform}-") if svc.name.startswith(f"gateway-{platform}-") else ""
    if ours.instance:
        instances = [gw for gw in configured if gw.id in ours.instance]
    else:
        instances = serving(svc.cfg, platform, process)
    if not instances:
        svc.log.info("nothing_configured", platform=platform, process=process,
                     hint=f"add a [[gateways.{platform}]] table" + (f" with process = \"{process}\"" if process else ""))
        return 0

    def work(rt: Runtime):
        gateway = Gateway(rt, platform, instances, make_channel)
        rt.reload_hooks.append(gateway.reload_allow)
        return gateway.run(rt)

    return asyncio.run(Runtime(svc).run(work, announces_ready=True))
