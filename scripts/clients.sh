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

# shellcheck source=scripts/live-api.sh
source "$PWD/scripts/live-api.sh"
live_api_init clients

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

live_api_build
live_api_token --tenant clients --scope produce,read --name clients-test
live_api_start

log "node --test against $BASE"
(cd "$TS" && HOOKD_URL=$BASE HOOKD_TOKEN=$TOKEN node --test dist/test/)
log "passed"
