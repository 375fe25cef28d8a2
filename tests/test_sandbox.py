"""The kernel sandbox itself, through the real shell tool with every call approved (only confinement stands).

Each test runs commands the classifier would ask about, as approval mode ``auto`` would run them, and
checks what the kernel allowed: files, environment, limits, process group, network, signals, sockets.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import pytest

from common import sandbox
from common.config import Config
from services.runner.tools import registry, shell
from services.runner.tools.base import ToolContext, ToolResult
from tests.tool_helpers import make_ctx, no_secrets_from_other_tests  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not sandbox.probe().confined, reason="needs Landlock (the tools are off without it:"
                                " test_tools_are_off_without_landlock covers that)")


@pytest.fixture
def ctx(home) -> ToolContext:
    c = make_ctx(home)
    c.approved, c.auto_approved = True, True  # approval mode auto: nothing is asked, only the sandbox stands
    return c


def run(ctx: ToolContext, command: str, timeout_s: float = 30, network: bool = False) -> ToolResult:
    """The command as the shell tool runs it once it passed the classifier: confined, and nothing else."""
    code, out, _total = asyncio.run(shell.run_command(ctx, command, timeout_s, network=network))
    text = out.decode("utf-8", "replace")
    if code is None:
        return ToolResult(f"[timed out]\n{text}", outcome="error")
    status = f"[exit code {code}]" if code >= 0 else f"[killed by signal {-code}]"
    return ToolResult(f"{status}\n{text}", outcome="ok" if code == 0 else "error")


def with_limits(ctx: ToolContext, **limits) -> ToolContext:
    shell = msgspec.structs.replace(ctx.cfg.tools.shell, **limits)
    ctx.cfg = msgspec.structs.replace(ctx.cfg, tools=msgspec.structs.replace(ctx.cfg.tools, shell=shell))
    return ctx


# ---------------------------------------------------------------- files


def test_data_and_the_home_cannot_be_read_by_any_path_form(ctx):
    secrets_file = ctx.paths.secrets_file
    secrets_file.write_text('{"openai": "sk-sandbox-canary-1234"}')
    for command in (f"cat {secrets_file}", "cat ~+/../../../data/secrets.json", "cat /proc/self/cwd/../../../data/secrets.json",
                    "cd ../../..; cat data/secrets.json", f"cat {ctx.paths.home}/config.toml",
                    "grep -r canary ../../..", f"ls {ctx.paths.data_dir}"):
        result = run(ctx, command)
        assert "canary" not in result.content and "openai" not in result.content, command
        assert result.outcome == "error", (command, result.content)


def test_another_agents_private_folder_is_out_of_reach(ctx):
    other = ctx.paths.private_workspace("bob")
    other.mkdir(parents=True, exist_ok=True)
    (other / "diary.txt").write_text("bob's private canary")
    for command in (f"cat {other}/diary.txt", "cat ../bob/diary.txt", "ls ..", "find .. -name diary.txt"):
        result = run(ctx, command)
        assert "canary" not in result.content, command


def test_the_workspace_is_writable_and_nothing_else(ctx, tmp_path):
    result = run(ctx, "echo one > mine.txt && echo two > ../../shared/ours.txt && cat mine.txt ../../shared/ours.txt")
    assert result.outcome == "ok" and "one" in result.content and "two" in result.content
    outside = tmp_path / "outside.txt"
    targets = [outside, ctx.paths.data_dir / "planted", ctx.paths.agents_dir / "alice" / "SOUL.md",
               ctx.paths.home / "config.toml", Path("/tmp/starling-sandbox-planted")]
    for target in targets:
        before = target.read_bytes() if target.exists() else None
        run(ctx, f"echo planted > {target}; echo planted >> {target}; rm -f {target}")
        after = target.read_bytes() if target.exists() else None
        assert before == after, target


def test_tmpdir_is_private_and_writable(ctx):
    result = run(ctx, 'f=$(mktemp) && echo ok > "$f" && cat "$f" && echo "$TMPDIR"')
    assert result.outcome == "ok", result.content
    assert str(ctx.paths.private_workspace("alice")) in result.content


def test_the_system_can_be_read_and_run(ctx):
    result = run(ctx, f"ls /usr/bin | head -3 && head -1 /etc/passwd && {sys.executable} -c 'print(6*7)'")
    assert result.outcome == "ok" and "42" in result.content, result.content


def test_data_is_an_empty_mount_in_the_namespace(ctx):
    if not sandbox.probe().namespaces:
        pytest.skip("user namespaces are not available here")
    result = run(ctx, f"stat -f -c %T {ctx.paths.data_dir} {ctx.paths.agents_dir}")
    assert result.content.split()[-2:] == ["tmpfs", "tmpfs"], result.content


# ---------------------------------------------------------------- environment and privileges


def test_the_environment_is_clean(ctx, monkeypatch):
    monkeypatch.setenv("STARLING_SECRET_OPENAI", "sk-env-canary-5678")
    monkeypatch.setenv("OPENAI", "sk-env-canary-5678")
    result = run(ctx, "env; cat /proc/$PPID/environ; cat /proc/1/environ")
    assert "canary" not in result.content
    names = {line.split("=", 1)[0] for line in result.content.splitlines() if "=" in line}
    assert {"PATH", "HOME", "TMPDIR", "LANG"} <= names
    assert not {n for n in names if n.startswith("STARLING") or n == "OPENAI"}


def test_no_capabilities_and_no_new_privileges(ctx):
    result = run(ctx, "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status")
    fields = dict(line.split(":\t") for line in result.content.splitlines()[1:])
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"


def test_signals_do_not_leave_the_sandbox(ctx):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        result = run(ctx, f"kill -KILL {victim.pid}; kill -TERM {os.getpid()}")
        assert "not permitted" in result.content
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_abstract_unix_sockets_outside_cannot_be_reached(ctx):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0starling-test-{os.getpid()}"
    listener.bind(name)
    listener.listen(1)
    try:
        script = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({name!r}); print('connected')"
        result = run(ctx, f"{sys.executable} -c \"{script}\"")
        assert "connected" not in result.content.replace("connected'", "")
        assert result.outcome == "error"
    finally:
        listener.close()


# ---------------------------------------------------------------- network


class Listener:
    """A TCP listener on loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    lis = Listener()
    yield lis
    lis.close()


