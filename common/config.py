"""config.toml: its typed shape, its defaults, its validation, and errors that name file and key.

Paths in the file (data_dir, agents_dir, workspace_dir, session_memory.active_dir) stay the strings
the operator wrote; `common.home.paths_for` resolves them against the config file's folder.
"""

from __future__ import annotations

import ipaddress
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta, field

from common.errors import ConfigError

ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
SECRET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

Ident = Annotated[str, Meta(pattern=ID_PATTERN)]
SecretName = Annotated[str, Meta(pattern=SECRET_NAME_PATTERN)]
Positive = Annotated[int, Meta(gt=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]  # sizes in MB may be fractions (tests use tiny ones)
Days = Annotated[int, Meta(ge=1)]

_ENDPOINT_SCHEMES = ("ipc://", "tcp://")


class _FieldError(ValueError):
    """Raised from __post_init__ so the error names the offending key, not just its section."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field_name = field_name
        self.reason = reason
        super().__init__(f"{field_name}: {reason}")


def _check_listen(field_name: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _FieldError(field_name, f"expected host:port, e.g. 127.0.0.1:7820, got {value!r}")


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Base of config structs: forbid_unknown_fields and frozen are inherited; kw_only is not."""


def is_loopback(listen: str) -> bool:
    """Whether a host:port listens on this host only: localhost, 127.0.0.0/8 or ::1 (not 0.0.0.0, not a name)."""
    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Control(_Section, kw_only=True):
    listen: str = "127.0.0.1:7820"
    allow_remote: bool = False  # listen on a non-loopback address, on purpose
    public_url: str = ""  # the dashboard's URL behind the operator's TLS proxy (https: secure cookies, links)
    dashboard: bool = True  # the dashboard at / (accounts: `starling dashboard user add`)

    def __post_init__(self) -> None:
        _check_listen("listen", self.listen)
        if self.public_url and not re.match(r"^https?://[^\s/?#]+(/[^\s?#]*)?$", self.public_url):
            raise _FieldError("public_url", f"expected an http(s) URL such as https://starling.example.org,"
                              f" got {self.public_url!r}")
        if not self.allow_remote and not is_loopback(self.listen):
            raise _FieldError("listen", f"{self.listen!r} is not a loopback address, so the control API and"
                              " /health would be reachable from the network; listen on 127.0.0.1:PORT (put a"
                              " TLS proxy in front for remote use), or set [control] allow_remote = true to"
                              " mean it")


class Runner(_Section, kw_only=True):
    processes: Annotated[int, Meta(ge=1, le=64)] = 2
    turns_per_process: Annotated[int, Meta(ge=1, le=256)] = 8
    lease_s: Annotated[float, Meta(ge=1, le=3600)] = 60.0


class Conversation(_Section, kw_only=True):
    max_conversation_turns: Positive = 200
    max_context_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.8
    # a burst of messages: collect answers those waiting together, followup one turn each, interrupt
    # restarts the model call (never a tool) with the newcomers (services/runner/turn.py)
    queue: Literal["collect", "followup", "interrupt"] = "collect"


_PROVIDER_DEFAULT_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


class Provider(_Section, kw_only=True):
    """A model endpoint. base_url and api_key default by kind; api_key is a secret's name."""

    kind: Literal["openai", "anthropic"] = "openai"
    base_url: str = ""
    api_key: Annotated[str, Meta(pattern=r"^$|" + SECRET_NAME_PATTERN)] = ""
    model: Annotated[str, Meta(min_length=1)]
    context_window: Positive = 128000
    vision: bool = False  # the model takes images: inbound photos reach it as image parts (services/runner/media.py)
    max_images: Annotated[int, Meta(ge=0, le=20)] = 4  # images shown in one model request, newest first

    def __post_init__(self) -> None:
        if not self.base_url:
            msgspec.structs.force_setattr(self, "base_url", _PROVIDER_DEFAULT_URL[self.kind])
        if not self.api_key:
            msgspec.structs.force_setattr(self, "api_key", self.kind)


def _default_providers() -> dict[str, Provider]:
    return {"default": Provider(model="gpt-4o-mini")}


class _Gateway(_Section, kw_only=True):
    id: Ident
    agent: Ident = "default"
    allow: list[str | int] = []  # normalised to list[str]: TOML users write Telegram ids as ints
    listen: str  # each platform sets its own default port
    groups: Literal["mention", "all"] = "mention"  # in an allowed group: answer only when addressed, or always
    max_attachment_mb: Annotated[float, Meta(gt=0, le=2000)] = 20.0  # larger inbound files are not fetched
    # "" : served by the platform's program (gateway-<platform>); a name: by gateway-<platform>-<name>
    process: Annotated[str, Meta(pattern=r"^$|" + ID_PATTERN)] = ""

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "allow", [str(x) for x in self.allow])
        _check_listen("listen", self.listen)


class Telegram(_Gateway, kw_only=True):
    token: SecretName = "telegram-main"
    mode: Literal["polling", "webhook"] = "polling"
    api_base: str = "https://api.telegram.org"
    listen: str = "127.0.0.1:7830"
    public_url: str = ""
    secret_token: SecretName = "telegram-main-webhook"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "webhook" and not self.public_url:
            raise _FieldError("public_url", "required when mode = \"webhook\"")


class Slack(_Gateway, kw_only=True):
    mode: Literal["socket", "events"] = "socket"
    bot_token: SecretName = "slack-bot"
    app_token: SecretName = "slack-app"
    signing_secret: SecretName = "slack-signing"
    api_base: str = "https://slack.com/api"
    listen: str = "127.0.0.1:7831"
    ping_interval_s: Annotated[float, Meta(ge=0.2, le=300)] = 10.0  # socket mode: no pong in half of it: reconnect


class WhatsApp(_Gateway, kw_only=True):
    mode: Literal["cloud", "linked"] = "cloud"
    phone_number_id: str = ""
    access_token: SecretName = "whatsapp-token"
    app_secret: SecretName = "whatsapp-app-secret"
    verify_token: SecretName = "whatsapp-verify"
    api_base: str = "https://graph.facebook.com/v21.0"
    listen: str = "127.0.0.1:7832"
    template: str = ""  # an approved template sent when a reply falls outside the 24-hour window ("" = none)
    template_language: str = "en_US"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "cloud" and not self.phone_number_id:
            raise _FieldError("phone_number_id", "required when mode = \"cloud\"")


class Gateways(_Section, kw_only=True):
    # an outbox row's claim by a gateway process; renewed while it sends, taken again after a crash
    outbox_lease_s: Annotated[float, Meta(ge=1, le=3600)] = 60.0
    telegram: list[Telegram] = []
    slack: list[Slack] = []
    whatsapp: list[WhatsApp] = []

    def __post_init__(self) -> None:
        # ids are unique across platforms: "instance:chat" (cron --deliver-to, alert_to) names one
        seen: dict[str, str] = {"cli": "the terminal (`starling chat`)"}
        for platform in ("telegram", "slack", "whatsapp"):
            for i, gw in enumerate(getattr(self, platform)):
                if gw.id in seen:
                    raise _FieldError(f"{platform}[{i}].id", f"gateway id {gw.id!r} is already used by {seen[gw.id]}")
                seen[gw.id] = f"gateways.{platform}[{i}]"

    def all(self) -> list[Telegram | Slack | WhatsApp]:
        return [*self.telegram, *self.slack, *self.whatsapp]


class Shell(_Section, kw_only=True):
    """Limits of every confined command (shell, background jobs, MCP stdio servers), as rlimits."""

    cpu_s: Annotated[int, Meta(ge=1)] = 600
    job_cpu_s: Annotated[int, Meta(ge=1)] = 6 * 3600
    memory_mb: Annotated[int, Meta(ge=64)] = 4096
    file_mb: Annotated[int, Meta(ge=1)] = 1024
    open_files: Annotated[int, Meta(ge=16)] = 1024
    processes: Annotated[int, Meta(ge=8)] = 512
    read_paths: list[str] = field(default_factory=list)  # more folders commands may read (absolute)

    def __post_init__(self) -> None:
        for path in self.read_paths:
            if not path.startswith("/"):
                raise _FieldError("read_paths", f"expected absolute paths, got {path!r}")


class Tools(_Section, kw_only=True):
    sandbox: Literal["auto", "none"] = "auto"
    shell: Shell = field(default_factory=Shell)


ApprovalMode = Literal["ask", "auto", "deny"]
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,100}$"


class McpServer(_Section, kw_only=True):
    """[mcp.<name>]: one MCP server, stdio (``command``, ``args``, ``env``) or Streamable HTTP (``url``,
    ``headers``). ``env`` and ``headers`` map a variable or header to a secret's *name*."""

    command: str = ""
    args: list[str] = []
    env: dict[Annotated[str, Meta(pattern=ENV_NAME_PATTERN)], SecretName] = {}
    url: str = ""
    headers: dict[Annotated[str, Meta(pattern=HEADER_NAME_PATTERN)], SecretName] = {}
    approval: ApprovalMode = "ask"  # for every tool of the server
    tools: dict[str, ApprovalMode] = {}  # per-tool overrides, by the server's tool name
    trust_hints: bool = False  # a tool's readOnlyHint makes it free (approval "ask" only)
    timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 60.0  # one tool call
    start_timeout_s: Annotated[float, Meta(gt=0, le=600)] = 30.0  # starting and the handshake
    network: bool = False  # a stdio server may use the network (the operator's decision)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise _FieldError("command", "set either command (a stdio server) or url (Streamable HTTP), not both")
        if self.url:
            if urlsplit(self.url).scheme not in ("http", "https") or not urlsplit(self.url).hostname:
                raise _FieldError("url", f"expected an http:// or https:// URL, got {self.url!r}")
            for key, present in (("args", self.args), ("env", self.env), ("network", self.network)):
                if present:
                    raise _FieldError(key, "only for a stdio server (command); this one has a url")
        elif self.headers:
            raise _FieldError("headers", "only for a Streamable HTTP server (url); this one has a command")

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def approval_for(self, tool: str) -> str:
        return self.tools.get(tool, self.approval)


class Transcription(_Section, kw_only=True):
    """Voice notes to text through an OpenAI-compatible ``POST {base_url}/audio/transcriptions``."""

    provider: Annotated[str, Meta(pattern=r"^$|" + ID_PATTERN)] = ""  # a [providers.<name>]: base_url, api_key
    model: Annotated[str, Meta(min_length=1)] = "whisper-1"
    language: Annotated[str, Meta(pattern=r"^$|^[a-z]{2}$")] = ""  # ISO-639-1; "": the service detects it
    timeout_s: Annotated[float, Meta(gt=0, le=900)] = 120.0
    max_mb: Annotated[float, Meta(gt=0, le=25)] = 25.0  # the API's own limit is 25 MB


_SEARCH_DEFAULT_URL = {"brave": "https://api.search.brave.com/res/v1", "tavily": "https://api.tavily.com"}


class Web(_Section, kw_only=True):
    """The web tools: web_fetch's limits and reach, and web_search's provider."""

    search: Literal["", "searxng", "brave", "tavily"] = ""  # "": no web_search tool
    base_url: str = ""  # the search API; brave and tavily default to their public URLs, searxng needs one
    api_key: Annotated[str, Meta(pattern=r"^$|" + SECRET_NAME_PATTERN)] = ""  # a secret's name (brave, tavily)
    max_kb: Annotated[int, Meta(ge=1, le=65536)] = 2048  # bytes of a page web_fetch reads
    timeout_s: Annotated[float, Meta(gt=0, le=300)] = 20.0  # one web_fetch, every redirect included
    max_redirects: Annotated[int, Meta(ge=0, le=20)] = 5
    allow_networks: list[str] = []  # CIDRs web_fetch may reach although private, loopback or link-local

    def __post_init__(self) -> None:
        if not self.base_url and self.search in _SEARCH_DEFAULT_URL:
            msgspec.structs.force_setattr(self, "base_url", _SEARCH_DEFAULT_URL[self.search])
        if self.search == "searxng" and not self.base_url:
            raise _FieldError("base_url", "required when search = \"searxng\": your instance, e.g."
                              " http://127.0.0.1:8888")
        if self.search in ("brave", "tavily") and not self.api_key:
            raise _FieldError("api_key", f"required when search = \"{self.search}\": a secret's name")
        for net in self.allow_networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise _FieldError("allow_networks",
                                  f"expected CIDR networks such as 127.0.0.0/8, got {net!r}") from None


class Scheduler(_Section, kw_only=True):
    poll_interval_s: Annotated[float, Meta(gt=0)] = 30.0
    max_consecutive_failures: Annotated[int, Meta(ge=0, le=1000)] = 3  # then the job is disabled; 0: never


