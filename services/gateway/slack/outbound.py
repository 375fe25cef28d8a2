"""Slack's half of the outbound path (the kit's services/gateway/delivery.py owns the rest): mrkdwn in parts
under Slack's limits, in the conversation's thread, files by the external upload flow, approvals with
buttons, the Web API's errors mapped to outcomes (a 429 waits on its channel and method only; ok:false
errors are never retried blindly), and drafts: one placeholder message in the thread, then chat.update."""

from __future__ import annotations

import time
from pathlib import Path

from schema import messages as m
from services.gateway.channel import Failed, Outcome, Retry
from services.gateway.delivery import Outbound, backoff
from services.gateway.limits import Window, Windows
from services.gateway.slack.api import NetworkError, SlackApi, SlackError
from services.gateway.slack.render import split_mrkdwn, to_mrkdwn
from services.gateway.slack.inbound import target

FILE_MAX = 1024 * 1024 * 1024   # Slack's upload limit (1 GB)
SECTION_MAX = 3000              # a Block Kit section's text
TOKEN_ERRORS = frozenset({"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive",
                          "no_permission", "missing_scope"})
TRANSIENT_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
TOKEN_RETRY_S = 300.0
COMMENT_MAX = 40_000            # a file's initial_comment: the text when it is one part
# chat.update is tier 3 (50 a minute per workspace), shared by every channel's drafts and answers, and each
# placeholder costs its answer one update: a new placeholder goes only while the minute's calls left exceed
# the placeholders still open by NEW_RESERVE, a draft's update only by UPDATE_RESERVE (first words matter more)
NEW_RESERVE = 5
UPDATE_RESERVE = 15
OPEN_FOR_S = 600.0  # a placeholder no answer took by then (its turn failed) no longer holds an update


