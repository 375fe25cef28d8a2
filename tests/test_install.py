"""A normal install works like the editable one: a wheel built from the source, installed into a fresh
venv, runs `starling init`, `up`, `status` and `down` from another folder, with nothing read from the
checkout (supervisord's template, the migrations and the code all come from the installed package)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.procs import REPO

SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", ".benchmarks"}
DEPENDENCIES = ("zmq", "msgspec", "apsw", "croniter", "structlog", "cryptography", "supervisor", "aiohttp")


def _ignore(_folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIP or n.endswith(".egg-info") or n == ".starling"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)  # the working tree, uncommitted files too
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"),
                            str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (found,) = (base / "dist").glob("starling-*.whl")
    return found


def test_the_wheel_carries_supervisords_template_and_the_migrations_as_files(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        template = archive.read("common/supervisord.conf")
    migrations = sorted(p.name for p in (REPO / "schema" / "migrations").glob("*.sql"))
    assert [] == [m for m in migrations if f"schema/migrations/{m}" not in names]
    assert (REPO / "supervisord.conf").read_bytes() == template  # one source: the top-level file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with only the wheel installed; the dependencies are this interpreter's, through a .pth
    file listing their folders (a line of a .pth adds a folder, it does not run the .pth files inside it,
    so an editable install of the checkout there is not seen)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    folders = {str(Path(importlib.util.find_spec(name).origin).parent.parent) for name in DEPENDENCIES}
    folders.add(sysconfig.get_path("platlib"))
    (Path(purelib) / "deps.pth").write_text("\n".join(sorted(folders)) + "\n")
    return root


def test_an_installed_starling_inits_starts_reports_and_stops_outside_the_checkout(venv, tmp_path):
    home = Path(tempfile.mkdtemp(prefix="st", dir="/tmp")) / "home"  # short: the bus's unix socket paths fit
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STARLING_HOME", "VIRTUAL_ENV")}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # this home's run file, not the host's list of running homes

    def starling(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "starling"), "--home", str(home), *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=90)

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import common, services; print(common.__file__,"
                            " services.__file__)"], cwd=work, env=env, capture_output=True, text=True, check=True)
    assert all(str(venv) in path for path in where.stdout.split()), where.stdout  # not the checkout
    init = starling("init")
    assert init.returncode == 0, init.stdout + init.stderr
    config = home / "config.toml"
    config.write_text(re.sub(r'(?m)^listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{_free_port()}"',
                             config.read_text(), count=1))  # init's pick may be taken by another test's home
    up = starling("up", "--timeout", "60")
    try:
        assert (0, "Starling is up") == (up.returncode, up.stdout[:14]), up.stdout + up.stderr
        status = starling("status")
        assert 0 == status.returncode, status.stdout + status.stderr
        assert all(f"{name} " in status.stdout for name in ("writer", "runner-0", "scheduler", "sweeper", "control"))
        conf = (home / "data" / "run" / "supervisord.conf").read_text()
        assert str(venv) in conf and str(REPO) not in conf  # rendered from the installed template
    finally:
        down = starling("down")
        shutil.rmtree(home.parent, ignore_errors=True)
    assert (0, "no process left") == (down.returncode, "no process left" if "no process left" in down.stdout
                                      else down.stdout + down.stderr)
