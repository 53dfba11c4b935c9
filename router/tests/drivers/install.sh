#!/usr/bin/env bash
# Installs what shardgate's driver matrix (router/tests/drivers.rs) needs, idempotently, and
# does next to nothing when it is all there already:
#   - pgjdbc: Debian's libpostgresql-jdbc-java (jar in /usr/share/java); Java 17 must be present
#   - psycopg 3 and asyncpg: a venv with python/requirements.txt, under $SHARDGATE_DRIVERS_CACHE
#     (default ~/.cache/shardgate-drivers/venv)
#   - node-postgres: `npm ci` in node/ (node_modules is git-ignored)
#   - sqlx: builds the sqlx/ crate (not a workspace member) into target/drivers-sqlx
# psql and pgbench come from deploy/local/install-deps. Needs root (or sudo) only for apt.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cache="${SHARDGATE_DRIVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardgate-drivers}"
say() { echo "drivers/install.sh: $*"; }
hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

for tool in java javac python3 node npm cargo; do
  command -v "$tool" >/dev/null || { say "$tool is not on PATH; the driver matrix needs it (deploy/local/install-deps --tests installs what is missing)" >&2; exit 1; }
done

# pgjdbc from Debian.
if dpkg-query -W -f='${Status}' libpostgresql-jdbc-java 2>/dev/null | grep -q "install ok installed"; then
  say "libpostgresql-jdbc-java already installed"
else
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { say "need root or sudo to install libpostgresql-jdbc-java" >&2; exit 1; }
    sudo=(sudo)
  fi
  say "installing libpostgresql-jdbc-java"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends libpostgresql-jdbc-java
fi

# psycopg 3 and asyncpg in a venv; the stamp records which requirements it was made from.
venv="$cache/venv"
want="$(hash_of "$here/python/requirements.txt")"
if [[ -x "$venv/bin/python" && "$(cat "$venv/.shardgate-stamp" 2>/dev/null)" == "$want" ]] \
  && "$venv/bin/python" -c "import psycopg, asyncpg, sqlalchemy, django" 2>/dev/null; then
  say "python venv up to date ($venv)"
else
  say "creating the python venv $venv"
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/python/requirements.txt"
  echo "$want" >"$venv/.shardgate-stamp"
fi

# node-postgres at the versions of the committed package-lock.json.
want="$(hash_of "$here/node/package-lock.json")"
if [[ -d "$here/node/node_modules/pg" && "$(cat "$here/node/node_modules/.shardgate-stamp" 2>/dev/null)" == "$want" ]]; then
  say "node_modules up to date"
else
  say "npm ci in $here/node"
  (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$here/node/node_modules/.shardgate-stamp"
fi

# sqlx: cargo does nothing (in well under a second) when the build is current.
say "building the sqlx driver (target/drivers-sqlx)"
cargo build -q --locked --manifest-path "$here/sqlx/Cargo.toml" --target-dir "$root/target/drivers-sqlx"
say "done"