def test_no_tcp_without_a_persons_approval(ctx, listener):
    connect = f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {listener.port}), 2)\""
    for command in (f"echo hi > /dev/tcp/127.0.0.1/{listener.port}", connect,
                    f"cat < /dev/tcp/127.0.0.1/{listener.port}"):
        run(ctx, command)
    for network in (False, True):
        run(ctx, connect, network=network)  # auto mode's own approval does not open the network
    result = asyncio.run(registry.execute(ctx, "shell", {"command": connect, "network": True}))
    assert result.outcome == "refused" and "person" in result.content  # and through the tool it is refused
    time.sleep(0.3)
    assert listener.accepted == 0


def test_udp_has_no_route_without_network(ctx):
    if not sandbox.probe().namespaces:
        pytest.skip("UDP is closed by the network namespace; Landlock covers TCP only")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.5)
    port = receiver.getsockname()[1]
    try:
        run(ctx, f"{sys.executable} -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                 f".sendto(b'leak', ('127.0.0.1', {port}))\"")
        with pytest.raises(TimeoutError):
            receiver.recv(16)
    finally:
        receiver.close()


def test_a_call_a_person_approved_for_the_network_connects(ctx, listener):
    ctx.auto_approved = False  # the person said yes to this very call
    connect = f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {listener.port}), 2)\""
    result = run(ctx, connect, network=True)
    assert result.outcome == "ok", result.content
    deadline = time.monotonic() + 2
    while listener.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.accepted == 1
    assert run(ctx, connect).outcome == "error"  # the same command without network: true stays offline


# ---------------------------------------------------------------- limits and the process group


def test_cpu_limit(ctx):
    with_limits(ctx, cpu_s=1)
    started = time.monotonic()
    result = run(ctx, "while :; do :; done", timeout_s=20)
    assert time.monotonic() - started < 10
    assert "signal" in result.content or "exit code 1" in result.content, result.content


def test_memory_limit(ctx):
    with_limits(ctx, memory_mb=256)
    result = run(ctx, f"{sys.executable} -c \"b = bytearray(600 * 1024 * 1024); print('allocated')\"")
    assert "MemoryError" in result.content and "allocated" not in result.content


def test_file_size_limit(ctx):
    with_limits(ctx, file_mb=1)
    result = run(ctx, "head -c 3000000 /dev/zero > big.bin; stat -c %s big.bin")
    assert int(result.content.split()[-1]) <= 1024 * 1024


def test_open_files_limit(ctx):
    with_limits(ctx, open_files=32)
    script = "fs = [open('/dev/null') for _ in range(100)]"
    result = run(ctx, f"{sys.executable} -c \"{script}\"")
    assert "Too many open files" in result.content


def test_process_limit_is_set(ctx):
    with_limits(ctx, processes=64)
    result = run(ctx, "grep 'Max processes' /proc/self/limits")
    if sandbox.probe().namespaces:
        assert result.content.split()[-3:-1] == ["64", "64"], result.content


