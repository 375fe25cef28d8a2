"""`starling session list|search|show`: conversations read from SQLite (read-only, short read transactions)."""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime

import apsw

from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import SchemaNotReady, StarlingError
from common.stores import recall_store, schema_store, session_store, turn_store

SNIPPET_CHARS = 80
_ROLE_COLOUR = {"user": "green", "assistant": "bold", "tool": "dim", "system": "yellow", "summary": "dim"}
_LAST_TURN = 2**62


def register(verbs) -> None:
    session = verbs.add_parser("session", help="list, search and show conversations")
    actions = session.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="the most recently active sessions")
    listing.add_argument("--limit", type=_positive, default=50, metavar="N", help="at most N sessions (50)")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)

    search = actions.add_parser("search", help="full-text search over every turn, best match first")
    search.add_argument("query", metavar="QUERY", help="words to find (all of them, stemmed)")
    search.add_argument("--agent", metavar="ID", help="only this agent's sessions")
    search.add_argument("--limit", type=_positive, default=20, metavar="N", help="at most N hits (20)")
    search.add_argument("--json", action="store_true", help="print JSON for scripts")
    search.set_defaults(func=cmd_search)

    show = actions.add_parser("show", help="one session's header and its turns, oldest first")
    show.add_argument("id", type=_positive, metavar="ID", help="the session id (from `session list`)")
    show.add_argument("--limit", type=_positive, default=100, metavar="N", help="the last N turns (100)")
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(func=cmd_show)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def open_reader(ctx: Context) -> apsw.Connection:
    """A read-only connection to a database at this code's schema version; a clear error otherwise."""
    db_file = ctx.paths.db_file
    conn = ctx.reader()
    with db.read_tx(conn):
        current = schema_store.check_not_newer(conn, db_file)
    if current < schema_store.code_version():
        conn.close()
        raise SchemaNotReady(db_file, f"schema version {current}, expected {schema_store.code_version()};"
                                      " the writer migrates it when it starts (`starling up`)")
    return conn


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def snippet(content: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of content around the first word that starts like a query word."""
    text = _one_line(content)
    # FTS matches stems ("running" finds "runs"): compare word beginnings, not whole words
    stems = [w if len(w) <= 3 else w[: max(3, len(w) - 3)] for w in re.findall(r"\w+", query.lower())]
    start = 0
    for match in re.finditer(r"\w+", text):
        if match.group().lower().startswith(tuple(stems)):
            start = max(0, match.start() - width // 4)
            break
    start = max(0, min(start, len(text) - width))
    if start > 0 and not text[start - 1].isspace():  # begin at a word, not inside one
        space = text.find(" ", start, start + width // 4)
        start = space + 1 if space >= 0 else start
    piece = text[start : start + width].strip()
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = open_reader(ctx)
    try:
        with db.read_tx(conn):
            found = session_store.recent_with_turns(conn, args.limit)
    finally:
        conn.close()
    if args.json:
        output.emit_json([{**s._asdict(), "turns": n} for s, n in found])
        return 0
    if not found:
        print("no sessions yet")
        return 0
    now = time.time()
    rows = [(s.id, s.agent, s.instance, s.chat, s.state, n, output.ago(s.last_active_at, now)) for s, n in found]
    print(output.table(("ID", "AGENT", "INSTANCE", "CHAT", "STATE", "TURNS", "LAST ACTIVE"), rows))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    if not recall_store.quote_query(args.query):
        raise StarlingError("the query has no words to search for")
    conn = open_reader(ctx)
    try:
        with db.read_tx(conn):
            hits = recall_store.search(conn, args.query, args.limit, args.agent)
    finally:
        conn.close()
    if args.json:
        output.emit_json([{**h._asdict(), "snippet": snippet(h.content, args.query)} for h in hits])
        return 0
    if not hits:
        print(f"no turns match {args.query!r}")
        return 0
    rows = [(h.session_id, h.turn_id, h.role, _when(h.created_at), snippet(h.content, args.query)) for h in hits]
    print(output.table(("SESSION", "TURN", "ROLE", "WHEN", "TEXT"), rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = open_reader(ctx)
    try:
        with db.read_tx(conn):
            session = session_store.get(conn, args.id)
            if session is None:
                raise StarlingError(f"no session {args.id}; see `starling session list`")
            total = session_store.turn_count(conn, args.id)
            turns = turn_store.history(conn, args.id, _LAST_TURN, args.limit)
    finally:
        conn.close()
    if args.json:
        output.emit_json({"session": {**session._asdict(), "turns": total},
                          "turns": [t._asdict() for t in turns]})
        return 0
    print(output.paint(f"session {session.id}", "bold") + f"  agent {session.agent}  {session.instance}:{session.chat}"
          f"  {session.state}")
    print(f"started {_when(session.created_at)}  last active {output.ago(session.last_active_at)}"
          + (f"  closed {_when(session.closed_at)}" if session.closed_at else ""))
    if session.title:
        print(f"title: {session.title}")
    if session.summary:
        print(f"summary: {_one_line(session.summary)}")
    shown = f"the last {len(turns)} of {total} turns" if len(turns) < total else f"{total} turns"
    print(output.paint(shown, "dim"))
    print()
    _print_turns(turns)
    return 0


def _print_turns(turns: list[turn_store.Turn]) -> None:
    """Each turn once; a tool call shown under the turn that made it, with its name, arguments and the
    result that stands (a runner stores a stand-in before a call runs and while it waits for approval,
    and the real result after: only the last one is the call's result)."""
    results = {}  # call id -> the tool turn that answers it last
    for turn in turns:
        if turn.role == "tool":
            results[_meta(turn.meta).get("tool_call_id", "")] = turn
    shown: set[int] = set()
    for turn in turns:
        meta = _meta(turn.meta)
        if turn.role == "tool" and (turn.id in shown or results.get(meta.get("tool_call_id", "")) is not turn):
            continue  # shown with its call, or replaced by a later result
        calls = [c for c in meta.get("tool_calls", []) if isinstance(c, dict)] if turn.role == "assistant" else []
        role = output.paint(turn.role, _ROLE_COLOUR.get(turn.role, "bold"))
        who = f" ({turn.sender})" if turn.sender else ""
        state = f" [{turn.state}]" if turn.state in ("pending", "claimed", "failed") else ""
        print(f"{_when(turn.created_at)}  #{turn.id} {role}{who}{state}")
        if turn.role == "tool":  # its call is before the turns shown
            print(f"    {meta.get('name', 'tool')} result:")
        for line in (turn.content or "").splitlines() or ([] if calls else [""]):
            print(f"    {line}")
        for call in calls:
            arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
            print("    " + output.paint(f"calls {call.get('name', '?')} {_clip(arguments)}", "yellow"))
            result = results.get(call.get("id", ""))
            if result is None:
                print("      " + output.paint("(no result yet)", "dim"))
                continue
            shown.add(result.id)
            for line in _clip(result.content or "(empty)").splitlines():
                print("      " + output.paint(line, "dim"))
        if turn.error:
            print("    " + output.paint(f"error: {turn.error}", "red"))


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f" […{len(text) - limit} more characters]"


def _meta(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
