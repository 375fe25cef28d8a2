"""The walls between processes: no service imports another service, and common/ and schema/ import no
service (DESIGN.md, STYLE.md "The walls are real"). Every import counts, also one inside a function, a
relative one, and `importlib.import_module("services....")` with a literal name."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WALLED = ("common", "services", "schema")  # bench/ and tests/ may import anything


def _module_of(path: Path, root: Path) -> list[str]:
    """``services/runner/turn.py`` → ["services", "runner", "turn"]; a package's __init__ is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_names(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_of(path, root)
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from services import runner` imports services.runner: name each imported name under the stem
            found += [(node.lineno, f"{stem}.{alias.name}" if alias.name != "*" else stem) for alias in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value.split(":", 1)[0]))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def crossing(path: Path, name: str, root: Path = REPO) -> bool:
    """Whether importing ``name`` from ``path`` goes through a wall."""
    here = _module_of(path, root)
    target = name.split(".")
    if target[0] != "services":
        return False
    if here[0] in ("common", "schema"):
        return True
    if here[0] == "services":
        # services/__init__.py itself, or `import services`: no service in particular
        return len(here) > 1 and len(target) > 1 and target[1] != here[1]
    return False


def wall_offences(root: Path = REPO) -> list[str]:
    offences = []
    for folder in WALLED:
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in imported_names(path, root):
                if crossing(path, name, root):
                    offences.append(f"{path.relative_to(root).as_posix()}:{line}: imports {name}")
    return offences


def test_no_service_imports_another_and_common_imports_no_service():
    assert [] == wall_offences()


def test_the_scan_sees_the_services_and_common():
    names = {p.relative_to(REPO).as_posix() for folder in WALLED for p in (REPO / folder).rglob("*.py")}
    assert {"common/cli/whatsapp_cmd.py", "services/sweeper/memory.py", "services/runner/commands.py",
            "common/chat_commands.py", "schema/messages.py"} <= names


def test_the_checker_catches_planted_crossings(tmp_path):
    (tmp_path / "services" / "sweeper").mkdir(parents=True)
    (tmp_path / "services" / "runner").mkdir(parents=True)
    (tmp_path / "common" / "cli").mkdir(parents=True)
    (tmp_path / "schema").mkdir()
    (tmp_path / "services" / "sweeper" / "memory.py").write_text(
        "import os\n"
        "from services.sweeper import retention\n"        # its own service: fine
        "from services.runner import commands\n"           # line 3
        "def later():\n"
        "    import services.writer.main\n"                # line 5, inside a function
        "    from ..runner.turn import Turn\n"             # line 6, relative
        "from services import control\n"                   # line 7
    )
    (tmp_path / "services" / "runner" / "turn.py").write_text(
        "from . import commands\n"                         # its own: fine
        "import importlib\n"
        "make = importlib.import_module('services.gateway.whatsapp.linked')\n"  # line 3
        "import common.db\n"
    )
    (tmp_path / "common" / "cli" / "whatsapp_cmd.py").write_text(
        "def cmd_link(args):\n"
        "    from services.gateway.whatsapp import linking\n"  # line 2
        "from common.cli.context import Context\n"
    )
    (tmp_path / "schema" / "messages.py").write_text("from services.runner.commands import parse\n")
    assert sorted([
        "common/cli/whatsapp_cmd.py:2: imports services.gateway.whatsapp.linking",
        "schema/messages.py:1: imports services.runner.commands.parse",
        "services/runner/turn.py:3: imports services.gateway.whatsapp.linked",
        "services/sweeper/memory.py:3: imports services.runner.commands",
        "services/sweeper/memory.py:5: imports services.writer.main",
        "services/sweeper/memory.py:6: imports services.runner.turn.Turn",
        "services/sweeper/memory.py:7: imports services.control",
    ]) == sorted(wall_offences(tmp_path))
