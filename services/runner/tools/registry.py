"""The agent's tools by name: their specs for the model, argument checks, and the one place that runs them.

``execute`` never raises for a tool's failure: an unknown tool, bad arguments, a refusal or an exception
inside a tool all become a ToolResult the model can read (CancelledError still propagates). Results
are redacted (every registered secret value), error texts show the home's paths relative
(home_paths.py), and results are bounded (output.py) before the model sees them.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from common.redact import redact, redact_value, refresh
from services.runner.llm import ToolSpec
from services.runner.tools import cron, files, home_paths, jobs, memory, output, recall, send, shell, skills, web
from services.runner.tools import mcp
from services.runner.tools.base import Refused, Tool, ToolContext, ToolError, ToolResult

GROUPS = ("files", "shell", "memory", "recall", "send", "cron", "jobs", "web", "skills")

TOOLS: dict[str, Tool] = {
    tool.spec.name: tool
    for module in (files, shell, jobs, memory, recall, send, cron, web, skills)
    for tool in module.TOOLS
}


def specs_for(enabled_groups: Iterable[str], cfg=None) -> list[ToolSpec]:
    """The specs of every tool whose group is enabled, in registry order (unknown group names are ignored);
    with ``cfg``, only the tools it offers (web_search needs a provider)."""
    enabled = set(enabled_groups)
    return [tool.spec for tool in TOOLS.values()
            if tool.group in enabled and (cfg is None or tool.offered is None or tool.offered(cfg))]


# ---------------------------------------------------------------- arguments

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
               "array": "a list", "object": "an object"}


def _coerce(kind: str, value: Any) -> tuple[bool, Any]:
    """(ok, value) for one JSON Schema type; numbers and booleans sent as strings are accepted."""
    if kind == "string":
        return isinstance(value, str), value
    if kind == "boolean":
        if isinstance(value, bool):
            return True, value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return True, value.lower() == "true"
        return False, value
    if kind == "integer":
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return True, int(value.strip())
        return False, value
    if kind == "number":
        if isinstance(value, bool):
            return False, value
        if isinstance(value, (int, float)):
            return True, value
        try:
            return True, float(value) if isinstance(value, str) else value
        except ValueError:
            return False, value
    if kind == "array":
        return isinstance(value, list), value
    if kind == "object":
        return isinstance(value, dict), value
    return True, value


def _expected(spec: ToolSpec) -> str:
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    shown = [f"{k} ({p.get('type', 'any')}{', required' if k in required else ''})" for k, p in props.items()]
    return f"{spec.name} takes: " + (", ".join(shown) or "no arguments")


def validate(spec: ToolSpec, args: Any) -> tuple[dict[str, Any], str]:
    """(checked arguments, "") or ({}, a message for the model). Checks required keys, types, enum,
    minimum/maximum, and unknown keys when ``additionalProperties`` is false; ``null`` = absent."""
    if not isinstance(args, dict):
        return {}, f"{spec.name}: the arguments must be a JSON object. {_expected(spec)}"
    if "_raw" in args and "_raw" not in spec.parameters.get("properties", {}):
        return {}, f"{spec.name}: the arguments were not valid JSON. {_expected(spec)}"
    schema = spec.parameters
    props: dict[str, dict] = schema.get("properties", {})
    checked: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        prop = props.get(key)
        if prop is None:
            if schema.get("additionalProperties", True) is False:
                problems.append(f"unknown argument {key!r}")
            continue
        kind = prop.get("type")
        ok, value = _coerce(kind, value) if kind else (True, value)
        if not ok:
            problems.append(f"{key!r} must be {_TYPE_NAMES.get(kind, kind)}")
            continue
        if "enum" in prop and value not in prop["enum"]:
            problems.append(f"{key!r} must be one of {', '.join(map(str, prop['enum']))}")
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in prop and value < prop["minimum"]:
                problems.append(f"{key!r} must be at least {prop['minimum']}")
                continue
            if "maximum" in prop and value > prop["maximum"]:
                problems.append(f"{key!r} must be at most {prop['maximum']}")
                continue
        checked[key] = value
    for key in schema.get("required", []):
        if key not in checked and not any(p.startswith(repr(key)) for p in problems):
            problems.append(f"missing required argument {key!r}")
    if problems:
        return {}, f"{spec.name}: " + "; ".join(problems) + f". {_expected(spec)}"
    return checked, ""


# ---------------------------------------------------------------- running


async def execute(ctx: ToolContext, name: str, args: Any, enabled_groups: Iterable[str] | None = None) -> ToolResult:
    """Run one tool call for the model. ``enabled_groups`` (optional) refuses tools the agent lacks."""
    tool = TOOLS.get(name)
    if tool is None:
        tool = mcp.tool_for(ctx, name, args)  # <server>__<tool> of one of the agent's MCP servers
    if tool is None or (enabled_groups is not None and tool.group not in set(enabled_groups) and tool.group != "mcp"):
        names = ", ".join(t for t, tl in TOOLS.items() if enabled_groups is None or tl.group in set(enabled_groups))
        return ToolResult(f"unknown tool {name!r}; the tools are: {names}", outcome="error")
    checked, problem = validate(tool.spec, args)
    if problem:
        return ToolResult(redact(problem), outcome="error")
    try:
        result = await tool.run(ctx, checked)
    except Refused as e:
        result = ToolResult(f"Refused: {e}", outcome="refused")
    except ToolError as e:
        result = ToolResult(str(e), outcome="error")
    except Exception as e:  # a bug or an unexpected OS failure: the model hears of it, the turn goes on
        ctx.log.warning("tool_failed", tool=name, error=redact(f"{type(e).__name__}: {e}"))
        result = ToolResult(f"{name} failed: {type(e).__name__}: {e}", outcome="error")
    refresh()  # a secret stored while the tool ran is redacted from this very result
    result.content = redact(result.content)
    result.approval_reason = redact(result.approval_reason)
    if result.outcome != "ok":  # error texts name no absolute path of the home (a command's output is its own)
        result.content = home_paths.relative(ctx, result.content)
    try:
        result.content, result.result_path = output.bound(ctx, name, result.content, tool.inline_limit)
    except OSError as e:  # the disk is full or the folder unusable: keep the head, say what happened
        keep = result.content.encode("utf-8")[: output.HEAD_BYTES * 4].decode("utf-8", "ignore")
        result.content = f"{keep}\n[result truncated: it could not be saved ({e.strerror or e})]"
    return result


async def mcp_specs(ctx: ToolContext) -> tuple[list[ToolSpec], list[str]]:
    """The agent's MCP tools (``ctx.mcp``), starting their servers on first use, and a line for each server
    that is unavailable (mcp.py)."""
    return await mcp.specs(ctx)


def redact_arguments(args: Any) -> str:
    """The call's arguments as JSON for the audit and approvals, every registered secret value replaced."""
    return redact(json.dumps(redact_value(args), ensure_ascii=False, default=str))
