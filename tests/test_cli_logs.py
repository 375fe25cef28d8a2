"""`starling logs`: JSON lines rendered for people, groups merged by time, -f across rotation and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from common.cli import logs_cmd
from common.cli.main import main
from tests.procs import REPO, ctrl_c_works, wait_until


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def line(event: str, ts: str = "2024-05-01T12:34:56.789Z", service: str = "writer", level: str = "info",
         **extra) -> str:
    return json.dumps({"ts": ts, "level": level, "service": service, "event": event, "pid": 42, **extra})


def clock(ts: str) -> str:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone().strftime("%H:%M:%S")


def write(path: Path, *lines: str) -> None:
    with open(path, "a") as fh:
        fh.write("".join(text + "\n" for text in lines))


@pytest.fixture
def root(tmp_path, capsys) -> Path:
    root = tmp_path / "home"
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    return root


def test_render_puts_time_level_service_and_event_first():
    text = logs_cmd.render(line("ready", db="/x/starling.db", batch=3))
    assert f"{clock('2024-05-01T12:34:56.789Z')} INFO  writer ready db=/x/starling.db batch=3" == text


def test_render_quotes_values_with_spaces():
    assert logs_cmd.render(line("failed", error="no such table")).endswith('failed error="no such table"')


def test_render_prints_a_traceback_indented_below_the_line():
    text = logs_cmd.render(line("crash", level="error", exception="Traceback:\n  boom"))
    assert ["ERROR writer crash", "    Traceback:", "      boom"] == [text.splitlines()[0][9:], *text.splitlines()[1:]]


def test_render_leaves_a_line_that_is_not_json_as_it_is():
    assert "Traceback (most recent call last):" == logs_cmd.render("Traceback (most recent call last):")


def test_render_colours_the_level_when_asked():
    assert "\033[33mWARN \033[0m" in logs_cmd.render(line("slow", level="warning"), colour=True)


def test_logs_shows_the_last_n_lines_rendered(capsys, root):
    write(root / "data/logs/writer.log", *(line(f"event-{i}") for i in range(10)))
    _, out, _ = cli(capsys, "--home", str(root), "logs", "writer", "-n", "3")
    assert ["event-7", "event-8", "event-9"] == [text.split()[3] for text in out.splitlines()]


def test_logs_defaults_to_50_lines(capsys, root):
    write(root / "data/logs/writer.log", *(line(f"event-{i}") for i in range(80)))
    _, out, _ = cli(capsys, "--home", str(root), "logs", "writer")
    assert (50, "event-30") == (len(out.splitlines()), out.splitlines()[0].split()[3])


def test_logs_json_prints_the_raw_lines(capsys, root):
    raw = [line("a"), "plain text", line("b")]
    write(root / "data/logs/writer.log", *raw)
    _, out, _ = cli(capsys, "--home", str(root), "logs", "writer", "--json")
    assert raw == out.splitlines()


def test_a_group_prefix_merges_its_logs_by_time(capsys, root):
    write(root / "data/logs/runner-0.log", line("r0-first", "2024-05-01T10:00:01Z", "runner-0"),
          line("r0-third", "2024-05-01T10:00:03Z", "runner-0"))
    write(root / "data/logs/runner-1.log", line("r1-second", "2024-05-01T10:00:02Z", "runner-1"))
    _, out, _ = cli(capsys, "--home", str(root), "logs", "runner")
    assert ["r0-first", "r1-second", "r0-third"] == [text.split()[3] for text in out.splitlines()]


def test_an_unknown_service_exits_1_naming_the_logs_there_are(capsys, root):
    write(root / "data/logs/writer.log", line("a"))
    write(root / "data/logs/scheduler.log", line("b"))
    rc, _, err = cli(capsys, "--home", str(root), "logs", "nope")
    assert (1, True) == (rc, "available: scheduler, writer" in err)


def follow_in_thread(files, seen: list[str], stop: threading.Event, tracked=None) -> threading.Thread:
    thread = threading.Thread(target=logs_cmd.follow, daemon=True,
                              kwargs={"find_files": lambda: files, "emit": lambda stem, raw: seen.append(raw),
                                      "stop": stop.is_set, "poll_s": 0.02, "tracked": tracked})
    thread.start()
    return thread


def test_follow_reads_across_a_rotation(root):
    log = root / "data/logs/writer.log"
    write(log, "old-0")
    seen: list[str] = []
    stop = threading.Event()
    thread = follow_in_thread([log], seen, stop, {log: logs_cmd.Tracked(log, from_start=False)})
    write(log, "before-1", "before-2")
    wait_until(lambda: len(seen) == 2, 5, what="lines before the rotation")
    write(log, "last-in-old-file")
    os.rename(log, log.with_name("writer.log.1"))  # as supervisord rotates
    write(log, "after-1", "after-2")
    wait_until(lambda: len(seen) == 5, 5, what="lines after the rotation")
    stop.set()
    thread.join(5)
    assert ["before-1", "before-2", "last-in-old-file", "after-1", "after-2"] == seen


def test_follow_starts_over_after_a_truncation(root):
    log = root / "data/logs/writer.log"
    write(log, "first-a", "first-b", "first-c")
    seen: list[str] = []
    stop = threading.Event()
    thread = follow_in_thread([log], seen, stop, {log: logs_cmd.Tracked(log, from_start=False)})
    time.sleep(0.1)
    log.write_text("")
    write(log, "x")
    wait_until(lambda: seen == ["x"], 5, what="the line after truncation")
    stop.set()
    thread.join(5)
    assert ["x"] == seen


def test_follow_keeps_a_partial_line_until_it_ends(root):
    log = root / "data/logs/writer.log"
    log.write_text("")
    seen: list[str] = []
    stop = threading.Event()
    thread = follow_in_thread([log], seen, stop)
    with open(log, "a") as fh:
        fh.write("half")
        fh.flush()
        time.sleep(0.1)
        fh.write(" and whole\n")
    wait_until(lambda: seen, 5, what="the whole line")
    stop.set()
    thread.join(5)
    assert ["half and whole"] == seen


def test_follow_stops_after_max_s(root):
    log = root / "data/logs/writer.log"
    log.write_text("")
    started = time.monotonic()
    logs_cmd.follow(lambda: [log], lambda stem, raw: None, poll_s=0.02, max_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2


@pytest.mark.timeout(30)
def test_logs_follow_stops_cleanly_on_ctrl_c(root):
    log = root / "data/logs/writer.log"
    write(log, line("before"))
    proc = subprocess.Popen([sys.executable, "-m", "common.cli", "--home", str(root), "logs", "writer", "-f"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=ctrl_c_works)
    try:
        assert "before" in proc.stdout.readline()
        write(log, line("while-following"))
        assert "while-following" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(10)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert (0, "") == (rc, err)
