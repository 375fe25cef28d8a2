"""The Slack gateway's Events API transport: Slack's request signing checked before anything is stored,
url_verification, 200 only after the writer acked, and Slack's retries deduped."""

from __future__ import annotations

import json
import time

from common import db
from common.stores import turn_store
from tests.fake_slack import DEFAULT, post_event, url_verification
from tests.slack_stack import OWNER, slack_stack
from tests.test_telegram_modes import free_port


def user_turns(s, chat: str) -> list[str]:
    conn = s.reader()
    with db.read_tx(conn):
        return [t.content for t in turn_store.user_turns_for_chat(conn, "sl", chat)]


def test_events_over_http_are_verified_stored_then_answered():
    port = free_port()
    gateway = (f'[[gateways.slack]]\nid = "sl"\nmode = "events"\napi_base = "{{API}}"\nallow = ["{OWNER}"]\n'
               f'listen = "127.0.0.1:{port}"\n')
    with slack_stack(gateway=gateway) as s:
        s.start_gateway()
        url = f"http://127.0.0.1:{port}/slack/sl/events"
        secret = DEFAULT["signing_secret"]
        challenge = post_event(url, url_verification("abc123"), secret)
        assert (200, "abc123") == (challenge.status, challenge.json["challenge"])
        assert 401 == post_event(url, url_verification("x"), secret, wrong_signature=True).status

        env = s.sl.message("D1", OWNER, "over http", channel_type="im", deliver=False)
        forged = post_event(url, env, secret, wrong_signature=True)
        stale = post_event(url, env, secret, timestamp=time.time() - 400)
        unsigned = post_event(url, env, secret, unsigned=True)
        assert (401, 401, 401) == (forged.status, stale.status, unsigned.status)
        assert [] == user_turns(s, "D1")  # nothing stored from a request whose signature failed

        ok = post_event(url, env, secret)
        assert 200 == ok.status and ok.elapsed < 3.0
        assert ["over http"] == user_turns(s, "D1")  # stored before the 200
        again = post_event(url, env, secret, retry_num=1, retry_reason="http_timeout")
        assert 200 == again.status and ["over http"] == user_turns(s, "D1")
        assert "echo: over http" == s.posted("D1", 1)[0]["text"]

        garbage = post_event(url, b"{not json", secret)
        assert 400 == garbage.status and s.gateway.alive()
        assert secret not in s.gateway.log_text() and json.dumps(secret) not in s.home.paths.db_file.read_bytes().decode(
            "latin-1")