class Retention(_Section, kw_only=True):
    session_days: Days = 30
    audit_days: Days = 30
    job_log_days: Days = 14
    tool_output_days: Days = 2
    scratchpad_days: Days = 3


class Reset(_Section, kw_only=True):
    mode: Literal["none", "daily", "idle"] = "none"
    boundary_hour: Annotated[int, Meta(ge=0, le=23)] = 4
    idle_minutes: Positive = 120


class SessionMemory(_Section, kw_only=True):
    active_dir: str = ""
    retention_days: Days = 3
    reset: Reset = field(default_factory=Reset)

    @property
    def enabled(self) -> bool:
        return bool(self.active_dir)


class Health(_Section, kw_only=True):
    heartbeat_interval_ms: Positive = 60000
    disk_warn_threshold_mb: PositiveFloat = 1024
    wal_warn_threshold_mb: PositiveFloat = 100
    alert_to: str = ""


class Backup(_Section, kw_only=True):
    keep: Annotated[int, Meta(ge=0, le=10000)] = 7  # archives kept in a backup folder by `backup create`; 0: all


class Writer(_Section, kw_only=True):
    batch_max: Annotated[int, Meta(ge=1, le=100000)] = 512
    checkpoint_interval_s: Annotated[float, Meta(gt=0)] = 2.0
    wal_truncate_mb: PositiveFloat = 64
    busy_timeout_ms: Positive = 5000
    reserve_mb: Annotated[float, Meta(ge=0, le=4096)] = 16.0  # the disk reserve (services/writer/disk.py); 0: none


class Bus(_Section, kw_only=True):
    writer_endpoint: str = ""
    events_endpoint: str = ""
    request_timeout_ms: Positive = 2000
    window: Positive = 256
    heartbeat_ivl_ms: Positive = 1000

    def __post_init__(self) -> None:
        for name in ("writer_endpoint", "events_endpoint"):
            value = getattr(self, name)
            if value and not value.startswith(_ENDPOINT_SCHEMES):
                raise _FieldError(name, f"expected \"\" or an ipc:// or tcp:// endpoint, got {value!r}")


