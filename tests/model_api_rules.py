"""What OpenAI Chat Completions and Anthropic Messages refuse in a request, answered as they answer it.

The fake model servers (tests/fake_models.py) run every request through `openai_refusal` or
`anthropic_refusal`; a request one of them refuses gets the status, error type and message the real
service sends, so a provider that builds a request the real API would refuse fails in tests too.

The messages are the real ones, as the services return them and as they are quoted in public bug reports
(looked up, not guessed). Where no real text for a case was found, the text is marked "(fake's wording)"
next to its rule; the status and error type are the real service's for that class of mistake.

OpenAI (Chat Completions):
- `Authorization: Bearer` required (401); `model` and a non-empty `messages` list required.
- roles: system, developer, user, assistant, tool, function.
- `content` required (a string or a list of parts) on every message except an assistant message with
  `tool_calls`: null there and only there.
- `tool_calls`: each with an `id` (unique in the request), type "function", a name matching
  ``^[a-zA-Z0-9_-]+$`` of at most 64 characters, and `arguments` as a string (JSON text, not an object).
- `tool` messages: each answers an id of the `tool_calls` of the assistant message right before the run
  of tool messages it belongs to, each id exactly once; every id is answered before the next non-tool
  message (and before the end of the list).
- `tools`: a non-empty list of {type: function, function: {name, ...}} with the same name rules.
- `stream` a boolean; `stream_options` (an object; `include_usage` a boolean) only with `stream` true.
- content parts: a user message's list holds text, image_url, input_audio and file parts; system,
  developer and tool messages text parts only, assistant text and refusal; an image_url part anywhere but in
  a user message is refused. An image is a `data:` URL of image/png, image/jpeg, image/gif or image/webp,
  base64 that decodes to a PNG, JPEG, non-animated GIF or WebP picture, at most 20 MB; at most 500 images
  and 50 MB of images in one request. (`detail` is auto, low or high.)

Anthropic (Messages):
- `x-api-key` (401) and `anthropic-version` headers required; `model`, `max_tokens` and `messages` required.
- `stream`, when present, a boolean.
- `system` is top-level: a "system" role in `messages` is refused (as every model before Claude Opus 4.8
  does; the providers never send one). Any other role than user and assistant is refused.
- Consecutive messages of one role are combined into one turn (the API reference says so), and the
  rules below apply to the combined turns; the first turn must be the user's, and so must the last
  (current models refuse an assistant "prefill" at the end).
- Every message has non-empty content, except an optional final assistant message. A text block is
  never empty; a turn whose text blocks are all whitespace is refused (one whitespace block next to real
  text passes, as it does on the real API).
- Every `tool_use` (ids unique, matching ``^[a-zA-Z0-9_-]+$``) is answered by exactly one `tool_result`
  in the very next turn, which must be the user's and begin with those results; a `tool_result` whose
  id is not a `tool_use` of the turn right before is refused. A request holding tool blocks must
  define `tools`; tool names match ``^[a-zA-Z0-9_-]{1,64}$`` and are unique.
- `image` blocks (user turns only) with a base64 source: media_type image/jpeg, image/png, image/gif or
  image/webp; data valid base64 of at most 5 MB (5,242,880 characters of base64) whose picture is of that
  very type; at most 8000 px on either side, 2000 px when the request holds more than 20 images; at most
  100 images in a request; the whole request at most 32 MB (413).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.model_image_rules import ANTHROPIC_IMAGE_TYPES, anthropic_image_problem, openai_image_problem

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
OPENAI_NAME_MAX = 64
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
OPENAI_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer"
    " auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're"
    " accessing the API from your browser and are prompted for a username and password. You can obtain an API"
    " key from https://platform.openai.com/account/api-keys."
)
OPENAI_BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP"
    " library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you"
    " have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)"
)


OPENAI_PART_TYPES = {
    "user": ("text", "image_url", "input_audio", "file"), "system": ("text",), "developer": ("text",),
    "tool": ("text",), "assistant": ("text", "refusal"), "function": ("text",),
}
OPENAI_ALL_PARTS = ("text", "image_url", "input_audio", "refusal", "audio", "file")
@dataclass(frozen=True)
class Refusal:
    """One refused request: the HTTP status and the error as the service words it."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None  # OpenAI only
    code: str | None = None  # OpenAI only


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# --- OpenAI ----------------------------------------------------------------------------------------------


