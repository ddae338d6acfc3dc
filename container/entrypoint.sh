#!/bin/sh
# The container's start: a config on first start (/config/config.yaml: /inbox → /outbox,
# the console on all addresses with a token), then ocrd as PUID:PGID, so that what it
# writes belongs to the user and group the NAS shares belong to. Any other command
# (`status`, `retry --all`, `check-config`) runs as that user too.
set -eu

uid="${PUID:-1000}"
gid="${PGID:-1000}"
config="${OCRD_CONFIG:-/config/config.yaml}"
folder="$(dirname "$config")"

as_user() {
  exec setpriv --reuid="$uid" --regid="$gid" --clear-groups \
    env HOME="$folder" XDG_CACHE_HOME="$folder/cache" HF_HOME="$folder/huggingface" "$@"
}

mkdir -p "$folder"
if [ ! -e "$config" ]; then
  cat > "$config" <<'YAML'
# Written by the container at its first start; edit it and restart the container.
# Every key: docs/configuration.md in ocrd's source. The journal is in ./state.
inboxes:
  - path: /inbox
    outbox: /outbox
    failed: /failed
    archive: /archive
    # group-writable for the share's group (PGID)
    file_mode: "0664"
    dir_mode: "2775"
engine:
  kind: auto
  tesseract:
    lang: eng+deu
web:
  # all addresses inside the container: compose.yaml publishes the port
  listen: 0.0.0.0:9465
  token_file: /config/web-token
YAML
  chown "$uid:$gid" "$config"
fi
token="$folder/web-token"
if [ ! -e "$token" ]; then
  (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(24))' > "$token")
  chown "$uid:$gid" "$token"
fi
chown "$uid:$gid" "$folder"
# Folders that compose made for the volumes (root's, empty) become the user's; folders
# that hold something keep the owner the NAS gave them.
for volume in /inbox /outbox /failed /archive; do
  if [ -d "$volume" ] && [ "$(stat -c %u "$volume")" = 0 ] && [ -z "$(ls -A "$volume")" ]; then
    chown "$uid:$gid" "$volume"
  fi
done

if [ "${1:-run}" = run ]; then
  echo "ocrd: watching /inbox → /outbox as uid $uid, gid $gid; config $config"
  echo "ocrd: the console listens on port 9465 of the container; sign in with the token in $token"
  as_user /opt/ocrd/bin/ocrd run -c "$config"
fi
as_user /opt/ocrd/bin/ocrd "$@"
