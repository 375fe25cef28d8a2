#!/usr/bin/env bash
# Render Starling's systemd units (the files beside this script) for one home and write them to a
# folder, /etc/systemd/system by default. It never runs systemctl: it prints the steps instead.
#
#   sudo deploy/systemd/install.sh --python /opt/starling/venv/bin/python --home /var/lib/starling \
#        --user starling
#
# See deploy/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
system_dir=/etc/systemd/system

target="$system_dir"
python=/opt/starling/venv/bin/python
home=/var/lib/starling
data=""
user=starling
group=""
runners=2
dry_run=0

usage() {
    cat <<EOF
usage: $(basename "$0") [--target DIR] [--python PATH] [--home PATH] [--data PATH] [--user NAME]
                  [--group NAME] [--runners N] [--dry-run]

Render Starling's systemd units into DIR and print the systemctl steps (it never runs systemctl).

  --target DIR    where the units go (default: $system_dir)
  --python PATH   the Python of the venv Starling is installed in (default: $python)
  --home PATH     the Starling home (default: $home)
  --data PATH     the home's data_dir, when config.toml moves it (default: HOME/data)
  --user NAME     the user the services run as (default: $user)
  --group NAME    their group (default: the user's primary group)
  --runners N     how many runners the printed steps enable (default: $runners)
  --dry-run       print what would be written, write nothing
EOF
}

die() {
    echo "install.sh: $1" >&2
    exit 2
}

value() {  # the value of option $1, which must be there
    [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
    printf '%s' "$2"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --target) target="$(value "$@")"; shift 2 ;;
        --python) python="$(value "$@")"; shift 2 ;;
        --home) home="$(value "$@")"; shift 2 ;;
        --data) data="$(value "$@")"; shift 2 ;;
        --user) user="$(value "$@")"; shift 2 ;;
        --group) group="$(value "$@")"; shift 2 ;;
        --runners) runners="$(value "$@")"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

# The values land in unit files and inside a `sh -c '...'` line: allow only characters that mean
# nothing to systemd (% specifiers, $ variables, quotes, spaces) or to the shell.
safe_path() {  # $1: option name, $2: path
    [[ "$2" == /* ]] || die "$1 must be an absolute path, got '$2'"
    [[ "$2" =~ ^[A-Za-z0-9._/+:@-]+$ ]] || die "$1 may hold only letters, digits and . _ / + : @ -, got '$2'"
}
safe_path --python "$python"
safe_path --home "$home"
home="${home%/}"
[[ -n "$home" ]] || die "--home cannot be /"
[[ -n "$data" ]] || data="$home/data"
safe_path --data "$data"
data="${data%/}"
[[ -n "$data" ]] || die "--data cannot be /"
[[ "$user" =~ ^[a-z_][a-z0-9_-]*[$]?$ ]] || die "--user is not a valid user name: '$user'"
if [[ -z "$group" ]]; then
    group="$(id -gn "$user" 2>/dev/null || printf '%s' "$user")"
fi
[[ "$group" =~ ^[a-z_][a-z0-9_-]*[$]?$ ]] || die "--group is not a valid group name: '$group'"
[[ "$runners" =~ ^[0-9]+$ ]] || die "--runners must be a whole number, got '$runners'"
[[ -x "$python" ]] || die "--python is not an executable file: $python (create the venv first)"

# ProtectSystem=strict makes everything read-only except these; the data folder's logs live there too.
read_write="$home"
case "$data/" in
    "$home"/*) ;;
    *) read_write="$home $data" ;;
esac

render() {  # $1: a unit template; prints the unit
    sed -e "s|^ReadWritePaths=@HOME@\$|ReadWritePaths=$read_write|" \
        -e "s|@PYTHON@|$python|g" \
        -e "s|@HOME@|$home|g" \
        -e "s|@DATA@|$data|g" \
        -e "s|@USER@|$user|g" \
        -e "s|@GROUP@|$group|g" \
        "$1"
}

units=()
for unit in "$here"/*.service "$here"/*.target; do
    units+=("$unit")
done

if [[ $dry_run -eq 1 ]]; then
    for unit in "${units[@]}"; do
        echo "# would write $target/$(basename "$unit")"
        render "$unit"
        echo
    done
else
    mkdir -p "$target"
    for unit in "${units[@]}"; do
        dest="$target/$(basename "$unit")"
        render "$unit" >"$dest.tmp"
        chmod 0644 "$dest.tmp"
        mv -f "$dest.tmp" "$dest"
        echo "wrote $dest"
    done
fi

if ! id -u "$user" >/dev/null 2>&1; then
    echo "note: user '$user' does not exist yet; create it before starting (deploy/README.md)" >&2
fi
if [[ ! -f "$home/config.toml" ]]; then
    echo "note: $home/config.toml does not exist yet; run \`${python%/*}/starling --home $home init\` as $user first" >&2
fi

runner_units=""
for ((i = 0; i < runners; i++)); do
    runner_units+=" starling-runner@$i"
done

echo
if [[ "$target" != "$system_dir" ]]; then
    echo "The units are in $target, not in $system_dir: copy them there (or point systemd at them)"
    echo "before the steps below."
fi
cat <<EOF
Next steps, as root:
  systemctl daemon-reload
  systemctl enable --now starling.target$runner_units
  # one gateway per platform configured in $home/config.toml, e.g.:
  systemctl enable --now starling-gateway@telegram
  # and one per gateway process of its own ([[gateways.telegram]] process = "main"):
  systemctl enable --now starling-gateway@telegram-main
  # another runner, until the next boot (enable --now keeps it):
  systemctl start starling-runner@$runners
  # then:
  sudo -u $user ${python%/*}/starling --home $home status
EOF
