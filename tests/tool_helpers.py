"""What the tool tests share: a fake writer call, a tool context for an agent, clean redaction state."""

from __future__ import annotations

import pytest
import structlog

from common import redact
from common.personas import create_pack
from schema import messages as m
from services.runner.tools.base import ToolContext


class FakeWriter:
    """Records every write; answers like the writer would."""

    def __init__(self) -> None:
        self.ops: list = []

    async def call(self, op):
        self.ops.append(op)
        if isinstance(op, m.EnqueueOutbox):
            return m.Queued(ids=[len(self.ops)])
        if isinstance(op, (m.CronRemove, m.JobEnded)):
            return m.Done()
        return m.Stored(id=len(self.ops))


def make_ctx(home, agent: str = "alice", call=None, reader=None, session_id: int = 5) -> ToolContext:
    """A context for ``agent`` (its persona pack made if missing), a fake writer unless ``call`` is given."""
    for pack in {agent, "bob"}:  # bob: another agent whose private folder must stay out of reach
        if not (home.paths.agents_dir / pack).exists():
            create_pack(home.paths, pack)
    return ToolContext(paths=home.paths, cfg=home.cfg, agent=agent, session_id=session_id, turn_id=11,
                       instance="tg", chat="c1", call=call or FakeWriter().call, reader=reader or (lambda: None),
                       log=structlog.get_logger())


@pytest.fixture(autouse=True)
def no_secrets_from_other_tests(monkeypatch):
    """Redaction is process-wide: start each test with none of the values other tests registered."""
    monkeypatch.setattr(redact, "_registry", redact.Registry())
