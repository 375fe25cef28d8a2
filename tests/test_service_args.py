"""common/service_args.py: a service's command line read without argparse gives what argparse gives, and
anything but the plain form (--help, an error, an abbreviation) is argparse's to answer, as before."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from common import service_args
from services.gateway.base import _options

REPO = Path(__file__).resolve().parent.parent

PLAIN = [
    [],
    ["--home", "/h"],
    ["--home=/h", "--name", "runner-1"],
    ["--home", "/h", "--instance", "a", "--instance=b"],
    ["--home", "/h", "--process", "main", "--name", "gateway-telegram-main"],
    ["--home", ""],
    ["--home=", "--name=x=y"],
    ["--home", "a", "--home", "b"],
    ["--home=-x"],
]
NOT_PLAIN = [["--ho", "/h"], ["-h"], ["--help"], ["--home"], ["--home", "-x"], ["pos"], ["--", "--home", "x"],
             ["--bogus", "1"], ["--instance"]]


def options() -> service_args.Options:
    o = service_args.Options()
    o.add_argument("--home", help="the home")
    o.add_argument("--name", help="the name")
    _options("telegram")(o)
    return o


def argparse_reading(argv):
    parser = argparse.ArgumentParser(prog="p")
    for flags, kw in options().calls:
        parser.add_argument(*flags, **kw)
    return vars(parser.parse_args(argv))


@pytest.mark.parametrize("argv", PLAIN)
def test_the_plain_form_is_read_as_argparse_reads_it(argv):
    plain = service_args._plain(argv, options())
    assert plain is not None
    assert vars(plain) == argparse_reading(argv)
    assert vars(service_args.parse(argv, "p", "", options())) == argparse_reading(argv)


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_anything_else_goes_to_argparse(argv):
    assert service_args._plain(argv, options()) is None


def test_a_default_list_is_never_shared_between_readings():
    o = options()
    first = service_args.parse(["--instance", "a"], "p", "", o)
    second = service_args.parse([], "p", "", o)
    assert first.instance == ["a"] and second.instance == []


def test_a_service_answers_help_and_errors_as_argparse_did_without_loading_it_otherwise(tmp_path):
    """--help prints argparse's usage with every option; a bad option exits 2 with its error; a plain command
    line leaves argparse unimported."""
    run = [sys.executable, "-m", "services.sweeper"]
    helped = subprocess.run([*run, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "usage: starling-sweeper" in helped.stdout and "--home HOME" in helped.stdout
    assert "Starling's sweeper" in helped.stdout
    wrong = subprocess.run([*run, "--hom"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "expected one argument" in wrong.stderr
    code = ("import sys\nfrom common import service\n"
            "try:\n    service.boot('sweeper', ['--home', sys.argv[1], '--name', 'x'])\n"
            "except SystemExit:\n    pass\n"
            "print('argparse' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nohome")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr
