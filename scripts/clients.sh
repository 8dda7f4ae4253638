#!/usr/bin/env bash
# The TypeScript client (clients/typescript, @hookd/client) against a live `hookd api`:
# its generated types must be what openapi-typescript makes of clients/openapi.json
# today, it must type-check, and its tests (node's own runner) must pass against the API.
# scripts/test.sh runs it after nextest. (The Rust client, clients/rust, is generated at
# build time from the same file and tested by tests/clients.rs under nextest.)
#
# Needs DATABASE_URL (test.sh provisions one). Builds target/debug/hookd, migrates, creates
# a token of tenant `clients` with scopes produce and read (revoked on exit), starts
# `hookd api` on a free 127.0.0.1 port, and stops it on exit.
#
# Env:
#   CI=true   missing node/npm, or an `npm ci` that fails, fails the run; locally (offline)
#             it prints SKIPPED and exits 0
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> clients: %s\n' "$*" >&2; }
die() { printf 'error: clients: %s\n' "$*" >&2; exit 1; }
skip() {
  [[ "${CI:-}" == true ]] && die "$1; CI must not skip this run"
  echo "SKIPPED: TypeScript client run ($1)" >&2
  exit 0
}

[[ -n "${DATABASE_URL:-}" ]] || die "DATABASE_URL is not set (scripts/test.sh provisions one)"
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are not installed"

TS=$PWD/clients/typescript
log "npm ci"
(cd "$TS" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
  skip "npm ci failed (offline?)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hookd-clients.XXXXXX")
HOOKD=""
API_PID=""
TOKEN_ID=""
cleanup() {
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
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The checked-in types are what the generator makes of the checked-in document.
# `npm run generate` is the one command line that makes them; the committed file is put
# back afterwards, so a run never edits the checkout.
log "src/schema.ts is generated from clients/openapi.json"
cp "$TS/src/schema.ts" "$WORK/committed.ts"
stale=0
if ! (cd "$TS" && npm run -s generate >/dev/null 2>&1); then
  cp "$WORK/committed.ts" "$TS/src/schema.ts"
  die "openapi-typescript failed on clients/openapi.json"
fi
diff -u "$WORK/committed.ts" "$TS/src/schema.ts" >&2 || stale=1
cp "$WORK/committed.ts" "$TS/src/schema.ts"
((stale == 0)) ||
  die "clients/typescript/src/schema.ts is stale: cd clients/typescript && npm run generate"

log "tsc"
(cd "$TS" && npx --no-install tsc)

# What a project that installs the package sees is dist/, not src/: its declarations must
# resolve on their own (a types-only .d.ts source is not copied to dist by tsc).
log "a consumer type-checks against dist/ alone"
cat >"$WORK/consumer.mts" <<TS
import { createClient, type ErrorBody } from "$TS/dist/src/index.js";
const hookd = createClient({ baseUrl: "http://127.0.0.1:1", token: "hookd_x" });
export async function send(): Promise<string | ErrorBody> {
  const { data, error } = await hookd.POST("/v1/messages", {
    body: { eventType: "invoice.paid", payload: { n: 1 } },
  });
  return error ?? data.eventId;
}
TS
(cd "$TS" && npx --no-install tsc --noEmit --strict --skipLibCheck false --target es2022 \
  --module nodenext --moduleResolution nodenext "$WORK/consumer.mts")

# --- hookd ---------------------------------------------------------------------

TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
# Built the way nextest builds the workspace (dev-dependencies' features unified), so after
# scripts/test.sh's nextest run this is a no-op: `cargo build --bin hookd` alone resolves
# other features and rebuilt reqwest, tokio and the rest for minutes.
log "cargo test --no-run --workspace (target/debug/hookd)"
cargo test --no-run --workspace --locked --quiet
HOOKD=$TARGET_DIR/debug/hookd


# Only static tokens: no ServiceAccount TokenReviews against whatever cluster the
# machine's kubeconfig names.
export KUBECONFIG=$WORK/no-kubeconfig
unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT
export HOOKD_LOG=warn

"$HOOKD" migrate >/dev/null
# The last stdout line is the token; stderr names its id (for the revoke on exit).
TOKEN=$("$HOOKD" token create --tenant clients --scope produce,read --name clients-test \
  2>"$WORK/token.err" | tail -n 1)
TOKEN_ID=$(grep -Eo 'token [0-9a-f-]{36}' "$WORK/token.err" | head -n 1 | cut -d' ' -f2 || true)
[[ "$TOKEN" == hookd_* ]] || die "hookd token create printed no token"

PORT=$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
BASE=http://127.0.0.1:$PORT
"$HOOKD" api --listen "127.0.0.1:$PORT" >"$WORK/api.log" 2>&1 &
API_PID=$!
deadline=$((SECONDS + 30))
until curl -fsS -o /dev/null "$BASE/healthz" 2>/dev/null; do
  kill -0 "$API_PID" 2>/dev/null || die "hookd api exited during start"
  ((SECONDS < deadline)) || die "hookd api did not answer /healthz within 30 s"
  sleep 0.2
done

log "node --test against $BASE"
(cd "$TS" && HOOKD_URL=$BASE HOOKD_TOKEN=$TOKEN node --test dist/test/)
log "passed"
