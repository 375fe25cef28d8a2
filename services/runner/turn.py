"""One claimed turn, start to finish: a command, or the agent's loop of model calls and tools.

Everything the turn produces goes through the writer as it happens (assistant tool calls, tool
results, usage, audit), so a runner killed mid-turn loses nothing: the turn's lease runs out, another
runner takes it, reads what was done, and carries on. Only ``FinishTurn`` queues the answer, and the
writer accepts it from the lease holder alone, so the person gets one answer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import msgspec

from common import chat_commands
from common.db import read_tx
from common.errors import StarlingError, WriteRejected
from common.stores import approval_store, fold_store, session_store, turn_store
from schema import messages as m
from services.runner import commands, conversation, media, transcribe
from services.runner.drafts import Drafts
from services.runner.llm import Message, ModelReply, ProviderError, ToolCall, ToolSpec
from services.runner.persona import Persona
from services.runner.providers.pricing import cost_usd
from services.runner.tools import registry
from services.runner.tools.base import ToolContext, ToolResult

APPROVAL_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: typed by people
DELIVERY_WAIT_S = 1.0  # collect: the longest a turn waits for its session's previous reply to go out
NEWCOMER_POLL_S = 0.05  # how often a model call in interrupt mode looks for a new message of its session
KEEP_RECENT_SHARE = 0.4  # of the budget, kept verbatim when older turns are summarised
WENT_WRONG = "Something went wrong on my side while answering; the operator can see why in the runner's log."
SKILL_TOOL = ToolSpec(
    "skill_load", "Load the full instructions of one of your skills (listed in the system prompt) by name.",
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
)


class Parked(Exception):
    """The turn waits for a person's decision; it is no longer ours."""


