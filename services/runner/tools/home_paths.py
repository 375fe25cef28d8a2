"""Absolute paths of the home in texts for the model, rewritten as the names the model knows.

A tool's error (an OSError's message, a traceback, a failed command's stderr) can quote where the
home lives on disk, which tells the model the layout to aim at. registry.execute passes every result
that is not "ok" through ``relative``, which replaces every such prefix, the configured path and its
real path alike, longest first:

    <workspace>/private/<this agent>  ->  private        (the file tools' names)
    <workspace>/shared                ->  shared
    <data>/tool-output/<this session> ->  tool-output
    <workspace>/private               ->  workspace/private   (another agent's, by name only)
    <data>, <agents>, <workspace>     ->  data, agents, workspace
    <home>                            ->  home
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from services.runner.tools.base import ToolContext

_MIN_PREFIX = 2  # never rewrite "/" itself
# a prefix counts only where a path component ends: "/srv/home" is not the prefix of "/srv/homework"
_END = r"(?![^/\s'\"`:;,)\]}>|])"


def _names(ctx: ToolContext) -> list[tuple[Path, str]]:
    paths = ctx.paths
    names = [
        (paths.shared_workspace, "shared"),
        (paths.private_root, "workspace/private"),
        (paths.tool_output_dir, "data/tool-output"),
        (paths.data_dir, "data"),
        (paths.agents_dir, "agents"),
        (paths.workspace_dir, "workspace"),
        (paths.home, "home"),
    ]
    try:
        names.append((paths.private_workspace(ctx.agent), "private"))
    except ValueError:  # not a valid agent id: it has no private folder to name
        pass
    if ctx.session_id:
        names.append((paths.tool_output_dir / str(ctx.session_id), "tool-output"))
    return names


def _pattern(ctx: ToolContext) -> tuple[re.Pattern[str] | None, dict[str, str]]:
    by_prefix: dict[str, str] = {}
    for path, name in _names(ctx):
        for form in (str(Path(path).absolute()), os.path.realpath(path)):
            form = form.rstrip("/")
            if len(form) >= _MIN_PREFIX:
                by_prefix.setdefault(form, name)
    if not by_prefix:
        return None, by_prefix
    ordered = sorted(by_prefix, key=len, reverse=True)  # the most specific prefix wins
    return re.compile("(" + "|".join(re.escape(p) for p in ordered) + ")" + _END), by_prefix


def relative(ctx: ToolContext, text: str) -> str:
    """``text`` with every absolute path of the home shown by the name the model uses for it."""
    if not text or "/" not in text:
        return text
    pattern, by_prefix = _pattern(ctx)
    if pattern is None:
        return text
    return pattern.sub(lambda m: by_prefix[m.group(1)], text)