def _o(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> _Refused:
    return _Refused(Refusal(status, message, "invalid_request_error", param, code))


def _o_missing(path: str) -> _Refused:
    return _o(f"Missing required parameter: '{path}'.", path, "missing_required_parameter")


def _o_name(name: Any, path: str) -> None:
    if not isinstance(name, str):
        raise _o(f"Invalid type for '{path}': expected a string, but got {_a(name)} instead.", path, "invalid_type")
    if len(name) > OPENAI_NAME_MAX:
        raise _o(f"Invalid '{path}': string too long. Expected a string with maximum length {OPENAI_NAME_MAX},"
                 f" but got a string with length {len(name)} instead.", path, "string_above_max_length")
    if not OPENAI_NAME.match(name):
        raise _o(f"Invalid '{path}': string does not match pattern. Expected a string that matches the pattern"
                 f" '{OPENAI_NAME.pattern}'.", path, "invalid_value")


def _a(value: Any) -> str:
    kind = _json_type(value)
    return f"an {kind}" if kind[0] in "aeiou" else ("null" if kind == "null" else f"a {kind}")


def openai_refusal(body: Any, headers: dict[str, str], *, keyless: bool = False) -> Refusal | None:
    """Why OpenAI Chat Completions would refuse this request (headers lower-cased), or None."""
    try:
        _openai(body, headers, keyless)
    except _Refused as r:
        return r.refusal
    return None


def _openai(body: Any, headers: dict[str, str], keyless: bool) -> None:
    auth = headers.get("authorization", "")
    if not keyless and not (auth.startswith("Bearer ") and auth[7:].strip()):
        raise _o(OPENAI_NO_KEY, status=401)
    if not isinstance(body, dict):
        raise _o(OPENAI_BAD_JSON)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _o("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise _o_missing("messages")
    if not isinstance(messages, list):
        raise _o(f"Invalid type for 'messages': expected an array, but got {_a(messages)} instead.", "messages",
                 "invalid_type")
    if not messages:
        raise _o("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty"
                 " array instead.", "messages", "empty_array")
    call_ids: dict[str, int] = {}  # every tool call id in the request -> its message
    run_from: int | None = None  # the assistant message whose tool calls the current run answers
    open_ids: list[str] = []
    answered: dict[str, int] = {}
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _o(f"Invalid type for 'messages[{i}]': expected an object, but got {_a(m)} instead.",
                     f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role is None:
            raise _o_missing(f"messages[{i}].role")
        if role not in OPENAI_ROLES:
            roles = ", ".join(f"'{r}'" for r in OPENAI_ROLES[:-1]) + f", and '{OPENAI_ROLES[-1]}'"
            raise _o(f"Invalid value: '{role}'. Supported values are: {roles}.", f"messages[{i}].role",
                     "invalid_value")
        if role == "tool":
            _openai_tool_message(m, i, run_from, open_ids, answered)
            continue
        if run_from is not None:
            _openai_run_closed(run_from, open_ids, answered)
            run_from = None
        calls = m.get("tool_calls") if role == "assistant" else None
        _openai_content(m, i, role, has_calls=bool(calls))
        if calls is not None:
            open_ids = _openai_tool_calls(calls, i, call_ids)
            run_from, answered = i, {}
    if run_from is not None:
        _openai_run_closed(run_from, open_ids, answered)
    _openai_tools(body)
    _openai_stream(body)
    if (problem := openai_image_problem(messages)) is not None:
        raise _o(*problem)


def _openai_stream(body: dict) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _o(f"Invalid type for 'stream': expected a boolean, but got {_a(stream)} instead.", "stream",
                 "invalid_type")
    if "stream_options" not in body or body["stream_options"] is None:
        return
    if stream is not True:
        raise _o("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    options = body["stream_options"]
    if not isinstance(options, dict):
        raise _o(f"Invalid type for 'stream_options': expected an object, but got {_a(options)} instead.",
                 "stream_options", "invalid_type")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise _o(f"Invalid type for 'stream_options.include_usage': expected a boolean, but got {_a(usage)}"
                 " instead.", "stream_options.include_usage", "invalid_type")


def _openai_content(m: dict, i: int, role: str, has_calls: bool) -> None:
    if "content" not in m:
        if role == "assistant" and (has_calls or m.get("function_call")):
            return
        raise _o_missing(f"messages[{i}].content")
    content = m["content"]
    if content is None:
        if role == "assistant" and (has_calls or m.get("function_call")):
            return
        raise _o("Invalid value for 'content': expected a string, got null.", f"messages.[{i}].content")
    if not isinstance(content, (str, list)):
        raise _o(f"Invalid type for 'messages[{i}].content': expected one of a string or array of objects, but got"
                 f" {_a(content)} instead.", f"messages[{i}].content", "invalid_type")
    if isinstance(content, list):
        _openai_parts(content, i, role)


def _openai_parts(parts: list, i: int, role: str) -> None:
    for j, part in enumerate(parts):
        at = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict):
            raise _o(f"Invalid type for '{at}': expected an object, but got {_a(part)} instead.", at, "invalid_type")
        kind = part.get("type")
        if kind is None:
            raise _o_missing(f"{at}.type")
        if kind not in OPENAI_ALL_PARTS:
            kinds = ", ".join(f"'{k}'" for k in OPENAI_ALL_PARTS[:-1]) + f", and '{OPENAI_ALL_PARTS[-1]}'"
            raise _o(f"Invalid value: '{kind}'. Supported values are: {kinds}.", f"{at}.type", "invalid_value")
        if kind == "image_url" and role != "user":
            raise _o(f"Image URLs are only allowed for messages with role 'user', but this message with role '{role}'"
                     " contains an image URL.", f"messages.[{i}].content.[{j}].type", "invalid_value")
        if kind not in OPENAI_PART_TYPES.get(role, ("text",)):  # (fake's wording)
            raise _o(f"Invalid value: '{kind}'. Content parts of a '{role}' message may be: "
                     + ", ".join(f"'{k}'" for k in OPENAI_PART_TYPES.get(role, ("text",))) + ".", f"{at}.type",
                     "invalid_value")
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _o_missing(f"{at}.text") if "text" not in part else _o(
                f"Invalid type for '{at}.text': expected a string, but got {_a(part['text'])} instead.", f"{at}.text",
                "invalid_type")
        if kind == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict) or "url" not in image:
                raise _o_missing(f"{at}.image_url.url")
            if not isinstance(image["url"], str):
                raise _o(f"Invalid type for '{at}.image_url.url': expected a string, but got {_a(image['url'])}"
                         " instead.", f"{at}.image_url.url", "invalid_type")
            if image.get("detail", "auto") not in ("auto", "low", "high"):
                raise _o(f"Invalid value: '{image.get('detail')}'. Supported values are: 'auto', 'low', and 'high'.",
                         f"{at}.image_url.detail", "invalid_value")


def _openai_tool_calls(calls: Any, i: int, call_ids: dict[str, int]) -> list[str]:
    path = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise _o(f"Invalid type for '{path}': expected an array, but got {_a(calls)} instead.", path, "invalid_type")
    if not calls:
        raise _o(f"Invalid '{path}': empty array. Expected an array with minimum length 1, but got an empty array"
                 " instead.", path, "empty_array")
    ids = []
    for j, c in enumerate(calls):
        at = f"{path}[{j}]"
        if not isinstance(c, dict):
            raise _o(f"Invalid type for '{at}': expected an object, but got {_a(c)} instead.", at, "invalid_type")
        for key in ("id", "type", "function"):
            if key not in c:
                raise _o_missing(f"{at}.{key}")
        if c["type"] != "function":
            raise _o(f"Invalid value: '{c['type']}'. Supported values are: 'function'.", f"{at}.type", "invalid_value")
        fn = c["function"]
        if not isinstance(fn, dict):
            raise _o(f"Invalid type for '{at}.function': expected an object, but got {_a(fn)} instead.",
                     f"{at}.function", "invalid_type")
        for key in ("name", "arguments"):
            if key not in fn:
                raise _o_missing(f"{at}.function.{key}")
        _o_name(fn["name"], f"{at}.function.name")
        if not isinstance(fn["arguments"], str):
            raise _o(f"Invalid type for '{at}.function.arguments': expected a string, but got {_a(fn['arguments'])}"
                     " instead.", f"{at}.function.arguments", "invalid_type")
        call_id = c["id"]
        if not isinstance(call_id, str):
            raise _o(f"Invalid type for '{at}.id': expected a string, but got {_a(call_id)} instead.", f"{at}.id",
                     "invalid_type")
        if call_id in call_ids:  # (fake's wording), after the real duplicate tool_call_id message
            raise _o(f"Invalid parameter: Duplicate value for 'tool_calls.id' of '{call_id}', in"
                     f" messages[{call_ids[call_id]}] and messages[{i}].", f"{at}.id")
        call_ids[call_id] = i
        ids.append(call_id)
    return ids


def _openai_tool_message(m: dict, i: int, run_from: int | None, open_ids: list[str], answered: dict[str, int]) -> None:
    if run_from is None:
        raise _o("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with"
                 " 'tool_calls'.", f"messages.[{i}].role")
    if "tool_call_id" not in m:
        raise _o_missing(f"messages[{i}].tool_call_id")
    call_id = m["tool_call_id"]
    if call_id in answered:
        raise _o(f"Invalid parameter: Duplicate value for 'tool_call_id' of '{call_id}', in"
                 f" messages[{answered[call_id]}] and messages[{i}].", f"messages.[{i}].tool_call_id")
    if call_id not in open_ids:
        raise _o("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with"
                 " 'tool_calls'.", f"messages.[{i}].role")
    _openai_content(m, i, "tool", has_calls=False)
    answered[call_id] = i


def _openai_run_closed(run_from: int, open_ids: list[str], answered: dict[str, int]) -> None:
    missing = [c for c in open_ids if c not in answered]
    if missing:
        raise _o("An assistant message with 'tool_calls' must be followed by tool messages responding to each"
                 " 'tool_call_id'. The following tool_call_ids did not have response messages: "
                 + ", ".join(missing), f"messages.[{run_from}].role")


def _openai_tools(body: dict) -> None:
    if "tools" not in body:
        return
    tools = body["tools"]
    if not isinstance(tools, list):
        raise _o(f"Invalid type for 'tools': expected an array, but got {_a(tools)} instead.", "tools", "invalid_type")
    if not tools:
        raise _o("Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array"
                 " instead.", "tools", "empty_array")
    for j, t in enumerate(tools):
        at = f"tools[{j}]"
        if not isinstance(t, dict):
            raise _o(f"Invalid type for '{at}': expected an object, but got {_a(t)} instead.", at, "invalid_type")
        if t.get("type") != "function":
            raise _o(f"Invalid value: '{t.get('type')}'. Supported values are: 'function' and 'custom'.",
                     f"{at}.type", "invalid_value")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise _o_missing(f"{at}.function")
        if "name" not in fn:
            raise _o_missing(f"{at}.function.name")
        _o_name(fn["name"], f"{at}.function.name")


# --- Anthropic -------------------------------------------------------------------------------------------


def _x(message: str, status: int = 400, kind: str = "invalid_request_error") -> _Refused:
    return _Refused(Refusal(status, message, kind))


def anthropic_refusal(body: Any, headers: dict[str, str], *, keyless: bool = False) -> Refusal | None:
    """Why Anthropic Messages would refuse this request (headers lower-cased), or None."""
    try:
        _anthropic(body, headers, keyless)
    except _Refused as r:
        return r.refusal
    return None


def _anthropic(body: Any, headers: dict[str, str], keyless: bool) -> None:
    if not keyless and not headers.get("x-api-key", "").strip():
        raise _x("x-api-key header is required", 401, "authentication_error")
    if not headers.get("anthropic-version"):
        raise _x("anthropic-version: header is required")
    if not isinstance(body, dict):
        raise _x("There was an issue with the format or content of your request.")  # (fake's wording)
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise _x(f"{key}: Field required")
    if not isinstance(body["model"], str):
        raise _x("model: Input should be a valid string")
    if not isinstance(body["max_tokens"], int) or isinstance(body["max_tokens"], bool):
        raise _x("max_tokens: Input should be a valid integer")
    if body["max_tokens"] < 0:  # 0 only warms the prompt cache
        raise _x("max_tokens: Input should be greater than or equal to 0")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _x("stream: Input should be a valid boolean")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise _x("system: Input should be a valid string")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _x("messages: Input should be a valid list")
    turns = _anthropic_turns(messages)
    _anthropic_pairs(turns)
    _anthropic_tools(body, turns)
    images = [(i, j, b) for _role, placed in turns for i, j, b in placed
              if b["type"] == "image" and b["source"]["type"] == "base64"]
    if (problem := anthropic_image_problem(images)) is not None:
        raise _x(problem)


# A combined turn: its role, and its blocks with where each came from (message index, block index).
_Turn = tuple[str, list[tuple[int, int, dict]]]


def _anthropic_turns(messages: list) -> list[_Turn]:
    turns: list[_Turn] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _x(f"messages.{i}: Input should be a valid dictionary")
        role = m.get("role")
        if role == "system":
            raise _x('messages: Unexpected role "system". The Messages API accepts a top-level `system` parameter,'
                     ' not "system" as an input message role.')
        if role not in ("user", "assistant"):
            raise _x(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in m:
            raise _x(f"messages.{i}.content: Field required")
        content = m["content"]
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}] if content else []
        elif isinstance(content, list):
            blocks = content
        else:
            raise _x(f"messages.{i}.content: Input should be a valid list")
        if not blocks and not (role == "assistant" and i == len(messages) - 1):
            raise _x(f"messages.{i}: all messages must have non-empty content except for the optional final"
                     " assistant message")
        placed = [(i, j, _anthropic_block(b, i, j, role)) for j, b in enumerate(blocks)]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(placed)
        else:
            turns.append((role, placed))
    if not turns:
        raise _x("messages: at least one message is required")  # (fake's wording)
    if turns[0][0] != "user":
        raise _x('messages: first message must use the "user" role')
    if turns[-1][0] == "assistant":  # models since Claude 4.6 (Starling never prefills an answer)
        raise _x("This model does not support assistant message prefill. The conversation must end with a user"
                 " message.")
    for _role, placed in turns:
        texts = [b["text"] for _, _, b in placed if b["type"] == "text"]
        if texts and not any(t.strip() for t in texts):
            raise _x("messages: text content blocks must contain non-whitespace text")
    return turns


def _anthropic_block(b: Any, i: int, j: int, role: str) -> dict:
    at = f"messages.{i}.content.{j}"
    if not isinstance(b, dict) or not isinstance(b.get("type"), str):
        raise _x(f"{at}: Input should be a valid dictionary or object to extract fields from")
    kind = b["type"]
    allowed = ("text", "image", "document", "tool_result") if role == "user" else (
        "text", "tool_use", "thinking", "redacted_thinking")
    if kind not in allowed:  # (fake's wording)
        raise _x(f"{at}: `{kind}` blocks are not allowed in `{role}` messages")
    if kind == "text":
        _text_block(b, at)
    elif kind == "image":
        source = b.get("source")
        if not isinstance(source, dict) or source.get("type") not in ("base64", "url", "file"):
            raise _x(f"{at}.image.source: Input tag '{(source or {}).get('type') if isinstance(source, dict) else None}'"
                     " found using 'type' does not match any of the expected tags: 'base64', 'url', 'file'")
        if source["type"] == "base64":
            if source.get("media_type") not in ANTHROPIC_IMAGE_TYPES:
                raise _x(f"{at}.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png',"
                         " 'image/gif' or 'image/webp'")
            if not isinstance(source.get("data"), str):
                raise _x(f"{at}.image.source.base64.data: Field required")
    elif kind == "tool_use":
        if not isinstance(b.get("id"), str) or not ANTHROPIC_ID.match(b["id"]):
            raise _x(f"{at}.tool_use.id: String should match pattern '{ANTHROPIC_ID.pattern}'")
        if not isinstance(b.get("name"), str) or not ANTHROPIC_NAME.match(b["name"]):
            raise _x(f"{at}.tool_use.name: String should match pattern '{ANTHROPIC_NAME.pattern}'")
        if not isinstance(b.get("input"), dict):
            raise _x(f"{at}.tool_use.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if not isinstance(b.get("tool_use_id"), str):
            raise _x(f"{at}.tool_result.tool_use_id: Field required")
        inner = b.get("content")
        if isinstance(inner, list):
            for k, part in enumerate(inner):
                if isinstance(part, dict) and part.get("type") == "text":
                    _text_block(part, f"{at}.content.{k}")
        elif inner is not None and not isinstance(inner, str):
            raise _x(f"{at}.tool_result.content: Input should be a valid list")
    return b


def _text_block(b: dict, at: str) -> None:
    if not isinstance(b.get("text"), str):
        raise _x(f"{at}.text: Field required")
    if not b["text"]:
        raise _x("messages: text content blocks must be non-empty")


def _anthropic_pairs(turns: list[_Turn]) -> None:
    seen_uses: set[str] = set()
    pending: list[str] = []  # tool_use ids of the assistant turn right before
    pending_at = 0
    for role, placed in turns:
        if role == "assistant":
            if pending:
                _unanswered(pending_at, pending)
            pending = []
            for i, j, b in placed:
                if b["type"] == "tool_use":
                    if b["id"] in seen_uses:
                        raise _x(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
                    seen_uses.add(b["id"])
                    pending.append(b["id"])
                    pending_at = i
            continue
        answered: set[str] = set()
        for i, j, b in placed:
            if b["type"] != "tool_result":
                continue
            use_id = b["tool_use_id"]
            if use_id not in pending:
                raise _x(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {use_id}."
                         " Each `tool_result` block must have a corresponding `tool_use` block in the previous message.")
            if use_id in answered:
                raise _x(f"messages.{i}.content.{j}: each tool_use must have a single result. Found multiple"
                         f" `tool_result` blocks with id: {use_id}")
            answered.add(use_id)
        if pending:
            missing = [p for p in pending if p not in answered]
            if missing:
                _unanswered(pending_at, missing)
            head = placed[: len(pending)]
            if any(b["type"] != "tool_result" for _, _, b in head):
                raise _x(f"messages.{placed[0][0]}: Did not find {len(pending)} tool_result block(s) at the beginning"
                         " of this message. Messages following tool_use blocks must begin with a matching number of"
                         " tool_result blocks.")
        pending = []
    if pending:
        _unanswered(pending_at, pending)


def _unanswered(at: int, ids: list[str]) -> None:
    raise _x(f"messages.{at}: `tool_use` ids were found without `tool_result` blocks immediately after: "
             f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in the next"
             " message.")


def _anthropic_tools(body: dict, turns: list[_Turn]) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _x("tools: Input should be a valid list")
    uses_tools = any(b["type"] in ("tool_use", "tool_result") for _, placed in turns for _, _, b in placed)
    if uses_tools and not tools:
        raise _x("Requests which include `tool_use` or `tool_result` blocks must define tools.")
    names: set[str] = set()
    for j, t in enumerate(tools or []):
        if not isinstance(t, dict):
            raise _x(f"tools.{j}: Input should be a valid dictionary")
        name = t.get("name")
        if not isinstance(name, str):
            raise _x(f"tools.{j}.custom.name: Field required")
        if not ANTHROPIC_NAME.match(name):
            raise _x(f"tools.{j}.custom.name: String should match pattern '{ANTHROPIC_NAME.pattern}'")
        if not isinstance(t.get("input_schema"), dict):
            raise _x(f"tools.{j}.custom.input_schema: Field required")
        if name in names:
            raise _x("tools: Tool names must be unique.")
        names.add(name)
