"""Skills the agents write: a skill drafted by the model through the real runner, approved with the CLI (its
SKILL.md, skills.toml and dated backups), offered in the next turn's system prompt and loaded; drafts
replaced, rejected and ambiguous; and `starling skills unused` against audit rows of known ages."""

from __future__ import annotations

import asyncio
import json
import stat
import time

from common.cli.main import main as cli
from common.personas import create_pack, load_skills_file
from common.skills import install, with_skill
from common.stores import audit_store
from schema import messages as m
from tests.procs import Proc, make_home, remove_home, start_writer
from tests.runner_stack import converse, own_home, started, texts, tool_results
from tests.sweeper_helpers import DAY, seed

TIDES = "# Tides\nRead shared/tides.csv and answer with the next high tide, in local time."


def run(home, capsys, *args: str) -> tuple[int, str]:
    code = cli(["--home", str(home.root), "skills", *args])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_skill_drafted_approved_offered_and_loaded(capsys):
    with own_home() as home:
        started(home, start_writer(home))
        started(home, Proc(home, "runner"))
        home.fake.add({"tool_call": {"name": "skill_draft", "arguments": {
            "name": "tide-tables", "description": "Answer questions about the harbour's tides", "text": TIDES}}},
            {"text": "I drafted a skill for that."})
        converse(home, "skills", "make yourself a skill for tides", replies=1)
        code, listing = run(home, capsys, "drafts")
        assert 0 == code and "tide-tables" in listing and "Answer questions about the harbour's tides" in listing
        assert TIDES in run(home, capsys, "show", "tide-tables")[1]

        code, said = run(home, capsys, "approve", "tide-tables")
        pack = home.paths.agents_dir / "default"
        skill = pack / "skills" / "tide-tables" / "SKILL.md"
        assert 0 == code and "agents/default/skills/tide-tables/SKILL.md" in said, said
        assert ["tide-tables"] == load_skills_file(pack).skills and 0o600 == stat.S_IMODE(skill.stat().st_mode)
        assert TIDES in skill.read_text()
        [copy] = list((home.paths.backups_dir / "default").glob("*-skills.toml"))
        assert "skills = []" in copy.read_text() and "No skill drafts waiting." in run(home, capsys, "drafts")[1]

        home.fake.add({"tool_call": {"name": "skill_load", "arguments": {"name": "tide-tables"}}},
                      {"text": "High tide."})
        before = len(home.fake.requests("openai"))
        converse(home, "skills", "when is high tide?", replies=1)
        first, last = home.fake.requests("openai")[before], home.fake.requests("openai")[-1]
        assert "- tide-tables: Answer questions about the harbour's tides" in texts(first["body"])[0]  # offered
        assert any(TIDES in content for _, content in tool_results(last["body"]))  # loaded
        code, unused = run(home, capsys, "unused")
        assert 0 == code and "Every listed skill was loaded at least once in the last 30 days" in unused


def test_drafts_are_replaced_rejected_and_named_per_agent(capsys):
    home = make_home()
    try:
        for agent in ("default", "second"):
            create_pack(home.paths, agent)
        writer = start_writer(home)
        try:
            async def draft(agent: str, text: str):
                async with home.client("runner") as c:
                    await c.call(m.DraftSkill(agent=agent, name="notes", description="how to keep notes", body=text))

            for agent, text in (("default", "v1"), ("default", "v2"), ("second", "theirs")):
                asyncio.run(draft(agent, text))
            code, rows = run(home, capsys, "drafts", "--json")
            assert [("default", "v2"), ("second", "theirs")] == [
                (r["agent"], _body(home, capsys, r["agent"])) for r in json.loads(rows)]
            code, said = run(home, capsys, "approve", "notes")
            assert 1 == code and "each have a draft named 'notes': say which with --agent" in said
            assert 0 == run(home, capsys, "reject", "notes", "--agent", "second")[0]
            code, said = run(home, capsys, "reject", "notes", "--agent", "second")
            assert 1 == code and "no skill draft named 'notes' of agent 'second'" in said
            assert ["default"] == [r["agent"] for r in json.loads(run(home, capsys, "drafts", "--json")[1])]
        finally:
            writer.stop()
    finally:
        remove_home(home)


def _body(home, capsys, agent: str) -> str:
    return run(home, capsys, "show", "notes", "--agent", agent)[1].rsplit("\n\n", 1)[-1].strip()


def test_unused_reads_the_audit_window(capsys):
    home = make_home()
    try:
        create_pack(home.paths, "default")
        now = time.time()

        def fill(conn, _home):
            for name, days, outcome in (("alpha", 10, "ok"), ("beta", 40, "ok"), ("gamma", 1, "error")):
                audit_store.record_tool(conn, None, 0, "default", "skill_load", json.dumps({"name": name}), outcome,
                                        "", "", 1.0, now - days * DAY)

        seed(home, fill)
        for name in ("alpha", "beta", "gamma"):
            install(home.paths, "default", name, f"the {name} skill", f"do {name}")
        pack = home.paths.agents_dir / "default"
        (pack / "skills.toml").write_text('skills = ["alpha", "beta", "gamma", "ghost"]\n')  # ghost has no SKILL.md
        code, out = run(home, capsys, "unused")
        assert 0 == code
        assert "Skills no turn loaded in the last 30 days ([retention] audit_days" in out
        assert ["beta", "gamma"] == [line.split()[1] for line in out.splitlines() if line.startswith("default ")]
        (home.root / "config.toml").write_text("[retention]\naudit_days = 60\n")
        code, out = run(home, capsys, "unused", "--json")
        assert {"audit_days": 60, "unused": [{"agent": "default", "skill": "gamma"}]} == {
            k: v for k, v in json.loads(out).items() if k != "audit_since"}
    finally:
        remove_home(home)


def test_skills_toml_keeps_its_comments_and_a_replaced_skill_its_old_text(tmp_path):
    text = "# my skills\n# keep this\nskills = [\n  \"one\",\n]\n# trailing note\n"
    kept = b"# my skills\n# keep this\nskills = [\"one\", \"two\"]\n# trailing note\n"
    assert kept == with_skill(text, ["one", "two"])
    home = make_home()
    try:
        create_pack(home.paths, "default")
        install(home.paths, "default", "one", "first", "old text")
        _, backups = install(home.paths, "default", "one", "first", "new text")
        assert 1 == len(backups) and "old text" in backups[0].read_text() and backups[0].name.endswith("-skill-one.md")
    finally:
        remove_home(home)
