"""Sending an outbox row to Slack: mrkdwn in parts under Slack's limits, in the conversation's thread,
files by the external upload flow, approvals with buttons, and the Web API's errors mapped to outcomes
(a 429 waits on its channel and method only; ok:false errors are never retried blindly)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from schema import messages as m
from services.gateway.channel import Failed, Outcome, Progress, Retry, Sent
from services.gateway.delivery import backoff
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
OFF_LOOP_CHARS = 4_000  # longer texts are formatted in a thread, so one big answer never stalls other channels


class Sender:
    """Limits: chat.postMessage about one a second per channel; the other methods by their tier
    (reactions 50/min, files 20/min for the upload URL, 100/min otherwise)."""

    def __init__(self, api: SlackApi, log, on_thread_post=lambda chat: None) -> None:
        self.api = api
        self.log = log
        self.per_channel = Windows(3, 3.0)  # about one a second per channel, a short burst of 3 allowed
        self.methods = {"reactions.add": Window(50, 60.0), "reactions.remove": Window(50, 60.0),
                        "files.getUploadURLExternal": Window(20, 60.0),
                        "files.completeUploadExternal": Window(100, 60.0)}
        self.on_thread_post = on_thread_post

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

    async def send(self, item: m.OutboxItem, progress: Progress) -> Outcome:
        channel, thread = target(item.chat)
        body = item.body.strip()
        texts = (split_mrkdwn(to_mrkdwn(body)) if len(body) < OFF_LOOP_CHARS
                 else await asyncio.to_thread(lambda: split_mrkdwn(to_mrkdwn(body)))) if body else []
        parts: list[tuple[str, str]] = [("text", t) for t in texts]
        if item.kind == "file":
            path = Path(item.file_path)
            if not path.is_file():
                return Failed(f"file not found: {item.file_path}")
            if path.stat().st_size > FILE_MAX:
                return Failed("file too large for Slack (limit 1 GB)")
            comment = texts[0] if len(texts) == 1 else ""
            parts = [("file", comment)] + ([] if comment else parts)
        ts = ""
        for index in range(min(item.parts_sent, len(parts)), len(parts)):
            kind, text = parts[index]
            last = index == len(parts) - 1
            try:
                if kind == "file":
                    ts = await self._upload(channel, thread, Path(item.file_path), text)
                else:
                    buttons = item.approval_id if last and len(text) <= SECTION_MAX else ""
                    ts = await self._post(channel, thread, text, buttons)
            except SlackError as exc:
                return self._outcome(channel, exc, item.attempt)
            if thread:
                self.on_thread_post(item.chat)
            if not last:
                await progress(index + 1, ts)
        return Sent(ts)

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

    def _outcome(self, channel: str, exc: SlackError, attempt: int) -> Outcome:
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
