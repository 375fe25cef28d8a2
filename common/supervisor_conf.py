"""The supervisord.conf of one home, rendered into data/run/ from the one template (the repository's
top-level supervisord.conf, shipped in the package as common/supervisord.conf).

What the config decides is written out: one program per runner (runner-0, runner-1, ...) and one per
gateway process (common/programs.py), so a changed config is a changed file that supervisord's
``reloadConfig`` compares program by program, and every program is its own group (``runner-1``, not
``runner:runner-1``). The home's paths are written out too, so ``supervisorctl -c`` on the rendered
file works by hand. What is fixed for supervisord's lifetime stays a variable of its environment
(STARLING_PYTHON, STARLING_LOG_MAXBYTES, STARLING_LOG_BACKUPS), so a reload run from another shell
changes no program by accident.
"""

from __future__ import annotations

import re
from pathlib import Path

from common.config import Config
from common.errors import StarlingError
from common.home import Paths, write_private_file
from common.programs import PLATFORMS, gateway_programs, runner_names

TEMPLATE = Path(__file__).resolve().parent / "supervisord.conf"
RUNTIME_VARIABLES = ("STARLING_PYTHON", "STARLING_LOG_MAXBYTES", "STARLING_LOG_BACKUPS")
_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")
_VARIABLE = re.compile(r"%\(ENV_([A-Z_]+)\)s")


def conf_file(paths: Paths) -> Path:
    return paths.run_dir / "supervisord.conf"


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """The template's sections in order, each with its setting lines (comments and blank lines dropped)."""
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith((";", "#")):
            continue
        match = _SECTION.match(stripped)
        if match:
            sections.append((match[1], []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def _with(lines: list[str], drop: tuple[str, ...] = (), command_suffix: str = "",
          replace: dict[str, str] | None = None) -> list[str]:
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip()
        if key in drop:
            continue
        for old, new in (replace or {}).items():
            line = line.replace(old, new)
        if key == "command" and command_suffix:
            line += command_suffix
        out.append(line)
    return out


def render(paths: Paths, cfg: Config, template: Path = TEMPLATE) -> str:
    """The rendered file's text: the template with its runner and gateway programs written out."""
    try:
        sections = _sections(template.read_text())
    except OSError as exc:
        raise StarlingError(f"cannot read supervisord's template {template}: {exc.strerror}") from None
    gateways = gateway_programs(cfg)
    out: list[tuple[str, list[str]]] = []
    for name, lines in sections:
        if name == "program:runner":
            for number, runner in enumerate(runner_names(cfg)):
                out.append((f"program:{runner}", _with(lines, drop=("process_name", "numprocs"),
                                                       replace={"%(process_num)d": str(number)})))
        elif name.startswith("program:gateway-") and name.removeprefix("program:gateway-") in PLATFORMS:
            platform = name.removeprefix("program:gateway-")
            for program in (g for g in gateways if g.platform == platform):
                suffix = f" --process {program.process}" if program.process else ""
                out.append((f"program:{program.name}", _with(lines, drop=("autostart",), command_suffix=suffix)))
        else:
            out.append((name, lines))
    literal = {"STARLING_HOME": str(paths.home), "STARLING_DATA": str(paths.data_dir)}

    def substitute(match: re.Match) -> str:
        variable = match[1]
        if variable in literal:
            return literal[variable].replace("%", "%%")
        if variable in RUNTIME_VARIABLES:
            return match[0]
        raise StarlingError(f"{template}: unknown variable %(ENV_{variable})s")

    body = "\n\n".join(f"[{name}]\n" + "\n".join(lines) for name, lines in out)
    header = (f"; Rendered by `starling up` and `starling reload` from {template} for the home {paths.home}.\n"
              "; Do not edit: the next `starling reload` writes it again from config.toml.\n\n")
    return header + _VARIABLE.sub(substitute, body) + "\n"


def write(paths: Paths, cfg: Config) -> Path:
    """Render the home's file (0600) and return its path."""
    path = conf_file(paths)
    write_private_file(path, render(paths, cfg).encode())
    return path
