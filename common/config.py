"""config.toml: its typed shape, its defaults, its validation, and errors that name file and key.

Paths in the file (data_dir, agents_dir, workspace_dir, session_memory.active_dir) stay the strings
the operator wrote; `common.home.paths_for` resolves them against the config file's folder.
The commented default file is config_text.py; turning a validation error into key and reason is
config_explain.py.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta, field

from common.config_text import default_config_text  # noqa: F401 - where callers have always found it
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
    streaming: Literal["off", "draft"] = "draft"  # the answer shows while the model writes (sendMessageDraft)
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
    streaming: Literal["off", "draft"] = "draft"  # the answer grows in one message in the thread while the model writes


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
    streaming: Literal["off", "draft"] = "off"  # only "off": WhatsApp shows no drafts (the typing indicator only)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "cloud" and not self.phone_number_id:
            raise _FieldError("phone_number_id", "required when mode = \"cloud\"")
        if self.streaming != "off":
            raise _FieldError("streaming", "only \"off\" on WhatsApp: it cannot show an answer while it is written"
                                           " (it has the typing indicator only)")


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

    def streams(self, instance: str) -> bool:
        """Whether the gateway instance shows answers while the model writes (streaming = "draft"); the CLI's
        "cli" and an unknown instance do not."""
        return any(gw.id == instance and gw.streaming == "draft" for gw in self.all())


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
        from common.config_explain import explain  # it walks Config's types: imported after Config exists

        key, reason = explain(e, msgspec.toml.decode(data))
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
