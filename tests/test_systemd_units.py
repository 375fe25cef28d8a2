"""The systemd units in deploy/systemd: install.sh renders them, systemd-analyze accepts them, they match supervisord."""

from __future__ import annotations

import configparser
import grp
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from common.supervisor import PLATFORMS

REPO = Path(__file__).resolve().parent.parent
UNITS_DIR = REPO / "deploy" / "systemd"
INSTALL = UNITS_DIR / "install.sh"
SINGLETONS = ["writer", "scheduler", "sweeper", "control"]
TEMPLATES = ["runner", "gateway"]
SERVICE_FILES = [f"starling-{name}.service" for name in SINGLETONS] + [f"starling-{t}@.service" for t in TEMPLATES]
# What systemd-analyze checks: each singleton, the target, and instances of the templates.
VERIFIED = (
    [f"starling-{name}.service" for name in SINGLETONS]
    + ["starling-runner@0.service", "starling-runner@1.service"]
    + [f"starling-gateway@{platform}.service" for platform in PLATFORMS]
    + ["starling-gateway@telegram-main.service"]  # a gateway process of its own (process = "main")
    + ["starling.target"]
)
USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def install(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path) if path else None
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=30, env=env)


def render_args(target: Path, home: Path, *extra: str) -> list[str]:
    return ["--target", str(target), "--python", sys.executable, "--home", str(home),
            "--user", USER, "--group", GROUP, *extra]


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as (key, value) pairs in order; keys may repeat, as in systemd."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"a setting outside any section: {raw!r}"
        assert not line.endswith("\\"), "the units use no line continuations; this parser does not follow them"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: dict, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"expected one {key}= in [{section}], found {found}"
    return found[0]


def words(unit: dict, section: str, key: str) -> set[str]:
    return {w for v in values(unit, section, key) for w in v.split()}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, Path]:
    """(units folder, home) after install.sh rendered the units for a temporary home."""
    base = tmp_path_factory.mktemp("systemd")
    home = base / "home"
    (home / "data" / "logs").mkdir(parents=True)
    target = base / "units"
    result = install(*render_args(target, home))
    assert result.returncode == 0, result.stderr
    return target, home


@pytest.fixture(scope="module")
def units(rendered) -> dict[str, dict]:
    target, _ = rendered
    return {path.name: parse_unit(path.read_text()) for path in sorted(target.iterdir())}


def analyze_verify(unit_path: Path) -> subprocess.CompletedProcess:
    # The unit's folder is on the search path, so instance names load the template beside them
    # and the units they name (starling-writer.service, starling.target) load from there too.
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_path)],
                          capture_output=True, text=True, timeout=30, cwd=unit_path.parent)


@pytest.mark.parametrize("unit", VERIFIED)
def test_systemd_analyze_verify_accepts_the_unit(rendered, unit):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    target, _ = rendered
    result = analyze_verify(target / unit)
    # systemd-analyze exits 0 on unknown keys and bad values (it only logs them), so stderr must be empty.
    assert (result.returncode, result.stderr) == (0, "")


