#!/bin/sh
# The container's start: a config on first start (/config/config.yaml: /inbox → /outbox,
# the console on all addresses with a token), then ocrd as PUID:PGID, so that what it
# writes belongs to the user and group the NAS shares belong to. Any other command
# (`status`, `retry --all`, `check-config`) runs as that user too.
#
# This script runs as root, in a folder (/config) that belongs to PUID: it follows no
# symbolic link there. It refuses a link where it would write, creates the files it
# writes as PUID with O_EXCL|O_NOFOLLOW (never through a link, never over an entry), and
# changes owners with `chown -h` and `find -xdev` (a link itself, never its target).
set -eu

uid="${PUID:-1000}"
gid="${PGID:-1000}"
config="${OCRD_CONFIG:-/config/config.yaml}"
folder="$(dirname "$config")"
token="$folder/web-token"

die() {
  echo "ocrd: $*" >&2
  exit 1
}

case "$uid$gid" in
  '' | *[!0-9]*) die "PUID and PGID must be numbers (PUID=$uid PGID=$gid)" ;;
esac
if { [ "$uid" -eq 0 ] || [ "$gid" -eq 0 ]; } && [ "${OCRD_RUN_AS_ROOT:-}" != yes ]; then
  die "PUID=$uid PGID=$gid would run ocrd as root (and everything it writes would be" \
    "root's). Set PUID and PGID to the share's owner (\`id NAME\` on the NAS), or" \
    "OCRD_RUN_AS_ROOT=yes if root is really meant."
fi

as_user() {
  setpriv --reuid="$uid" --regid="$gid" --clear-groups \
    env HOME="$folder" XDG_CACHE_HOME="$folder/cache" HF_HOME="$folder/huggingface" "$@"
}

# A file of ocrd's own, created by PUID, never through a link nor over an entry there.
create_as_user() {  # PATH MODE (the content on stdin)
  as_user python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
             int(sys.argv[2], 8))
with os.fdopen(fd, "wb") as f:
    f.write(sys.stdin.buffer.read())' "$1" "$2"
}

refuse_link() {
  if [ -L "$1" ]; then
    die "$1 is a symbolic link (to $(readlink "$1")); ocrd's start follows no link in" \
      "$folder. Remove it (the container writes the file itself)."
  fi
}

# /config: the folder itself, a real folder, the user's; no link where a file is written
refuse_link "$folder"
mkdir -p "$folder"
refuse_link "$folder"
chown -h "$uid:$gid" "$folder"
refuse_link "$config"
refuse_link "$token"

# PUID:PGID changed since an earlier start: ocrd's own files (the token, the config, the
# journal …) belong to the earlier user, and the token would be unreadable to the new
# one. The earlier user's files among them are given to the new ids, no others.
if [ -e "$token" ]; then
  was="$(stat -c %u:%g "$token")"
  if [ "$was" != "$uid:$gid" ]; then
    for name in config.yaml web-token state cache huggingface; do
      [ -e "$folder/$name" ] || [ -L "$folder/$name" ] || continue
      find "$folder/$name" -xdev -user "${was%:*}" -exec chown -h "$uid:$gid" {} +
    done
    echo "ocrd: PUID:PGID is $uid:$gid now (it was $was): ocrd's own files in $folder" \
      "(config.yaml, web-token, state/, cache/, huggingface/) were given to $uid:$gid"
  fi
fi

if [ ! -e "$config" ]; then
  create_as_user "$config" 644 <<'YAML'
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
fi
if [ ! -e "$token" ]; then
  python3 -c 'import secrets; print(secrets.token_hex(24))' | create_as_user "$token" 600
fi

# Folders that compose made for the volumes (root's, empty) become the user's, writable
# for the group (setgid: what is made in them keeps the group), as the folders ocrd makes
# itself are; folders that hold something keep the owner and mode the NAS gave them.
for volume in /inbox /outbox /failed /archive; do
  [ -d "$volume" ] && [ ! -L "$volume" ] || continue
  if [ "$(stat -c %u "$volume")" = 0 ] && [ -z "$(ls -A "$volume")" ]; then
    chown -h "$uid:$gid" "$volume"
    chmod 2775 "$volume"
  fi
  if ! as_user test -w "$volume"; then
    echo "ocrd: $volume is not writable for $uid:$gid (it belongs to" \
      "$(stat -c %u:%g "$volume"), mode $(stat -c %a "$volume")); on the host, give it" \
      "to the share's owner: chown -R $uid:$gid FOLDER (the folder mounted as $volume)" >&2
  fi
done

if [ "${1:-run}" = run ]; then
  echo "ocrd: watching /inbox → /outbox as uid $uid, gid $gid; config $config"
  echo "ocrd: the console listens on port 9465 of the container; sign in with the token in $token"
  set -- run -c "$config"
fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups \
  env HOME="$folder" XDG_CACHE_HOME="$folder/cache" HF_HOME="$folder/huggingface" ocrd "$@"
