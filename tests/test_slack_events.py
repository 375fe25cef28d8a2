"""The Slack gateway's Events API transport: Slack's request signing checked before anything is stored,
url_verification, 200 only after the writer acked, and Slack's retries deduped."""

from __future__ import annotations

import json
import time

from tests.fake_slack import DEFAULT, post_event, url_verification
from tests.slack_stack import OWNER, slack_stack
from tests.test_telegram_modes import free_port


def user_turns(s, chat: str) -> list[str]:
    return s.user_turns("sl", chat)


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

        huge = post_event(url, b'{"type": "event_callback", "pad": "' + b"x" * (5 * 1024 * 1024) + b'"}', secret)
        assert 413 == huge.status  # refused before it is read: nothing stored
        garbage = post_event(url, b"{not json", secret)
        assert 400 == garbage.status and s.gateway.alive()
        assert secret not in s.gateway.log_text() and json.dumps(secret) not in s.home.paths.db_file.read_bytes().decode(
            "latin-1")


def test_two_workspaces_in_one_process_each_answer_their_own():
    from common.secrets import set_secret
    from tests.fake_slack import app_defaults

    second = app_defaults(2)
    gateway = (f'[[gateways.slack]]\nid = "sl"\napi_base = "{{API}}"\nallow = ["{OWNER}"]\nping_interval_s = 1\n'
               f'[[gateways.slack]]\nid = "sl2"\napi_base = "{{API}}"\nallow = ["{OWNER}"]\nping_interval_s = 1\n'
               'bot_token = "slack-bot-2"\napp_token = "slack-app-2"\n')
    with slack_stack(gateway=gateway, apps=[{}, {}]) as s:
        set_secret(s.home.paths.secrets_file, "slack-bot-2", second["bot_token"])
        set_secret(s.home.paths.secrets_file, "slack-app-2", second["app_token"])
        s.start_gateway()
        s.sl.message("D1", OWNER, "to the first", channel_type="im")
        s.sl.message("D2", OWNER, "to the second", channel_type="im", app=second["app_id"])
        first, other = s.posted("D1", 1), s.posted("D2", 1)
        assert ("echo: to the first", "echo: to the second") == (first[0]["text"], other[0]["text"])
        assert (app_defaults(1)["app_id"], second["app_id"]) == (first[0]["app"], other[0]["app"])
        assert (["to the first"], ["to the second"]) == (user_turns_of(s, "sl", "D1"), user_turns_of(s, "sl2", "D2"))


def user_turns_of(s, instance: str, chat: str) -> list[str]:
    return s.user_turns(instance, chat)
