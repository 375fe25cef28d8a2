"""The commented config.toml that `starling init` writes: every key at its default, with what it means."""

from __future__ import annotations


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
# streaming = "draft"          # the answer shows while the model writes (a draft in private chats) | "off"
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
# streaming = "draft"          # the answer grows in one message in the thread while the model writes | "off"
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
# streaming = "off"            # the only value: WhatsApp has the typing indicator, no drafts

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
