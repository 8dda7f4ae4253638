#!/usr/bin/env bash
# The project's one test command: fmt, clippy and nextest over the workspace (hookd and
# the bench crate), the install path against a real Kubernetes control plane
# (e2e/run.sh --control-plane local) and a bounded schemathesis run
# (scripts/schemathesis.sh), and the TypeScript client's tests (scripts/clients.sh) against
# a Postgres.
#
# If DATABASE_URL is set it is used as is. Otherwise a throwaway cluster is
# created in a fresh temp dir on a free 127.0.0.1 port and destroyed on exit
# (success, failure or Ctrl-C), so CI proves the fresh-machine path and a
# system Postgres on 5432 is never touched.
#
# Env:
#   DATABASE_URL          use this database instead of provisioning one
#   HOOKD_PG_BINDIR       directory with initdb/pg_ctl/postgres (overrides search)
#   HOOKD_TEST_SKIP_LINT=1  skip cargo fmt/clippy (quick local loops)
#   HOOKD_TEST_SKIP_SCHEMATHESIS=1  skip the schemathesis run (quick local loops)
#   HOOKD_TEST_SKIP_CONTROLPLANE=1  skip the control-plane e2e (quick local loops)
#   HOOKD_TEST_SKIP_CLIENTS=1  skip the TypeScript client run (quick local loops)
# Extra arguments are passed to `cargo nextest run`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- Postgres provisioning (mirrors src/pgtemp.rs) ---------------------------

PG_ROOT=""      # temp dir holding data/, sock/ and postgres.log
PG_BINDIR=""
PG_USER=""      # unprivileged user to run initdb/pg_ctl as when we are root

has_server_bins() {
  [[ -x "$1/initdb" && -x "$1/pg_ctl" && -x "$1/postgres" ]]
}

# Debian keeps server binaries in /usr/lib/postgresql/N/bin and only puts
# client wrappers on PATH, so look there first (newest major first).
find_bindir() {
  if [[ -n "${HOOKD_PG_BINDIR:-}" ]]; then
    has_server_bins "$HOOKD_PG_BINDIR" ||
      die "HOOKD_PG_BINDIR=$HOOKD_PG_BINDIR has no initdb/pg_ctl/postgres"
    PG_BINDIR=$HOOKD_PG_BINDIR
    return
  fi
  local candidates=() d
  # Unmatched globs stay literal and fail has_server_bins, so no nullglob.
  while IFS= read -r d; do
    candidates+=("$d")
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r)
  if command -v pg_config >/dev/null 2>&1; then
    candidates+=("$(pg_config --bindir)")
  fi
  if command -v postgres >/dev/null 2>&1; then
    candidates+=("$(dirname "$(command -v postgres)")")
  fi
  for d in "${candidates[@]}"; do
    if has_server_bins "$d"; then
      PG_BINDIR=$d
      return
    fi
  done
  die "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in" \
    "/usr/lib/postgresql/*/bin, pg_config --bindir or PATH;" \
    "install the PostgreSQL server package or set DATABASE_URL"
}

# initdb, pg_ctl and postgres refuse to run as root, so as root we run them as
# an unprivileged user.
as_pg_user() {
  if [[ -z "$PG_USER" ]]; then
    "$@"
  elif command -v runuser >/dev/null 2>&1; then
    runuser -u "$PG_USER" -- "$@"
  else
    # su takes one shell string; %q quotes each word for /bin/sh-compatible
    # reuse (our words are plain paths and options).
    su "$PG_USER" -s /bin/sh -c "$(printf '%q ' "$@")"
  fi
}

# Ask the kernel for a free port (bind port 0, read it, close). The port could
# in theory be taken before postgres binds it; start_pg retries for that.
pick_port() {
  if command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null; then
    return
  fi
  # No python: pick a random high port nobody answers on.
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "could not find a free TCP port"
}

cleanup_pg() {
  [[ -n "$PG_ROOT" ]] || return 0
  if [[ -f "$PG_ROOT/data/postmaster.pid" ]]; then
    # immediate: we throw the data away, so no point waiting for a checkpoint.
    (cd "$PG_ROOT" && as_pg_user "$PG_BINDIR/pg_ctl" stop -D "$PG_ROOT/data" -m immediate -w -t 30) \
      >/dev/null 2>&1 || log "warning: pg_ctl stop failed; see $PG_ROOT/postgres.log"
  fi
  rm -rf "$PG_ROOT"
  log "removed throwaway PostgreSQL cluster $PG_ROOT"
  PG_ROOT=""
}

on_exit() {
  local rc=$?
  cleanup_pg || true
  exit "$rc"
}