class Sender(Outbound):
    """Limits: chat.postMessage about one a second per channel; the other methods by their tier
    (reactions 50/min, files 20/min for the upload URL, 100/min otherwise)."""

    def __init__(self, api: SlackApi, log, on_thread_post=lambda chat: None) -> None:
        self.api = api
        self.log = log
        self.per_channel = Windows(3, 3.0)  # about one a second per channel, a short burst of 3 allowed
        self.methods = {"reactions.add": Window(50, 60.0), "reactions.remove": Window(50, 60.0),
                        "files.getUploadURLExternal": Window(20, 60.0),
                        "files.completeUploadExternal": Window(100, 60.0),
                        "chat.update": Window(50, 60.0), "chat.delete": Window(50, 60.0)}  # tier 3
        self.on_thread_post = on_thread_post
        self.open: dict[str, float] = {}  # placeholder ts -> when posted: each holds one update for its answer

    async def call(self, method: str, params: dict, **kw) -> dict:
        window = self.methods.get(method)
        if window is not None:
            await window.wait()
        try:
            return await self.api.call(method, params, **kw)
        except SlackError as exc:
            if exc.error == "ratelimited" and window is not None:
                window.cool_down(exc.retry_after)
            raise

    platform = "Slack"
    caption_max = COMMENT_MAX
    file_max = FILE_MAX

    def render(self, body: str) -> list[str]:
        return split_mrkdwn(to_mrkdwn(body))

    async def send_text(self, item: m.OutboxItem, index: int, text: str, last: bool) -> str:
        channel, thread = target(item.chat)
        ts = await self._post(channel, thread, text, self._buttons(item, text, last))
        if thread:
            self.on_thread_post(item.chat)
        return ts

    async def send_file(self, item: m.OutboxItem, path: Path, caption: str) -> str:
        channel, thread = target(item.chat)
        file_id = await self._upload(channel, thread, path, caption)
        if thread:
            self.on_thread_post(item.chat)
        return file_id

    async def edit_text(self, item: m.OutboxItem, message_id: str, text: str, last: bool) -> str:
        channel, _ = target(item.chat)
        self.open.pop(message_id, None)
        await self._update(channel, message_id, text, self._buttons(item, text, last))
        return message_id

    async def drop_placeholder(self, item: m.OutboxItem, message_id: str) -> None:
        channel, _ = target(item.chat)
        self.open.pop(message_id, None)
        await self.call("chat.delete", {"channel": channel, "ts": message_id}, timeout=10)

    @staticmethod
    def _buttons(item: m.OutboxItem, text: str, last: bool) -> str:
        return item.approval_id if last and len(text) <= SECTION_MAX else ""

    # ------------------------------------------------------------ drafts

    def draft_kind(self, chat: str) -> str:
        return "placeholder"

    def draft_room(self, chat: str, placeholder: str = "") -> bool:
        """A draft goes only when no answer would wait for it: the channel's pace free, and chat.update's
        workspace budget with room for the answers (more room before a new placeholder, which one must edit)."""
        channel, _ = target(chat)
        if self.per_channel[channel].delay() > 0:
            return False
        update = self.methods["chat.update"]
        if update.delay() > 0:
            return False
        now = time.monotonic()
        for ts in [ts for ts, at in self.open.items() if now - at > OPEN_FOR_S]:
            del self.open[ts]
        left = update.limit - len(update.calls) - len(self.open)
        return left > (UPDATE_RESERVE if placeholder else NEW_RESERVE)

    async def show_draft(self, chat: str, draft_id: int, text: str, placeholder: str, reply_to: str) -> str:
        """The placeholder posted in the conversation's thread, or updated; its ts back."""
        channel, thread = target(chat)
        if placeholder:
            await self._update(channel, placeholder, text, "")
            return placeholder
        ts = await self._post(channel, thread, text, "")
        if thread:
            self.on_thread_post(chat)
        if ts:
            self.open[ts] = time.monotonic()
        return ts

    def draft_wait(self, exc: Exception) -> float | None:
        if isinstance(exc, SlackError) and exc.error == "ratelimited":
            return exc.retry_after or 1.0
        return None

    async def _update(self, channel: str, ts: str, text: str, approval_id: str) -> None:
        params: dict = {"channel": channel, "ts": ts, "text": text}
        if approval_id:  # a placeholder never has blocks of its own
            params["blocks"] = approval_blocks(text, approval_id)
        try:
            await self.call("chat.update", params)
        except SlackError as exc:
            if exc.error != "invalid_blocks" or not approval_id:
                raise
            self.log.warning("blocks_rejected", channel=channel, fallback="text only")
            await self.call("chat.update", {k: v for k, v in params.items() if k != "blocks"})

    async def _post(self, channel: str, thread: str, text: str, approval_id: str) -> str:
        await self.per_channel[channel].wait()
        params = {"channel": channel, "text": text, "mrkdwn": True, "unfurl_links": False}
        if thread:
            params["thread_ts"] = thread
        if approval_id:
            params["blocks"] = approval_blocks(text, approval_id)
        try:
            answer = await self.call("chat.postMessage", params)
        except SlackError as exc:
            if exc.error == "ratelimited":
                self.per_channel[channel].cool_down(exc.retry_after)
            if exc.error != "invalid_blocks" or not approval_id:
                raise
            self.log.warning("blocks_rejected", channel=channel, fallback="text only")
            answer = await self.call("chat.postMessage", {k: v for k, v in params.items() if k != "blocks"})
        return str(answer.get("ts") or "")

    async def _upload(self, channel: str, thread: str, path: Path, comment: str) -> str:
        slot = await self.call("files.getUploadURLExternal", {"filename": path.name, "length": path.stat().st_size},
                               form=True)
        url, file_id = slot.get("upload_url"), slot.get("file_id")
        if not isinstance(url, str) or not isinstance(file_id, str):
            raise NetworkError("files.getUploadURLExternal: no upload_url or file_id in the answer")
        await self.api.upload(url, path)
        params: dict = {"files": [{"id": file_id, "title": path.name}], "channel_id": channel}
        if thread:
            params["thread_ts"] = thread
        if comment:
            params["initial_comment"] = comment
        await self.call("files.completeUploadExternal", params)
        return file_id

    async def outcome(self, exc: Exception, item: m.OutboxItem) -> Outcome | None:
        if not isinstance(exc, SlackError):
            return None
        attempt = item.attempt
        if exc.error == "ratelimited":
            return Retry(exc.retry_after or 1.0, f"{exc.method}: ratelimited")
        if exc.error in TOKEN_ERRORS:
            self.log.error("token_rejected", method=exc.method, error=exc.error,
                           detail="Slack refused the bot token; check the secret and the app's scopes")
            return Retry(TOKEN_RETRY_S, str(exc))
        if exc.error in TRANSIENT_ERRORS:
            return Retry(backoff(attempt), str(exc))
        return Failed(str(exc))  # channel_not_found, not_in_channel, is_archived, msg_too_long, ...


def approval_blocks(text: str, approval_id: str) -> list[dict]:
    """The approval notice as a section with Approve / Deny buttons (the text stays the fallback)."""
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "actions", "block_id": f"approval:{approval_id}", "elements": [
            {"type": "button", "action_id": "starling_approve", "style": "primary", "value": approval_id,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": "starling_deny", "style": "danger", "value": approval_id,
             "text": {"type": "plain_text", "text": "Deny"}},
        ]},
    ]