class TurnWork:
    """What one turn needs: the claim, the writer, the database, the agent's persona and model."""

    def __init__(self, runner, claim: m.TurnClaim, log) -> None:
        self.runner = runner
        self.claim = claim
        self.log = log
        self.call = runner.call
        self.worker = runner.worker
        self.drafts: Drafts | None = None  # the answer shown while it is written ([[gateways.*]] streaming)

    async def run(self) -> None:
        claim = self.claim
        parsed = chat_commands.parse(claim.text)
        try:
            if parsed is not None:
                describe = self.runner.describe_model(claim.agent)
                text = await commands.run(parsed[0], parsed[1], claim, self.call, self.runner.reader, describe)
                await self.finish(answer=text)
            else:
                await self.agent_turn()
        except Parked:
            self.log.info("turn_parked")
        except ProviderError as exc:
            self.log.error("model_failed", kind=exc.kind, error=exc.detail or exc.user_text)
            await self.finish(answer=exc.user_text, ok=False, error=f"{exc.kind}: {exc.detail or exc.user_text}")
        except StarlingError as exc:  # a broken persona pack or agent config: say so to the person too
            self.log.error("turn_failed", error=str(exc))
            await self.finish(answer=f"I can't answer: {exc}", ok=False, error=str(exc))

    async def finish(self, answer: str, ok: bool = True, error: str = "", meta: str = "{}") -> None:
        replies = [m.Reply(text=answer, reply_to=self.claim.platform_msg_id)] if answer else []
        try:
            await self.call(m.FinishTurn(turn_id=self.claim.turn_id, worker=self.worker, ok=ok, error=error,
                                         answer=answer, replies=replies, meta=meta))
            self.log.info("turn_done", ok=ok)
        except WriteRejected as exc:
            if exc.code != "lease_lost":
                raise
            self.log.warning("lease_lost", detail="another runner took this turn; its answer counts")

    # ------------------------------------------------------------ the agent loop

    async def agent_turn(self) -> None:
        claim = self.claim
        persona: Persona = self.runner.personas.get(claim.agent)
        provider = self.runner.provider_for(persona)
        queue = self.runner.cfg.conversation.queue
        if queue == "collect":
            await self._previous_reply_sent()
        if queue != "followup":
            await self._fold()  # the messages already waiting are answered with this one
        summary, messages, approval = self._load(persona)
        messages = await self._inbound_files(persona, provider, await self._hear(messages))
        system = persona.system_prompt(summary, channel=claim.instance)
        system, messages = await self._maybe_compact(provider, persona, system, summary, messages)
        tools = registry.specs_for(persona.settings.tools, self.runner.cfg) + ([SKILL_TOOL] if persona.skills else [])
        ctx = ToolContext(paths=self.runner.paths, cfg=self.runner.cfg, agent=claim.agent,
                          session_id=claim.session_id, turn_id=claim.turn_id, instance=claim.instance,
                          chat=claim.chat, call=self.call, reader=lambda: self.runner.reader, log=self.log,
                          worker=self.worker, mcp=tuple(persona.settings.mcp))
        mcp_tools, unavailable = await registry.mcp_specs(ctx)  # starts the agent's MCP servers on first use
        tools += mcp_tools
        if unavailable:
            system += "\n\n# Unavailable tools\n" + "\n".join(f"- {line}" for line in unavailable)
        pending = conversation.pending_calls(messages)
        if pending:  # resumed: after an approval was decided, or after a runner died mid-call
            await self._run_calls(ctx, persona, pending, messages, approval)
        done_steps = _steps_taken(messages)  # a resumed turn keeps its count
        if self.runner.cfg.gateways.streams(claim.instance):
            self.drafts = Drafts(self.runner.rt.client.send_hint, claim)
        for step in range(max(0, persona.settings.max_steps - done_steps)):
            if step and queue != "followup":  # those that came while the turn ran join before its next call
                await self._join(messages)
            reply = await self._streamed(provider, system, messages, tools, queue, done_steps + step)
            await self._record_usage(provider, reply)
            if not reply.tool_calls:
                await self.finish(answer=reply.text or "(the model sent an empty answer)")
                return
            await self.call(m.AppendTurn(session_id=claim.session_id, worker=self.worker, role="assistant",
                                         content=reply.text, meta=conversation.tool_calls_meta(reply.tool_calls),
                                         parent_turn_id=claim.turn_id))
            messages.append(Message("assistant", reply.text, tool_calls=reply.tool_calls))
            await self._run_calls(ctx, persona, list(reply.tool_calls), messages, None)
        await self.finish(answer=f"I stopped after {persona.settings.max_steps} steps without finishing;"
                                 " tell me how to go on.", ok=False, error="max_steps")

    async def _previous_reply_sent(self) -> None:
        """While the session's previous reply still waits for its platform's pace, this answer would wait behind
        it anyway: the messages that come meanwhile are folded in instead of costing sends of their own."""
        deadline = time.monotonic() + DELIVERY_WAIT_S
        while time.monotonic() < deadline:
            with read_tx(self.runner.reader) as conn:
                if not fold_store.answer_unsent(conn, self.claim.session_id):
                    return
            await asyncio.sleep(0.02)

    async def _fold(self) -> list[int]:
        """The session's later pending messages become part of this turn (collect, interrupt): ids, oldest first."""
        with read_tx(self.runner.reader) as conn:  # most turns have nothing waiting: no write to ask for then
            if not fold_store.pending_after(conn, self.claim.session_id, self.claim.turn_id):
                return []
        folded = await self.call(m.FoldTurns(turn_id=self.claim.turn_id, worker=self.worker))
        if folded.ids:
            self.log.info("turns_folded", folded=folded.ids)
        return list(folded.ids)

    async def _join(self, messages: list[Message]) -> bool:
        """Fold what came meanwhile and show it to the model as the person's next messages."""
        ids = await self._fold()
        if not ids:
            return False
        with read_tx(self.runner.reader) as conn:
            turns = [turn for turn in map(lambda i: turn_store.get(conn, i), ids) if turn is not None]
        messages.extend(conversation.to_messages(turns)[0])
        return True

    async def _streamed(self, provider, system: str, messages: list[Message], tools: list[ToolSpec], queue: str,
                        step: int) -> ModelReply:
        """One model step; with streaming on, its text is shown as it is written (drafts.py)."""
        drafts = self.drafts
        if drafts is None:
            return await self._complete(provider, system, messages, tools, queue)
        drafts.begin_step(step)
        try:
            reply = await self._complete(provider, system, messages, tools, queue, drafts.on_text)
        finally:
            drafts.close()
        drafts.end_step(reply.text)
        return reply

    async def _complete(self, provider, system: str, messages: list[Message], tools: list[ToolSpec],
                        queue: str, on_text=None) -> ModelReply:
        """One model call; in interrupt mode a new message of the session cancels it (a model call only, never
        a tool) and it starts again with the newcomer."""
        stream = {"on_text": on_text} if on_text else {}  # without it, the call is exactly as before
        while True:
            if queue != "interrupt":
                return await provider.complete(system, messages, tools, **stream)
            call = asyncio.create_task(provider.complete(system, messages, tools, **stream))
            watch = asyncio.create_task(self._newcomer())
            try:
                await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the turn itself is stopped (its lease lost, the runner stopping)
                await cancel_quietly(call)
                raise
            finally:
                await cancel_quietly(watch)
            if call.done():
                return call.result()
            await cancel_quietly(call)
            if not await self._join(messages):  # it cannot join (a command, a file): it waits its own turn
                return await provider.complete(system, messages, tools, **stream)
            self.log.info("model_call_interrupted", detail="a new message came: the call starts again with it")

    async def _newcomer(self) -> None:
        """Returns once a message of the session is waiting after this turn."""
        while True:
            with read_tx(self.runner.reader) as conn:
                if fold_store.pending_after(conn, self.claim.session_id, self.claim.turn_id):
                    return
            await asyncio.sleep(NEWCOMER_POLL_S)

    def _load(self, persona: Persona) -> tuple[str, list[Message], approval_store.Approval | None]:
        claim = self.claim
        limit = self.runner.cfg.conversation.max_conversation_turns
        with read_tx(self.runner.reader) as conn:
            summary, upto = session_store.summary(conn, claim.session_id)
            turns = turn_store.conversation(conn, claim.session_id, claim.turn_id, upto, limit)
            approval = approval_store.for_turn(conn, claim.turn_id)
        messages, self._message_turn_ids = conversation.to_messages(turns)
        # messages folded into a turn: a compaction cut before one would split that turn (see _maybe_compact)
        self._folded = {t.id for t in turns if t.role == "user" and '"folded_into"' in t.meta}
        return summary, messages, approval

    async def _hear(self, messages: list[Message]) -> list[Message]:
        """The claimed turn's voice notes as text, stored in place of their lines (transcribe.py)."""
        for index, turn_id in enumerate(self._message_turn_ids):
            if turn_id != self.claim.turn_id or messages[index].role != "user":
                continue
            text = await transcribe.hear(messages[index], self.runner.cfg, self.runner.paths.secrets_file,
                                         self.runner.paths.attachments_dir / self.claim.agent, self.log)
            if text is not None:
                await self.call(m.SetTurnText(turn_id=self.claim.turn_id, worker=self.worker, content=text))
                messages[index] = transcribe.replace_text(messages[index], text)
        return messages

    async def _inbound_files(self, persona: Persona, provider, messages: list[Message]) -> list[Message]:
        """The person's files as the model gets them: images as image parts (vision), documents inlined,
        lines naming the rest (media.py)."""
        root = self.runner.paths.attachments_dir / self.claim.agent
        return await asyncio.to_thread(media.show, messages, root, provider.cfg)

    async def _run_calls(self, ctx: ToolContext, persona: Persona, calls: list[ToolCall], messages: list[Message],
                         approval: approval_store.Approval | None) -> None:
        for call in calls:
            decided = approval if approval and _approval_call_id(approval) == call.id else None
            result = await self._execute(ctx, persona, call, decided)
            await self._store_result(call, result.content)
            # a resumed call has a stand-in in ``messages``: the result takes its place
            conversation.put_result(messages, Message("tool", result.content, tool_call_id=call.id, name=call.name))

    async def _store_result(self, call: ToolCall, content: str, mark: str = "") -> None:
        """A tool message for ``call``; a later one replaces it in the conversation (see conversation.py)."""
        meta = {"tool_call_id": call.id, "name": call.name, **({"mark": mark} if mark else {})}
        await self.call(m.AppendTurn(session_id=self.claim.session_id, worker=self.worker, role="tool",
                                     content=content, meta=json.dumps(meta), parent_turn_id=self.claim.turn_id))

    async def _execute(self, ctx: ToolContext, persona: Persona, call: ToolCall,
                       decided: approval_store.Approval | None) -> ToolResult:
        if decided is not None and decided.state in ("denied", "expired"):
            text = ("The person denied this action." if decided.state == "denied"
                    else "Nobody decided in time; the action was not run.")
            await self._audit(call, ToolResult(text, outcome="denied"), 0.0)
            return ToolResult(text, outcome="denied")
        ctx.approved = decided is not None and decided.state == "approved"
        started = time.monotonic()
        # from here the call may run: if this runner dies, the call is reported as interrupted, not re-run
        await self._store_result(call, conversation.INTERRUPTED, mark="started")
        if call.name == SKILL_TOOL.name:
            result = self._skill(persona, call)
        else:
            result = await registry.execute(ctx, call.name, call.arguments, persona.settings.tools)
        if result.outcome == "needs_approval":  # nothing ran
            mode = persona.settings.approval.mode
            if mode == "auto" or self._granted(persona, call):
                ctx.approved = True
                ctx.auto_approved = mode == "auto"  # a person's grant lifts network confinement, auto never does
                result = await registry.execute(ctx, call.name, call.arguments, persona.settings.tools)
            elif mode == "deny":
                result = ToolResult(f"Refused: {result.approval_reason} needs approval, and this agent's approval"
                                    " mode is deny.", outcome="refused")
            else:
                await self._store_result(call, conversation.WAITING, mark="waiting")
                await self._park(call, result, persona.settings.approval.ttl_s)
        await self._audit(call, result, (time.monotonic() - started) * 1000)
        return result

    def _skill(self, persona: Persona, call: ToolCall) -> ToolResult:
        try:
            text = persona.skill_text(str(call.arguments.get("name", "")))
        except OSError as exc:
            return ToolResult(f"The skill could not be read: {exc.strerror}", outcome="error")
        return ToolResult(text) if text is not None else ToolResult("No such skill.", outcome="error")

    def _granted(self, persona: Persona, call: ToolCall) -> bool:
        arguments = registry.redact_arguments(call.arguments)
        with read_tx(self.runner.reader) as conn:
            patterns = approval_store.grants(conn, persona.agent, call.name)
        return any(_grant_matches(p, arguments) for p in patterns)

    async def _park(self, call: ToolCall, result: ToolResult, ttl_s: float) -> None:
        approval_id = "".join(secrets.choice(APPROVAL_ALPHABET) for _ in range(8))
        arguments = registry.redact_arguments(call.arguments)
        notice = (f"I need your approval to {result.approval_reason or call.name}:\n{_show(call)}\n"
                  + chat_commands.approval_hint(approval_id))
        await self._audit(call, ToolResult(result.approval_reason, outcome="pending"), 0.0)
        await self.call(m.ParkTurn(turn_id=self.claim.turn_id, worker=self.worker, approval_id=approval_id,
                                   tool=call.name, arguments=json.dumps({"call_id": call.id, "args": arguments}),
                                   reason=result.approval_reason, ttl_s=ttl_s, notice=notice))
        self.log.info("approval_asked", approval_id=approval_id, tool=call.name)
        raise Parked()

    async def _audit(self, call: ToolCall, result: ToolResult, duration_ms: float) -> None:
        outcome = {"needs_approval": "pending"}.get(result.outcome, result.outcome)
        await self.call(m.RecordTool(
            session_id=self.claim.session_id, turn_id=self.claim.turn_id, agent=self.claim.agent, tool=call.name,
            arguments=registry.redact_arguments(call.arguments), outcome=outcome,
            result_path=str(result.result_path or ""),
            error=result.content[:500] if outcome in ("error", "refused") else "", duration_ms=duration_ms))

    async def _record_usage(self, provider, reply: ModelReply) -> None:
        await self.call(m.RecordUsage(
            session_id=self.claim.session_id, turn_id=self.claim.turn_id, agent=self.claim.agent,
            provider=provider.name, model=reply.model or provider.model, input_tokens=reply.usage.input_tokens,
            output_tokens=reply.usage.output_tokens, cost_usd=cost_usd(reply.model or provider.model, reply.usage)))

    # ------------------------------------------------------------ compaction

    async def _maybe_compact(self, provider, persona: Persona, system: str, summary: str,
                             messages: list[Message]) -> tuple[str, list[Message]]:
        """When the prompt would pass max_context_ratio of the window, older turns become a summary."""
        window = self.runner.context_window(persona)
        budget = int(window * self.runner.cfg.conversation.max_context_ratio)
        if conversation.estimate_tokens(system, messages) <= budget:
            return system, messages
        cut = conversation.compaction_cut(messages, int(budget * KEEP_RECENT_SHARE))
        while cut > 0 and (messages[cut].role != "user" or self._message_turn_ids[cut] in self._folded):
            cut -= 1  # a folded message belongs to the turn it joined: cut before that turn instead
        if cut <= 0:
            return system, messages
        older = messages[:cut]
        room = max(2000, budget * conversation.CHARS_PER_TOKEN // 2)  # the summary request must fit too
        prompt = ("Summarise this conversation so far for your own later reference: facts, decisions, open"
                  " tasks, names. Be concise.\n\n"
                  + (f"Earlier summary:\n{summary}\n\n" if summary else "") + conversation.transcript(older, room))
        try:
            reply = await provider.complete("You write faithful, compact summaries.", [Message("user", prompt)], [])
            await self._record_usage(provider, reply)
            new_summary = reply.text
        except ProviderError as exc:  # the turn goes on without the older part rather than failing for good
            self.log.warning("summary_failed", kind=exc.kind, error=exc.detail or exc.user_text)
            new_summary = (summary + "\n" if summary else "") + "(Older turns were dropped: they could not be summarised.)"
        # the cut falls on a user turn: everything before its place in the conversation is now summarised
        upto = self._message_turn_ids[cut] - 1
        await self.call(m.SetSummary(session_id=self.claim.session_id, summary=new_summary, upto_turn_id=upto))
        self.log.info("compacted", messages_summarised=cut, kept=len(messages) - cut)
        return persona.system_prompt(new_summary, channel=self.claim.instance), messages[cut:]


def _steps_taken(messages: list[Message]) -> int:
    """Model calls already made in the current turn: assistant messages after its user message."""
    steps = 0
    for message in reversed(messages):
        if message.role == "user":
            break
        steps += message.role == "assistant"
    return steps


def _approval_call_id(approval: approval_store.Approval) -> str:
    try:
        return json.loads(approval.arguments).get("call_id", "")
    except (ValueError, AttributeError):
        return ""


def _grant_matches(pattern: str, arguments: str) -> bool:
    """A grant stored from an approval ({"call_id", "args"}) covers the same call: the same arguments,
    compared in one normal form (keys sorted, any non-ASCII kept as is)."""
    try:
        granted = json.loads(pattern)
        if isinstance(granted, dict) and "args" in granted:
            granted = granted["args"]
        if isinstance(granted, str):
            granted = json.loads(granted)
        return _normal(granted) == _normal(json.loads(arguments))
    except ValueError:
        return pattern == arguments


def _normal(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _show(call: ToolCall) -> str:
    if call.name == "shell" and "command" in call.arguments:
        return f"$ {call.arguments['command']}"
    return f"{call.name} {json.dumps(call.arguments, ensure_ascii=False)[:500]}"


async def cancel_quietly(task: asyncio.Task) -> None:
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the task's own errors are logged by it
        pass


def settings_model(persona: Persona, provider_cfg):
    """The provider's config with the agent's model override applied."""
    if persona.settings.model:
        return msgspec.structs.replace(provider_cfg, model=persona.settings.model)
    return provider_cfg