class Config(_Section, kw_only=True):
    data_dir: Annotated[str, Meta(min_length=1)] = "data"
    agents_dir: Annotated[str, Meta(min_length=1)] = "agents"
    workspace_dir: Annotated[str, Meta(min_length=1)] = "workspace"
    control: Control = field(default_factory=Control)
    runner: Runner = field(default_factory=Runner)
    conversation: Conversation = field(default_factory=Conversation)
    providers: dict[Ident, Provider] = field(default_factory=_default_providers)
    gateways: Gateways = field(default_factory=Gateways)
    tools: Tools = field(default_factory=Tools)
    transcription: Transcription = field(default_factory=Transcription)
    web: Web = field(default_factory=Web)
    scheduler: Scheduler = field(default_factory=Scheduler)
    retention: Retention = field(default_factory=Retention)
    session_memory: SessionMemory = field(default_factory=SessionMemory)
    health: Health = field(default_factory=Health)
    backup: Backup = field(default_factory=Backup)
    writer: Writer = field(default_factory=Writer)
    bus: Bus = field(default_factory=Bus)
    mcp: dict[Ident, McpServer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.transcription.provider
        if name and name not in self.providers:
            raise _FieldError("transcription.provider",
                              f"no [providers.{name}]; expected one of: {', '.join(self.providers)}")
        if name and self.providers[name].kind != "openai":
            raise _FieldError("transcription.provider", f"[providers.{name}] is kind {self.providers[name].kind!r};"
                              " transcription needs an OpenAI-compatible one (kind = \"openai\")")
        if self.health.alert_to:
            instance, sep, chat = self.health.alert_to.partition(":")
            if not sep or not chat:
                raise _FieldError("health.alert_to", "expected \"instance:chat\"")
            if instance not in {gw.id for gw in self.gateways.all()}:
                raise _FieldError("health.alert_to", f"no gateway with id {instance!r}")


def referenced_secrets(cfg: Config) -> dict[str, str]:
    """Every secret name the config refers to, mapped to the first dotted key that names it."""
    found: dict[str, str] = {}
    for name, provider in cfg.providers.items():
        found.setdefault(provider.api_key, f"providers.{name}.api_key")
    secret_fields = {
        "telegram": ("token", "secret_token"),
        "slack": ("bot_token", "app_token", "signing_secret"),
        "whatsapp": ("access_token", "app_secret", "verify_token"),
    }
    for platform, names in secret_fields.items():
        for i, gw in enumerate(getattr(cfg.gateways, platform)):
            for attr in names:
                found.setdefault(getattr(gw, attr), f"gateways.{platform}[{i}].{attr}")
    _mcp_secrets(cfg, found)
    if cfg.web.api_key:
        found.setdefault(cfg.web.api_key, "web.api_key")
    return found


_SECRETS_BY_MODE = {  # which secrets each gateway mode reads at start; the others are never resolved
    ("telegram", "polling"): ("token",),
    ("telegram", "webhook"): ("token", "secret_token"),
    ("slack", "socket"): ("bot_token", "app_token"),
    ("slack", "events"): ("bot_token", "signing_secret"),
    ("whatsapp", "cloud"): ("access_token", "app_secret", "verify_token"),
    ("whatsapp", "linked"): (),
}
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def is_local_url(url: str) -> bool:
    """Whether a base_url points at this machine (localhost, 127.0.0.1, ::1): such a model server may need no key."""
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


def required_secrets(cfg: Config) -> dict[str, str]:
    """The secret names that must resolve for this config to run, mapped to the first key naming each: a
    gateway's secrets for its mode only (a polling bot needs no webhook secret), and no provider key for a
    model server on this machine (providers send no auth header then). `referenced_secrets` keeps them all."""
    found: dict[str, str] = {}
    for name, provider in cfg.providers.items():
        if not is_local_url(provider.base_url):
            found.setdefault(provider.api_key, f"providers.{name}.api_key")
    for platform in ("telegram", "slack", "whatsapp"):
        for i, gw in enumerate(getattr(cfg.gateways, platform)):
            for attr in _SECRETS_BY_MODE[(platform, gw.mode)]:
                found.setdefault(getattr(gw, attr), f"gateways.{platform}[{i}].{attr}")
    _mcp_secrets(cfg, found)
    if cfg.web.search and cfg.web.api_key:
        found.setdefault(cfg.web.api_key, "web.api_key")
    return found


def _mcp_secrets(cfg: Config, found: dict[str, str]) -> None:
    """Each MCP server's env and header values are secret names, read when the server starts."""
    for name, server in cfg.mcp.items():
        for kind, table in (("env", server.env), ("headers", server.headers)):
            for key, secret in table.items():
                found.setdefault(secret, f"mcp.{name}.{kind}.{key}")


# --- loading ---------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<in_key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_DICT_KEY = object()  # stands for msgspec's `[...]`, a dict key it does not print
_PATTERN_HELP = {
    ID_PATTERN: "an id: 1-32 characters of a-z 0-9 _ -, starting with a letter or digit",
    SECRET_NAME_PATTERN: "a secret's name (1-64 characters of A-Z a-z 0-9 _ . -), not its value",
}


def load_config(path: Path) -> Config:
    """Read and validate config.toml; every failure is a ConfigError naming file, key and reason."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, "-", "file not found; run `starling init`") from None
    except OSError as e:
        raise ConfigError(path, "-", f"cannot read: {e.strerror}") from None
    try:
        cfg = msgspec.toml.decode(data, type=Config)
    except msgspec.ValidationError as e:
        key, reason = _explain(e, msgspec.toml.decode(data))
        raise ConfigError(path, key, reason) from None
    except msgspec.DecodeError as e:
        raise ConfigError(path, "-", f"invalid TOML: {e}") from None
    for name, key in referenced_secrets(cfg).items():
        if looks_like_a_value(name):  # never echoed: it may be the secret itself
            raise ConfigError(path, key, "this looks like a secret's value, not its name: put a name here"
                              " (e.g. \"openai\") and store the value with `starling secret set NAME --value-stdin`")
    return cfg


_VALUE_PREFIXES = ("sk-", "sk_", "xoxb-", "xoxp-", "xoxa-", "xapp-", "eaa", "aiza", "ghp_", "gho_", "glpat-")


def looks_like_a_value(name: str) -> bool:
    """A pasted API key rather than a name: a known token prefix, or a long unbroken run of letters and digits."""
    lowered = name.lower()
    if lowered.startswith(_VALUE_PREFIXES):
        return True
    longest = max((len(part) for part in re.split(r"[-_.]", name)), default=0)
    return longest >= 24 and any(c.isdigit() for c in name) and any(c.isalpha() for c in name)


def _explain(err: msgspec.ValidationError, raw: dict[str, Any]) -> tuple[str, str]:
    """Turn msgspec's message and `$.a.b[0]` path into a dotted key and an operator's reason."""
    match = _AT.match(str(err))
    assert match is not None
    msg, segments = match["msg"], _parse_path(match["path"] or "")
    if match["in_key"]:
        segments.append(_DICT_KEY)
    if _DICT_KEY in segments:
        segments = _name_dict_keys(segments, raw)
    cause = err.__cause__
    if isinstance(cause, _FieldError):
        return _render(segments + _parse_path("." + cause.field_name)), cause.reason
    if m := re.match(r"Object contains unknown field `(.*)`$", msg):
        allowed = _struct_fields(_type_at(segments))
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return _render([*segments, m[1]]), f"unknown key{hint}"
    if m := re.match(r"Object missing required field `(.*)`$", msg):
        return _render([*segments, m[1]]), "required key is missing"
    if m := re.match(r"Invalid enum value (.*)$", msg):
        target = _type_at(segments)
        if typing.get_origin(target) is Literal:
            choices = " | ".join(f'"{v}"' for v in typing.get_args(target))
            return _render(segments), f"expected one of {choices}, got {m[1]}"
    for pattern, help_text in _PATTERN_HELP.items():
        if msg.startswith("Expected `str` matching regex") and pattern in msg:
            # Never echo a value that failed the secret-name pattern: it may be the secret itself.
            value = segments[-1] if match["in_key"] else _value_at(raw, segments)
            got = "" if pattern == SECRET_NAME_PATTERN else f", got {value!r}"
            return _render(segments), f"expected {help_text}{got}"
    if re.match(r"Expected `(int|float)` [<>]=? ", msg):
        return _render(segments), f"e{msg[1:]}, got {_value_at(raw, segments)!r}"
    return _render(segments), msg[:1].lower() + msg[1:]


def _parse_path(path: str) -> list[Any]:
    segments: list[Any] = []
    for name, index in _SEGMENT.findall(path):
        if name:
            segments.append(name)
        elif index == "...":
            segments.append(_DICT_KEY)
        else:
            segments.append(int(index))
    return segments


def _render(segments: list[Any]) -> str:
    out = ""
    for seg in segments:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
    return out or "-"


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _type_at(segments: list[Any]) -> Any:
    """The annotated type of the config value at `segments`, or None when the walk gets lost."""
    tp: Any = Config
    for seg in segments:
        tp = _strip(tp)
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = typing.get_type_hints(tp, include_extras=True).get(seg)
        elif typing.get_origin(tp) is list and isinstance(seg, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return _strip(tp)


def _struct_fields(tp: Any) -> tuple[str, ...]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp.__struct_fields__
    return ()


def _name_dict_keys(segments: list[Any], raw: Any) -> list[Any]:
    """Replace each `[...]` with the dict key whose value fails validation (the first, as msgspec)."""
    named: list[Any] = []
    for seg in segments:
        if seg is _DICT_KEY and isinstance(raw, dict):
            key_type, value_type = typing.get_args(_type_at(named))
            for key, value in raw.items():
                try:
                    msgspec.convert(key, key_type)
                    msgspec.convert(value, value_type)
                except msgspec.ValidationError:
                    seg = key
                    break
        named.append(seg)
        raw = _child(raw, seg)
    return named


def _value_at(raw: Any, segments: list[Any]) -> Any:
    for seg in segments:
        raw = _child(raw, seg)
    return raw


def _child(raw: Any, seg: Any) -> Any:
    if isinstance(raw, dict) and seg in raw:
        return raw[seg]
    if isinstance(raw, list) and isinstance(seg, int) and seg < len(raw):
        return raw[seg]
    return None


def default_config_text() -> str:
    """A commented config.toml that holds every key at its default; `starling init` writes it."""
    return _DEFAULT_TEXT


_DEFAULT_TEXT = '''\
# Starling configuration. Unknown keys are errors. Values that are secrets are never written
# here: keys such as api_key or token hold a secret's *name*, resolved at use from the env
# ($NAME, then $STARLING_SECRET_NAME, upper-cased, - and . as _) or data/secrets.json
# (`starling secret set NAME --value-stdin`).

data_dir = "data"              # state: database, secrets, logs, sockets; relative to this file's folder
agents_dir = "agents"          # persona packs, one folder per agent id
workspace_dir = "workspace"    # agents' working directories (shared/ and private/<id>/)

[control]
listen = "127.0.0.1:7820"      # host:port of /health and the control API (`starling init` picks a free port)
allow_remote = false           # a non-loopback listen is refused unless this is true
public_url = ""                # the dashboard's https URL behind a TLS proxy (secure cookies, links)
dashboard = true               # the dashboard at / (add an account: `starling dashboard user add NAME`)

[runner]
processes = 2                  # agent-turn workers (1..64)
turns_per_process = 8          # turns one runner works on at once (they mostly wait on the model)
lease_s = 60.0                 # a turn's claim; renewed while it runs, taken by another runner if not

[conversation]
max_conversation_turns = 200   # turns kept in a session's history
max_context_ratio = 0.8        # share of the model's context window a turn may fill (0 < r <= 1)
queue = "collect"              # a burst: collect (answered together) | followup (a turn each) | interrupt

# Model endpoints by name; agents pick one. base_url and api_key default by kind.
[providers.default]
kind = "openai"                # openai (any OpenAI-compatible server) | anthropic
base_url = "https://api.openai.com/v1"
api_key = "openai"             # a secret's name
model = "gpt-4o-mini"
context_window = 128000        # tokens
vision = false                 # true: the model takes images; inbound photos reach it as images, not as a line
max_images = 4                 # images shown in one model request (newest first); the rest are named in text

[gateways]
outbox_lease_s = 60.0          # a message's claim by a gateway process; renewed while it sends, so
                               # after a gateway crash its messages wait this long to be taken again

# Gateways: none by default. Each [[gateways.<platform>]] block is one bot/workspace/number;
# ids are unique across all platforms ("cli" is taken) and match ^[a-z0-9][a-z0-9_-]{0,31}$.
#
# [[gateways.telegram]]
# id = "main"                  # the gateway instance; sessions are per agent, per instance, per chat
# agent = "default"            # the agent that answers
# token = "telegram-main"      # a secret's name: the bot token
# mode = "polling"             # polling | webhook
# api_base = "https://api.telegram.org"
# allow = []                   # sender ids and group chat ids; empty: unknown senders get a pairing code
# groups = "mention"           # in an allowed group: answer when mentioned or replied to | "all"
# max_attachment_mb = 20       # larger inbound files are not downloaded (the agent is told)
# process = ""                 # "NAME": served by a process of its own, gateway-telegram-NAME (every platform has it)
# listen = "127.0.0.1:7830"    # webhook mode: where the webhook server binds (behind your TLS proxy)
# public_url = ""              # webhook mode (required): the https URL Telegram posts to
# secret_token = "telegram-main-webhook"   # webhook mode: a secret's name
#
# [[gateways.slack]]
# id = "team"
# agent = "default"
# mode = "socket"              # socket | events
# bot_token = "slack-bot"      # secret names: the xoxb-... bot token,
# app_token = "slack-app"      #   the xapp-... app token (socket mode),
# signing_secret = "slack-signing"   # the signing secret (events mode)
# api_base = "https://slack.com/api"
# listen = "127.0.0.1:7831"    # events mode: where the events server binds (POST /slack/<id>/events)
# allow = []                   # user ids (and channel ids)
# ping_interval_s = 10         # socket mode: a socket that misses a pong for half of this is replaced
#
# [[gateways.whatsapp]]
# id = "phone"
# agent = "default"
# mode = "cloud"               # cloud (Meta's Cloud API) | linked (a linked device)
# phone_number_id = ""         # cloud mode (required)
# access_token = "whatsapp-token"          # secret names
# app_secret = "whatsapp-app-secret"
# verify_token = "whatsapp-verify"
# api_base = "https://graph.facebook.com/v21.0"
# listen = "127.0.0.1:7832"    # webhook server (GET and POST /whatsapp/<id>/webhook)
# allow = []                   # E.164 numbers
# template = ""                # an approved template for replies outside the 24-hour window; "" = fail them
# template_language = "en_US"

[tools]
sandbox = "auto"               # auto: shell, jobs and MCP stdio servers confined by the kernel (Landlock, namespaces);
                               # off where that is impossible. "none": run them unconfined (warned at every start)

[tools.shell]                  # limits of each confined command (rlimits)
cpu_s = 600                    # CPU seconds of a shell command
job_cpu_s = 21600              # CPU seconds of a background job
memory_mb = 4096               # address space
file_mb = 1024                 # largest file a command may write
open_files = 1024
processes = 512                # inside the sandbox's user namespace (Linux never caps root's)
read_paths = []                # more absolute folders commands may read (the system folders always are)

# MCP servers whose tools agents may use (an agent lists them: mcp = ["github"] in its config.toml).
# Each tool reaches the model as <server>__<tool>, under approvals and the audit like every tool.
#
# [mcp.github]
# command = "github-mcp-server"  # a stdio server, started confined like the shell, on first use
# args = ["stdio"]
# env = { GITHUB_TOKEN = "github-token" }   # values are secret names
# network = false                # a stdio server has no network unless this is true (your decision)
# url = ""                       # or a Streamable HTTP server: url = "https://...", no command
# headers = {}                   # with url: e.g. { Authorization = "github-bearer" } (secret names)
# approval = "ask"               # ask | auto | deny, for every tool of the server
# tools = {}                     # per-tool overrides, e.g. { search_code = "auto", delete_repo = "deny" }
# trust_hints = false            # true: a tool the server marks read-only runs without asking
# timeout_s = 60                 # one tool call
# start_timeout_s = 30           # starting the server and the handshake

[transcription]                # voice notes to text before the turn: any OpenAI-compatible /audio/transcriptions
provider = ""                  # a [providers.<name>] (its base_url and api_key); "" = off
model = "whisper-1"            # whisper-1, gpt-4o-transcribe, whisper-large-v3 (Groq), ...
language = ""                  # ISO-639-1 ("en", "de"); "" = detected
timeout_s = 120.0
max_mb = 25.0                  # longer recordings are not sent (the API refuses over 25 MB)

[web]                          # the web_fetch tool (and web_search when a provider is set)
search = ""                    # "" (no web_search) | searxng | brave | tavily
base_url = ""                  # the search API (searxng: your instance; brave and tavily have defaults)
api_key = ""                   # a secret's name (brave, tavily)
max_kb = 2048                  # bytes of a page read at most
timeout_s = 20.0               # one fetch, redirects included
max_redirects = 5
allow_networks = []            # CIDRs web_fetch may reach although private/loopback/link-local, e.g. ["10.1.0.0/16"]

[scheduler]
poll_interval_s = 30.0         # how often due cron jobs are looked for, besides wake-ups
max_consecutive_failures = 3   # a cron job that fails this often in a row is disabled, with an alert; 0: never

[retention]                    # days kept before the sweeper deletes (each >= 1)
session_days = 30
audit_days = 30
job_log_days = 14
tool_output_days = 2
scratchpad_days = 3

[session_memory]
active_dir = ""                # off unless set, e.g. "memories" (relative to this file's folder)
retention_days = 3

[session_memory.reset]
mode = "none"                  # none | daily | idle: when a chat starts a fresh session
boundary_hour = 4              # daily: the local hour (0..23) at which sessions reset
idle_minutes = 120             # idle: minutes of silence after which a session resets

[health]
heartbeat_interval_ms = 60000  # how often each service reports in
disk_warn_threshold_mb = 1024  # degraded when free disk under data_dir falls below this
wal_warn_threshold_mb = 100    # degraded when the WAL grows past this
alert_to = ""                  # "instance:chat" to message when degraded; "" logs only

[backup]
keep = 7                       # `starling backup create` keeps this many archives in the folder it writes to
                               # (default data/backups/), deleting the oldest; 0 keeps them all

[writer]
batch_max = 512                # max requests applied in one group commit (1..100000)
checkpoint_interval_s = 2.0    # PASSIVE checkpoint timer
wal_truncate_mb = 64           # TRUNCATE checkpoint when the WAL passes this
busy_timeout_ms = 5000
reserve_mb = 16                # freed when the data disk fills, so heartbeats, delivery reports and alerts still commit

[bus]
writer_endpoint = ""           # "" = ipc://<data_dir>/run/writer.sock; tcp:// on 127.0.0.1 only (other hosts: not built)
events_endpoint = ""           # "" = ipc://<data_dir>/run/events.sock
request_timeout_ms = 2000      # resend an unacked request after this
window = 256                   # max in-flight requests per client
heartbeat_ivl_ms = 1000        # bus heartbeat interval
'''