def test_systemd_analyze_verify_reports_mistakes_on_stderr(rendered, tmp_path):
    """The check above is only as good as its stderr assertion: a misspelt key must show there."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    target, _ = rendered
    broken = tmp_path / "units"
    shutil.copytree(target, broken)
    writer = broken / "starling-writer.service"
    writer.write_text(writer.read_text().replace("Restart=on-failure", "Restart=on-failure\nRestartSecs=1s"))
    result = analyze_verify(broken / "starling-runner@1.service")  # the writer is loaded as a dependency
    assert "Unknown key 'RestartSecs'" in result.stderr


def test_every_unit_is_rendered_and_no_placeholder_is_left(rendered):
    target, _ = rendered
    expected = {p.name for p in UNITS_DIR.iterdir() if p.suffix in (".service", ".target")}
    assert expected == {*SERVICE_FILES, "starling.target"}
    assert {p.name for p in target.iterdir()} == expected
    for path in target.iterdir():
        assert re.findall(r"@[A-Z]+@", path.read_text()) == [], path.name


@pytest.mark.parametrize("name", SERVICE_FILES)
def test_every_service_is_notify_supervised_and_hardened(units, rendered, name):
    _, home = rendered
    unit = units[name]
    service = dict(unit["Service"])
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["Restart"] == "on-failure"
    assert service["RestartSec"] == "1s"
    assert service["WatchdogSec"] == "30s"
    assert service["KillMode"] == "mixed"
    assert (service["User"], service["Group"]) == (USER, GROUP)
    assert service["UMask"] == "0077"
    assert service["WorkingDirectory"] == str(home)
    assert "PYTHONUNBUFFERED=1" in words(unit, "Service", "Environment")
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert value(unit, "Service", "ReadWritePaths") == str(home)
    assert service["CapabilityBoundingSet"] == ""
    for setting in ("PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
                    "ProtectControlGroups", "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime"):
        assert service[setting] == "yes", setting
    assert words(unit, "Service", "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "MemoryDenyWriteExecute" not in service  # breaks ctypes/cffi callbacks (cryptography)
    assert "StandardOutput" not in service  # see test_exec_start_* for where the log goes, and why
    assert value(unit, "Unit", "PartOf") == "starling.target"
    assert value(unit, "Install", "WantedBy") == "starling.target"


def test_stop_timeouts_match_supervisord(units):
    conf = configparser.RawConfigParser()
    conf.read(REPO / "supervisord.conf")
    programs = {"writer": "writer", "runner": "runner@", "scheduler": "scheduler", "sweeper": "sweeper",
                "control": "control", **{f"gateway-{p}": "gateway@" for p in PLATFORMS}}
    for program, unit_name in programs.items():
        stopwait = conf.getint(f"program:{program}", "stopwaitsecs")
        assert value(units[f"starling-{unit_name}.service"], "Service", "TimeoutStopSec") == f"{stopwait}s", program


def test_everything_but_the_writer_wants_it_and_starts_after_it(units):
    assert "starling-writer.service" not in words(units["starling-writer.service"], "Unit", "After")
    for name in SERVICE_FILES:
        if name == "starling-writer.service":
            continue
        assert "starling-writer.service" in words(units[name], "Unit", "Wants"), name
        assert "starling-writer.service" in words(units[name], "Unit", "After"), name


def test_target_wants_every_singleton_and_runners_gateways_hook_in_when_enabled(units):
    target = units["starling.target"]
    assert words(target, "Unit", "Wants") == {f"starling-{name}.service" for name in SINGLETONS}
    assert value(target, "Install", "WantedBy") == "multi-user.target"
    for template in TEMPLATES:  # `systemctl enable starling-runner@2` links it into starling.target.wants/
        assert value(units[f"starling-{template}@.service"], "Install", "WantedBy") == "starling.target"


def systemd_unescape(text: str, instance: str) -> str:
    """What systemd makes of an ExecStart line: %i is the instance, %% a %, $$ a $ (no other is used)."""
    out, i = [], 0
    while i < len(text):
        pair = text[i:i + 2]
        if pair in ("%%", "$$"):
            out.append(pair[0])
            i += 2
        elif pair == "%i":
            out.append(instance)
            i += 2
        else:
            assert text[i] not in "%$" or pair[1:] in ("{", ""), f"an unescaped {text[i]!r} in {text!r}"
            out.append(text[i])
            i += 1
    return "".join(out)


def exec_start(unit: dict, instance: str) -> tuple[list[str], str]:
    """The Python command line and the log file of a unit's ExecStart for an instance, as the shell runs
    it: the script is run by sh with its ``exec`` replaced by a function that reports its arguments and
    where its stdout goes (the log file, which the redirection creates)."""
    argv = shlex.split(systemd_unescape(value(unit, "Service", "ExecStart"), instance))
    assert argv[:2] == ["/bin/sh", "-c"], argv
    script = argv[2]
    assert script.startswith("exec "), "the shell must exec Python, so the main pid is Python's (READY=1, watchdog)"
    assert script.rstrip().endswith("2>&1"), script
    with tempfile.TemporaryDirectory() as tmp:
        report = ('report() { printf "%s\\0" "$@" >"$REPORT/args"; log=$(readlink "/proc/$$/fd/1");'
                  ' printf "%s" "$log" >"$REPORT/log"; }; report ')
        subprocess.run(["/bin/sh", "-c", report + script.removeprefix("exec "), *argv[3:]], env={"REPORT": tmp},
                       stdin=subprocess.DEVNULL, timeout=10, check=True)
        command = Path(tmp, "args").read_text().split("\0")[:-1]
        log = Path(tmp, "log").read_text().strip()
    return command, log


@pytest.mark.parametrize("name, instances", [
    *[(f"starling-{name}.service", [""]) for name in SINGLETONS],
    ("starling-runner@.service", ["0", "7"]),
    ("starling-gateway@.service", [*PLATFORMS, "telegram-main", "slack-team-2"]),
])
def test_exec_start_runs_an_existing_module_and_logs_like_supervisord(units, rendered, name, instances):
    _, home = rendered
    for instance in instances:
        command, log = exec_start(units[name], instance)
        python, flags, module, *args = command[0], command[1:3], command[3], *command[4:]
        assert python == sys.executable
        assert flags == ["-P", "-m"]
        assert importlib.util.find_spec(module) is not None, module
        assert args[:2] == ["--home", str(home)]
        process = name.removeprefix("starling-").removesuffix(".service").replace("@", f"-{instance}")
        if instance:  # supervisord's process names: runner-N, gateway-<platform>, gateway-<platform>-<NAME>
            assert args[2:] == ["--name", process]
        platform = instance.split("-")[0]
        assert module == {"runner": "services.runner", "gateway": f"services.gateway.{platform}"}.get(
            process.split("-")[0], f"services.{process}")
        assert log == str(home / "data" / "logs" / f"{process}.log")


def test_data_dir_outside_the_home_is_writable_and_holds_the_logs(tmp_path):
    home, data = tmp_path / "home", tmp_path / "disk" / "data"
    (data / "logs").mkdir(parents=True)  # exec_start runs the shell line, which opens the log there
    result = install(*render_args(tmp_path / "units", home, "--data", str(data)))
    assert result.returncode == 0, result.stderr
    unit = parse_unit((tmp_path / "units" / "starling-runner@.service").read_text())
    assert words(unit, "Service", "ReadWritePaths") == {str(home), str(data)}
    assert exec_start(unit, "3")[1] == str(data / "logs" / "runner-3.log")


def test_dry_run_writes_nothing(tmp_path):
    home = tmp_path / "home"
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, tmp_path / "absent"):
        result = install(*render_args(target, home, "--dry-run"))
        assert result.returncode == 0, result.stderr
        assert f"would write {target}/starling-writer.service" in result.stdout
        assert "ExecStart=/bin/sh -c 'exec " in result.stdout
    assert list(empty.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_install_never_runs_systemctl_and_prints_the_steps(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "systemctl-ran"
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    result = install(*render_args(tmp_path / "units", tmp_path / "home", "--runners", "3"),
                     path=f"{bin_dir}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert "systemctl daemon-reload" in result.stdout
    assert "systemctl enable --now starling.target starling-runner@0 starling-runner@1 starling-runner@2" in result.stdout
    assert "systemctl start starling-runner@3" in result.stdout


@pytest.mark.parametrize("option, bad", [
    ("--home", "relative/home"),
    ("--home", "/srv/star ling"),   # a space would split the ExecStart line
    ("--home", "/srv/100%"),        # % is a systemd specifier
    ("--data", "/srv/$HOME"),       # $ is expanded by systemd and by the shell
    ("--python", "/no/such/python"),
    ("--user", "Bad User"),
])
def test_install_refuses_unsafe_values_and_writes_nothing(tmp_path, option, bad):
    args = dict(zip(render_args(tmp_path / "units", tmp_path / "home")[::2],
                    render_args(tmp_path / "units", tmp_path / "home")[1::2]))
    args[option] = bad
    result = install(*[part for pair in args.items() for part in pair])
    assert result.returncode == 2
    assert option in result.stderr
    assert not (tmp_path / "units").exists()