def test_timeout_kills_the_whole_group(ctx):
    pidfile = ctx.paths.private_workspace("alice") / "pids"
    result = run(ctx, f"sleep 60 & echo $! > {pidfile}; sleep 60", timeout_s=1)
    assert "timed out" in result.content
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else "gone"
    assert state in ("gone", "Z"), state


# ---------------------------------------------------------------- jobs


def test_background_jobs_are_confined_too(ctx):
    ctx.paths.secrets_file.write_text('{"k": "job-canary-9"}')
    script = ctx.paths.private_workspace("alice") / "job.sh"  # the classifier cannot see what a script does
    script.write_text("d=../../../data; cat $d/secrets.json; echo > $d/planted; echo done\n")
    result = asyncio.run(_job(ctx, "bash job.sh"))
    assert "done" in result and "canary" not in result
    assert not (ctx.paths.data_dir / "planted").exists()


async def _job(ctx: ToolContext, command: str) -> str:
    started = await registry.execute(ctx, "job_start", {"command": command})
    assert started.outcome == "ok", started.content
    log_path = started.content.split("its output goes to ")[1].split(". Check")[0]
    for _ in range(100):
        text = Path(log_path).read_text()
        if "done" in text:
            return text
        await asyncio.sleep(0.05)
    return Path(log_path).read_text()


# ---------------------------------------------------------------- without Landlock

_NO_LANDLOCK = textwrap.dedent("""
    import json, sys
    from common import sandbox
    from common.cli.doctor_cmd import check_sandbox
    from common.config import Config
    found = sandbox.probe("auto")
    print(json.dumps({"confined": found.confined, "usable": found.usable, "reason": found.off_reason(),
                      "doctor": check_sandbox(Config()).status, "none": sandbox.probe("none").usable}))
""")


def _deny_landlock() -> None:
    """A seccomp filter that answers landlock_create_ruleset with ENOSYS, as a kernel before 5.13 does."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    program = (Filter * 4)(Filter(0x20, 0, 0, 0), Filter(0x15, 0, 1, 444),
                           Filter(0x06, 0, 0, 0x00050000 | 38), Filter(0x06, 0, 0, 0x7FFF0000))
    prog = Prog(4, program)
    libc.prctl(38, 1, 0, 0, 0)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")


def test_tools_are_off_without_landlock(home):
    done = subprocess.run([sys.executable, "-c", _NO_LANDLOCK], preexec_fn=_deny_landlock, capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parent.parent)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"confined": False, "usable": False, "doctor": "warn", "none": True,
                     "reason": found["reason"]}
    assert "Landlock" in found["reason"] and 'sandbox = "none"' in found["reason"]


def test_the_shell_tool_says_why_it_is_off(home, monkeypatch):
    monkeypatch.setitem(sandbox._probed, "auto", sandbox.Sandbox("auto", reason="the kernel has no Landlock"))
    ctx = make_ctx(home)
    for tool, args in (("shell", {"command": "ls"}), ("job_start", {"command": "ls"})):
        result = asyncio.run(registry.execute(ctx, tool, args))
        assert result.outcome == "refused" and "no Landlock" in result.content and "sandbox" in result.content


def test_sandbox_none_runs_unconfined_on_purpose(home, tmp_path):
    ctx = make_ctx(home)
    ctx.cfg = msgspec.structs.replace(ctx.cfg, tools=msgspec.structs.replace(ctx.cfg.tools, sandbox="none"))
    ctx.approved = True
    result = asyncio.run(registry.execute(ctx, "shell", {"command": f"echo x > {tmp_path}/outside"}))
    assert result.outcome == "ok" and (tmp_path / "outside").exists()
    assert sandbox.probe("none").layers()[0].startswith("none")


def test_policy_carves_a_home_out_of_a_system_folder(tmp_path):
    root = tmp_path / "opt"
    (root / "other" / "tool").mkdir(parents=True)
    (root / "starling" / "home" / "data").mkdir(parents=True)
    (root / "starling" / "readme").write_text("x")
    rules = sandbox.carve(str(root), (str(root / "starling" / "home"),))
    assert sorted(rules) == sorted([str(root / "other"), str(root / "starling" / "readme")])
    assert Config().tools.sandbox == "auto"


def test_a_setsid_child_is_killed_with_the_command(ctx):
    if not sandbox.probe().namespaces:
        pytest.skip("without a user namespace a setsid child leaves the group (README: residual risks)")
    pidfile = ctx.paths.private_workspace("alice") / "escaped"
    result = run(ctx, f"setsid sleep 60 > /dev/null 2>&1 < /dev/null & echo $! > {pidfile}; echo started; sleep 0.3")
    assert "started" in result.content
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else "gone"
    assert state in ("gone", "Z"), state