start_pg() {
  find_bindir
  if [[ "$(id -u)" == 0 ]]; then
    if id postgres >/dev/null 2>&1; then PG_USER=postgres; else PG_USER=nobody; fi
  fi

  # Install the trap before anything is created so a failure or Ctrl-C at any
  # later point still cleans up. INT/TERM exit, which runs the EXIT trap.
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # Under /tmp (not $TMPDIR) because the unprivileged user must be able to
  # traverse the parent, which e.g. /root/tmp would not allow.
  PG_ROOT=$(mktemp -d /tmp/hookd-pg.XXXXXX)
  mkdir "$PG_ROOT/sock"
  if [[ -n "$PG_USER" ]]; then
    chown -R "$PG_USER:" "$PG_ROOT"
  fi

  log "initdb ($PG_BINDIR, as ${PG_USER:-$(id -un)}) in $PG_ROOT"
  # --locale=C: deterministic collation and no dependency on the host's
  # generated locales. cd: the user must be able to access the cwd.
  if ! (cd "$PG_ROOT" && as_pg_user "$PG_BINDIR/initdb" -D "$PG_ROOT/data" \
    --auth=trust -U postgres --encoding=UTF8 --locale=C --no-instructions) \
    >"$PG_ROOT/initdb.log" 2>&1; then
    cat "$PG_ROOT/initdb.log" >&2
    die "initdb failed"
  fi

  # fsync and synchronous_commit stay at their defaults on purpose: crash
  # tests and benchmarks rely on real durability.
  local attempt port opts
  for attempt in 1 2 3; do
    port=$(pick_port)
    opts="-c listen_addresses=127.0.0.1 -c port=$port"
    opts+=" -c unix_socket_directories=$PG_ROOT/sock"
    opts+=" -c max_connections=200 -c shared_buffers=256MB"
    if (cd "$PG_ROOT" && as_pg_user "$PG_BINDIR/pg_ctl" start -D "$PG_ROOT/data" \
      -l "$PG_ROOT/postgres.log" -o "$opts" -w -t 30) >/dev/null 2>&1 &&
      wait_ready "$port"; then
      PG_PORT=$port
      return 0
    fi
    log "PostgreSQL did not start on port $port (attempt $attempt); last log lines:"
    tail -n 20 "$PG_ROOT/postgres.log" >&2 || true
    # Make sure a half-started server is gone before retrying.
    (cd "$PG_ROOT" && as_pg_user "$PG_BINDIR/pg_ctl" stop -D "$PG_ROOT/data" -m immediate -w) \
      >/dev/null 2>&1 || true
  done
  die "could not start PostgreSQL (log: $PG_ROOT/postgres.log, removed on exit)"
}

# pg_ctl -w already waits for "ready" in postmaster.pid; additionally prove
# that TCP connections are accepted, since that is what the tests use.
wait_ready() {
  local port=$1 deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    if [[ -x "$PG_BINDIR/pg_isready" ]]; then
      "$PG_BINDIR/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -t 2 && return 0
    elif (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

redact() { sed -E 's#(://[^:/@]*):[^@]*@#\1:***@#' <<<"$1"; }

if [[ -n "${DATABASE_URL:-}" ]]; then
  log "using database from DATABASE_URL: $(redact "$DATABASE_URL")"
else
  PG_PORT=""
  start_pg
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  log "using throwaway PostgreSQL ($("$PG_BINDIR/postgres" --version)) at $DATABASE_URL (data: $PG_ROOT/data)"
fi

# --- Cargo steps ---------------------------------------------------------------

if [[ "${HOOKD_TEST_SKIP_LINT:-0}" != 1 ]]; then
  # --all / --workspace: the bench crate (bench/) is linted like the product
  log "cargo fmt --all --check"
  cargo fmt --all --check
  log "cargo clippy --workspace"
  cargo clippy --workspace --all-targets --locked -- -D warnings
else
  log "HOOKD_TEST_SKIP_LINT=1: skipping fmt and clippy"
fi

log "cargo nextest run --workspace"
# Not exec: the EXIT trap must still run to tear the cluster down. --workspace: the bench
# crate's smoke test (bench/tests/) runs with the product's tests.
cargo nextest run --workspace --locked --no-fail-fast "$@"

if [[ "${HOOKD_TEST_SKIP_CONTROLPLANE:-0}" != 1 ]]; then
  # The install path against a real kube-apiserver, etcd and kube-controller-manager built
  # from Go modules (cached; docs/control-plane.md), with the hookd nextest just built.
  log "e2e/run.sh --control-plane local"
  # nextest built it where cargo builds (CARGO_TARGET_DIR honoured)
  # shellcheck source=scripts/live-api.sh
  source scripts/live-api.sh
  HOOKD_BIN="${HOOKD_BIN:-$(cargo_target_dir)/debug/hookd}" bash e2e/run.sh --control-plane local
else
  log "HOOKD_TEST_SKIP_CONTROLPLANE=1: skipping the control-plane e2e"
fi

if [[ "${HOOKD_TEST_SKIP_SCHEMATHESIS:-0}" != 1 ]]; then
  log "schemathesis against a live hookd api"
  bash scripts/schemathesis.sh
else
  log "HOOKD_TEST_SKIP_SCHEMATHESIS=1: skipping the schemathesis run"
fi

if [[ "${HOOKD_TEST_SKIP_CLIENTS:-0}" != 1 ]]; then
  log "the TypeScript client against a live hookd api"
  bash scripts/clients.sh
else
  log "HOOKD_TEST_SKIP_CLIENTS=1: skipping the TypeScript client run"
fi
