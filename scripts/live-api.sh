# shellcheck shell=bash
# A `hookd api` of this checkout's build on a free 127.0.0.1 port, with one static token,
# for the runs against a live API (scripts/schemathesis.sh, scripts/clients.sh). Sourced,
# after the caller defined `log` and `die`; needs DATABASE_URL.
#
#   live_api_init NAME        WORK (a temp dir) and the exit traps: the API stopped, the
#                             token revoked, the API's log shown on failure, WORK removed
#   live_api_build            HOOKD, built the way nextest builds the workspace
#   live_api_token ARGS...    migrates, then `hookd token create ARGS...`: TOKEN, TOKEN_ID
#   live_api_start            starts `hookd api` (BASE, API_PID) and waits for /healthz
#   cargo_target_dir          prints where cargo builds (CARGO_TARGET_DIR honoured)

live_api_init() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/hookd-$1.XXXXXX")
  HOOKD=""
  API_PID=""
  TOKEN_ID=""
  trap live_api_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # Only static tokens: no ServiceAccount TokenReviews against whatever cluster the
  # machine's kubeconfig names (an unreachable one would turn requests into 503s).
  export KUBECONFIG=$WORK/no-kubeconfig
  unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT
  export HOOKD_LOG=warn
}

live_api_cleanup() {
  local rc=$?
  if [[ -n "$API_PID" ]] && kill -0 "$API_PID" 2>/dev/null; then
    kill "$API_PID" 2>/dev/null || true
    wait "$API_PID" 2>/dev/null || true
  fi
  if [[ -n "$TOKEN_ID" && -n "$HOOKD" ]]; then
    "$HOOKD" token revoke "$TOKEN_ID" >/dev/null 2>&1 || true
  fi
  if [[ $rc -ne 0 && -f "$WORK/api.log" ]]; then
    log "last lines of the API's log:"
    tail -n 40 "$WORK/api.log" >&2 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}

cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

live_api_build() {
  local target_dir
  target_dir=$(cargo_target_dir)
  # Built the way nextest builds the workspace (dev-dependencies' features unified), so
  # after scripts/test.sh's nextest run this is a no-op: `cargo build --bin hookd` alone
  # resolves other features and rebuilt reqwest, tokio and the rest for minutes.
  log "cargo test --no-run --workspace (target/debug/hookd)"
  cargo test --no-run --workspace --locked --quiet
  HOOKD=$target_dir/debug/hookd
}

live_api_token() {
  "$HOOKD" migrate >/dev/null
  # The last stdout line is the token; stderr names its id (for the revoke on exit).
  TOKEN=$("$HOOKD" token create "$@" 2>"$WORK/token.err" | tail -n 1)
  TOKEN_ID=$(grep -Eo 'token [0-9a-f-]{36}' "$WORK/token.err" | head -n 1 | cut -d' ' -f2 || true)
  [[ "$TOKEN" == hookd_* ]] || die "hookd token create printed no token"
}

live_api_start() {
  local port deadline
  port=$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  BASE=http://127.0.0.1:$port
  "$HOOKD" api --listen "127.0.0.1:$port" >"$WORK/api.log" 2>&1 &
  API_PID=$!
  deadline=$((SECONDS + 30))
  until curl -fsS -o /dev/null "$BASE/healthz" 2>/dev/null; do
    kill -0 "$API_PID" 2>/dev/null || die "hookd api exited during start"
    ((SECONDS < deadline)) || die "hookd api did not answer /healthz within 30 s"
    sleep 0.2
  done
}
