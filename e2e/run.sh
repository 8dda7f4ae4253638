#!/usr/bin/env bash
# hookd end to end on a throwaway kind cluster (see e2e/README.md).
#
# Builds the image, loads it into a new kind cluster, applies the dev overlay (retagged by
# e2e/kustomization.yaml) and asserts the whole flow: endpoint Ready, events from a pod
# delivered and verified, secret rotation, a dispatcher force-deleted mid-flight losing
# nothing, and endpoint deletion cancelling pending deliveries. Prints a summary table.
#
# Exit status: 0 every assertion passed; 1 an assertion or a step failed; 77 skipped
# because kind, docker (with a reachable engine), kubectl or jq is missing.
#
# Env: KEEP_CLUSTER=1 keeps the cluster (and prints its KUBECONFIG); E2E_EVENTS (default
# 50) events in the delivery phase; KIND_NODE_IMAGE overrides kind's node image.
#
# `e2e/run.sh --control-plane local` instead runs the install path against a real control
# plane built from Go modules, on this machine, without kind or docker
# (e2e/controlplane/local.sh, docs/control-plane.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
--control-plane | --control-plane=*)
  mode=${1#--control-plane}
  mode=${mode#=}
  if [[ -z "$mode" ]]; then mode=${2:-}; fi
  if [[ "$mode" != local ]]; then
    echo "usage: e2e/run.sh [--control-plane local]" >&2
    exit 2
  fi
  exec bash e2e/controlplane/local.sh
  ;;
esac

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

for tool in kind docker kubectl jq; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIPPED: $tool is not installed; the e2e needs kind, docker, kubectl and jq"
    exit 77
  fi
done
# Bounded where `timeout` exists: a DOCKER_HOST that does not answer can hang docker info.
docker_info=(docker info)
if command -v timeout >/dev/null 2>&1; then docker_info=(timeout 30 docker info); fi
if ! "${docker_info[@]}" >/dev/null 2>&1; then
  echo "SKIPPED: no reachable Docker engine (docker info failed)"
  exit 77
fi

EVENTS=${E2E_EVENTS:-50}
RUN_ID="$(date +%s)-$$"
CLUSTER="hookd-e2e-$RUN_ID"
IMAGE=hookd:e2e # the tag e2e/kustomization.yaml retags the install to
SYSTEM=hookd-system
TENANT=e2e # the client pod's namespace, so the tenant its projected token maps to
API_URL=http://hookd-api.$SYSTEM.svc
RECEIVER_URL=http://receiver.$TENANT.svc
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hookd-e2e.XXXXXX")
# A kubeconfig of its own: the user's current context is never touched.
export KUBECONFIG="$WORK/kubeconfig"

# --- results and cleanup -------------------------------------------------------------

RESULTS=()
FAILED=0
record() { # STATUS NAME DETAIL
  RESULTS+=("$1"$'\t'"$2"$'\t'"${3:-}")
  log "$1: $2${3:+ ($3)}"
}
pass() { record PASS "$@"; }
fail() {
  record FAIL "$@"
  FAILED=1
}
# A step the rest depends on failed: record it and stop.
die() {
  fail "$@"
  exit 1
}

summary() {
  printf '\n%-6s %-64s %s\n' RESULT ASSERTION DETAIL
  local r status name detail
  for r in ${RESULTS[@]+"${RESULTS[@]}"}; do
    IFS=$'\t' read -r status name detail <<<"$r"
    printf '%-6s %-64s %s\n' "$status" "$name" "$detail"
  done
  if ((FAILED)); then echo "e2e: FAILED"; else echo "e2e: PASSED"; fi
}

diagnostics() {
  log "diagnostics (cluster $CLUSTER)"
  {
    kubectl get pods -A -o wide
    kubectl get webhookendpoints,webhookdispatchers -A -o yaml
    kubectl -n "$SYSTEM" get events --sort-by=.lastTimestamp | tail -n 40
    kubectl -n "$TENANT" get events --sort-by=.lastTimestamp | tail -n 20
    for d in hookd-controller hookd-api hookd-dispatcher-default; do
      echo "--- logs deploy/$d"
      kubectl -n "$SYSTEM" logs "deploy/$d" --all-containers --tail=80
    done
    echo "--- logs deploy/receiver"
    kubectl -n "$TENANT" logs deploy/receiver --tail=40
  } >&2 2>&1 || true
}

on_exit() {
  local rc=$?
  ((rc == 0 && FAILED == 0)) || diagnostics
  summary
  if [[ "${KEEP_CLUSTER:-0}" == 1 ]]; then
    log "KEEP_CLUSTER=1: kept cluster $CLUSTER; export KUBECONFIG=$KUBECONFIG"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || log "warning: could not delete kind cluster $CLUSTER"
    rm -rf "$WORK"
  fi
  if ((rc == 0 && FAILED)); then rc=1; fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- helpers ---------------------------------------------------------------------------

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 2 s until it succeeds; fails with
# a message naming WHAT after SECONDS.
wait_for() {
  local secs=$1 what=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 2
  done
}

# The receiver's fingerprint of a secret (see `hookd receiver`): SHA-256 prefix.
fingerprint() {
  if command -v sha256sum >/dev/null 2>&1; then
    printf %s "$1" | sha256sum | cut -c1-12
  else
    printf %s "$1" | shasum -a 256 | cut -c1-12
  fi
}

# kind_load IMAGE: loads a host image into the cluster's node. With Docker's containerd
# image store (the default since Docker 29) `kind load docker-image` can fail with
# "content digest ... not found" (kubernetes-sigs/kind#3795); a single-platform archive
# loads either way.
kind_load() {
  kind load docker-image "$1" --name "$CLUSTER" >&2 && return 0
  log "kind load docker-image $1 failed; retrying with a single-platform archive"
  local platform rc=0
  platform=$(docker version -f '{{.Server.Os}}/{{.Server.Arch}}') &&
    docker image save --platform "$platform" -o "$WORK/image.tar" "$1" &&
    kind load image-archive "$WORK/image.tar" --name "$CLUSTER" >&2 || rc=1
  rm -f "$WORK/image.tar"
  return "$rc"
}

# Runs a shell script in the client pod (curl, busybox sh; no jq there).
in_client() { kubectl -n "$TENANT" exec e2e-client -- sh -c "$@"; }

# enqueue PHASE COUNT: POSTs COUNT events through Service hookd-api with the client pod's
# projected ServiceAccount token; writes "eventId deliveryId" lines to $WORK/PHASE.ids.
enqueue() {
  local phase=$1 count=$2 out="$WORK/$1.out"
  # shellcheck disable=SC2016 # expanded by the pod's shell
  if ! in_client '
      tok=$(cat /var/run/secrets/hookd/token)
      i=1
      while [ "$i" -le "$2" ]; do
        curl -sS --fail-with-body --max-time 10 --retry 5 --retry-all-errors --retry-delay 1 \
          -X POST "$1/v1/messages" \
          -H "authorization: Bearer $tok" -H "content-type: application/json" \
          -H "idempotency-key: e2e-$4-$3-$i" \
          -d "{\"tenant\":\"e2e\",\"eventType\":\"e2e.$3\",\"payload\":{\"phase\":\"$3\",\"n\":$i}}" || exit 1
        echo
        i=$((i + 1))
      done' sh "$API_URL" "$count" "$phase" "$RUN_ID" >"$out"; then
    log "enqueue $phase failed; last answer: $(tail -n 2 "$out")"
    return 1
  fi
  # Exactly one delivery per event: one endpoint subscribes to e2e.* in this tenant.
  jq -r 'select(.eventId != null and (.deliveryIds | length) == 1) | "\(.eventId) \(.deliveryIds[0])"' \
    "$out" >"$WORK/$phase.ids"
  [[ $(wc -l <"$WORK/$phase.ids") -eq $count ]] || {
    log "enqueue $phase: expected $count events with one delivery each; got: $(head -c 600 "$out")"
    return 1
  }
  jq -R -s 'split("\n") | map(select(length > 0) | split(" ")[1])' "$WORK/$phase.ids" >"$WORK/$phase.json"
}

# Saves the receiver's /received JSON to $WORK/received.json.
received() { in_client "curl -sS --fail --max-time 10 $RECEIVER_URL/received" >"$WORK/received.json"; }

# control JSON: changes how the receiver answers (PUT /control).
control() { in_client "curl -sS --fail --max-time 10 -X PUT -H content-type:application/json -d '$1' $RECEIVER_URL/control" >/dev/null; }

# Number of PHASE's deliveries the receiver has not verified yet.
unverified() {
  received || return 1
  jq -n --slurpfile want "$WORK/$1.json" --slurpfile got "$WORK/received.json" \
    '[$want[0][] | select(($got[0].ids[.].verified // 0) == 0)] | length'
}
all_verified() { [[ "$(unverified "$1")" == 0 ]]; }

# Saves GET /v1/deliveries/{id} of PHASE's deliveries, one JSON per line, to
# $WORK/PHASE.deliveries (read with the static token, which has the read scope).
delivery_states() {
  # shellcheck disable=SC2016 # expanded by the pod's shell
  in_client '
    for id in $3; do
      curl -sS --max-time 10 -H "authorization: Bearer $2" "$1/v1/deliveries/$id" || exit 1
      echo
    done' sh "$API_URL" "$READ_TOKEN" "$(jq -r '.[]' "$WORK/$1.json" | tr '\n' ' ')" >"$WORK/$1.deliveries"
}
# all_in_state PHASE STATUS...: every delivery of PHASE is in one of STATUS.
all_in_state() {
  local phase=$1
  shift
  delivery_states "$phase" || return 1
  jq -s -e --argjson ok "$(printf '%s\n' "$@" | jq -R . | jq -s .)" --argjson n "$(jq length "$WORK/$phase.json")" \
    'length == $n and all(.[]; .status as $s | $ok | index($s))' "$WORK/$phase.deliveries"
}
# Every delivery of PHASE is still waiting (pending or failed) and the receiver's failures
# have been seen: some attempt was made. Not one per delivery: five failures open the
# endpoint's circuit, which may then hold a delivery that was never tried yet.
all_attempted() {
  delivery_states "$1" || return 1
  jq -s -e --argjson n "$(jq length "$WORK/$1.json")" \
    'length == $n and all(.[]; .status == "failed" or .status == "pending") and any(.[]; .attemptCount >= 1)' \
    "$WORK/$1.deliveries"
}

# --- 1. cluster and image ------------------------------------------------------------

log "creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --config e2e/kind.yaml --kubeconfig "$KUBECONFIG" \
  --wait 120s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} >&2 ||
  die "kind cluster created" "kind create cluster failed"

log "building $IMAGE"
docker build -t "$IMAGE" --build-arg VERSION=e2e . >&2 || die "image built" "docker build failed"
kind_load "$IMAGE" || die "image loaded into kind" "kind load failed"
# The other images the install uses: preloaded from the host when it can pull them,
# otherwise the node pulls them itself.
for img in $(kubectl kustomize e2e |
  awk '($1 == "image:" && NF == 2) || ($1 == "-" && $2 == "image:" && NF == 3) {print $NF}' | sort -u); do
  [[ "$img" == "$IMAGE" ]] && continue
  { docker pull -q "$img" >/dev/null && kind_load "$img" 2>/dev/null; } ||
    log "could not preload $img; the node pulls it"
done
pass "image built and loaded into kind" "$IMAGE"

# --- 2. install --------------------------------------------------------------------------

# CRDs first: objects of a kind kubectl cannot map yet are refused.
kubectl apply -k crds/ >&2 || die "CRDs applied"
kubectl wait --for condition=established --timeout=60s \
  crd/webhookendpoints.hookd.dev crd/webhookdispatchers.hookd.dev >&2 || die "CRDs established"
kubectl apply -k e2e/ >&2 || die "dev overlay and e2e objects applied"

kubectl -n "$SYSTEM" rollout status statefulset/hookd-postgres --timeout=300s >&2 ||
  die "dev Postgres rolled out"
for d in hookd-controller hookd-api; do
  kubectl -n "$SYSTEM" rollout status "deploy/$d" --timeout=300s >&2 || die "$d rolled out"
done
wait_for 120 "the controller to create Deployment hookd-dispatcher-default" \
  kubectl -n "$SYSTEM" get deploy/hookd-dispatcher-default ||
  die "controller created the default dispatcher Deployment"
kubectl -n "$SYSTEM" rollout status deploy/hookd-dispatcher-default --timeout=300s >&2 ||
  die "dispatcher rolled out"
pass "install rolled out: Postgres, controller, API, dispatcher"

codes=$(kubectl -n "$SYSTEM" get pods -l 'app.kubernetes.io/name=hookd,app.kubernetes.io/component in (api,controller)' \
  -o jsonpath='{range .items[*]}{.status.initContainerStatuses[?(@.name=="migrate")].state.terminated.exitCode}{" "}{end}')
if [[ -n "${codes// /}" && -z "$(tr -d ' 0' <<<"$codes")" ]]; then
  pass "migrations ran first, in every API and controller pod" "exit codes: $codes"
else
  fail "migrations ran first, in every API and controller pod" "migrate exit codes: '$codes'"
fi

kubectl -n "$TENANT" wait --for=condition=Ready pod/e2e-client --timeout=180s >&2 || die "client pod ready"

# --- 3. an endpoint ----------------------------------------------------------------------

kubectl apply -f e2e/endpoint.yaml >&2 || die "Secret and WebhookEndpoint applied"
# The receiver mounts that Secret, so it starts only now: the kubelet retries the failed
# mount with a backoff of up to 2 minutes, hence the long timeout.
kubectl -n "$TENANT" rollout status deploy/receiver --timeout=300s >&2 || die "receiver rolled out"
if kubectl -n "$TENANT" wait --for=condition=Ready webhookendpoint/e2e --timeout=120s >&2; then
  kubectl -n "$TENANT" get webhookendpoints >&2
  ready=$(kubectl -n "$TENANT" get webhookendpoints e2e -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
  if [[ "$ready" == True ]]; then
    pass "kubectl get webhookendpoints shows Ready=True"
  else
    die "kubectl get webhookendpoints shows Ready=True" "Ready=$ready"
  fi
else
  die "kubectl get webhookendpoints shows Ready=True" "not Ready within 120s"
fi

# A static token for reading deliveries back (producing uses the projected token); read is
# all it needs. Its own `|| die`: a failing command substitution in an assignment would
# otherwise end the script under set -e without a line in the summary.
READ_TOKEN=$(kubectl -n "$SYSTEM" exec deploy/hookd-api -c api -- \
  hookd token create --tenant "$TENANT" --scope read | tail -n 1) ||
  die "static API token created" "kubectl exec deploy/hookd-api -- hookd token create failed"
[[ "$READ_TOKEN" == hookd_* ]] || die "static API token created" "hookd token create printed no hookd_ token"

OLD_SECRET=$(awk '$1 == "secret:" {print $2}' e2e/endpoint.yaml)

# --- 4. N events from a pod, all verified ---------------------------------------------

enqueue deliver "$EVENTS" || die "$EVENTS events enqueued from a pod through Service hookd-api"
if wait_for 120 "all $EVENTS deliveries verified by the receiver" all_verified deliver; then
  received
  detail=$(jq -r --slurpfile want "$WORK/deliver.json" --arg fp "$(fingerprint "$OLD_SECRET")" \
    '[$want[0][] as $id | .ids[$id]] | "\(length) verified, \(map(select(.key == $fp)) | length) with the endpoint secret"' \
    "$WORK/received.json")
  pass "$EVENTS events from a pod through Service hookd-api arrive verified" "$detail"
else
  fail "$EVENTS events from a pod through Service hookd-api arrive verified" "$(unverified deliver) never arrived verified"
fi

# --- 5. secret rotation -----------------------------------------------------------------

NEW_SECRET="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
NEW_FP=$(fingerprint "$NEW_SECRET")
kubectl -n "$TENANT" patch secret e2e-signing --type merge \
  -p "{\"stringData\":{\"secret\":\"$NEW_SECRET\"}}" >&2 || die "Secret rotated"
active_secrets_is() { [[ "$(kubectl -n "$TENANT" get webhookendpoint e2e -o jsonpath='{.status.activeSecrets}')" == "$1" ]]; }
receiver_holds_only() { received && jq -e --arg fp "$1" '.secrets == [$fp]' "$WORK/received.json"; }
if ! wait_for 90 "the controller to take the rotated Secret (activeSecrets=2)" active_secrets_is 2; then
  fail "rotation reaches hookd: the endpoint signs with 2 secrets" \
    "status.activeSecrets=$(kubectl -n "$TENANT" get webhookendpoint e2e -o jsonpath='{.status.activeSecrets}')"
elif ! wait_for 240 "the kubelet to update the receiver's mounted Secret" receiver_holds_only "$NEW_FP"; then
  fail "rotation: the receiver verifies with the new secret only" "the mounted Secret was not updated in time"
else
  enqueue rotate 20 || die "events enqueued after the rotation"
  if wait_for 120 "the post-rotation deliveries" all_verified rotate; then
    received
    bad=$(jq -r --slurpfile want "$WORK/rotate.json" --arg fp "$NEW_FP" \
      '[$want[0][] as $id | .ids[$id] | select(.signatures != 2 or .key != $fp)] | length' "$WORK/received.json")
    if [[ "$bad" == 0 ]]; then
      pass "after rotation: 2 signatures per delivery, verified with the new secret" "20/20"
    else
      fail "after rotation: 2 signatures per delivery, verified with the new secret" \
        "$bad of 20 had another signature count or key"
    fi
  else
    fail "after rotation: 2 signatures per delivery, verified with the new secret" \
      "$(unverified rotate) of 20 not verified by the receiver holding only the new secret"
  fi
fi

# --- 6. a dispatcher pod force-deleted mid-flight -----------------------------------------

selector=$(kubectl -n "$SYSTEM" get deploy hookd-dispatcher-default -o json |
  jq -r '.spec.selector.matchLabels | to_entries | map("\(.key)=\(.value)") | join(",")')
# Slow answers (under the 10 s request timeout) keep deliveries in flight.
control '{"delayMs": 8000, "status": 200}' || die "receiver slowed down"
enqueue kill 40 || die "events enqueued before the kill"
in_flight_now() { received && jq -e '.inFlight > 0' "$WORK/received.json"; }
if wait_for 60 "deliveries in flight at the receiver" in_flight_now; then
  in_flight=$(jq .inFlight "$WORK/received.json")
  pods=$(kubectl -n "$SYSTEM" get pods -l "$selector" -o name)
  # shellcheck disable=SC2086 # one word per pod
  kubectl -n "$SYSTEM" delete $pods --grace-period=0 --force --wait=false >&2 ||
    die "dispatcher pod force-deleted"
  control '{"delayMs": 0}' || die "receiver sped up"
  log "force-deleted $(wc -w <<<"$pods") dispatcher pod(s) with $in_flight deliveries in flight"
  # The replacement claims the killed pod's deliveries once their 20 s lease lapses.
  if wait_for 240 "every delivery of the killed run to arrive" all_verified kill; then
    received
    dups=$(jq --slurpfile want "$WORK/kill.json" '[$want[0][] as $id | .ids[$id].verified - 1] | add' "$WORK/received.json")
    pass "dispatcher force-deleted mid-flight loses nothing" "in flight at kill: $in_flight, dropped: 0, duplicates: $dups"
  else
    fail "dispatcher force-deleted mid-flight loses nothing" "dropped: $(unverified kill) of 40 never arrived"
  fi
  if wait_for 120 "the killed run's deliveries to be recorded succeeded" all_in_state kill succeeded; then
    pass "every delivery of the killed run ends succeeded (API)" "40/40"
  else
    fail "every delivery of the killed run ends succeeded (API)" \
      "$(jq -r -s 'group_by(.status) | map("\(.[0].status)=\(length)") | join(" ")' "$WORK/kill.deliveries")"
  fi
else
  control '{"delayMs": 0}' || true
  fail "dispatcher force-deleted mid-flight loses nothing" "no delivery was in flight, so the kill would prove nothing"
fi
kubectl -n "$SYSTEM" rollout status deploy/hookd-dispatcher-default --timeout=180s >&2 ||
  die "dispatcher replaced after the kill"

# --- 7. deleting the endpoint cancels its pending deliveries ---------------------------

control '{"status": 503}' || die "receiver set to answer 503"
enqueue pending 5 || die "events enqueued for the deletion"
if wait_for 90 "the pending deliveries' first (failed) attempts" all_attempted pending; then
  pass "deliveries pending while the receiver fails" \
    "$(jq -r -s 'map("\(.status)/\(.attemptCount)") | join(" ")' "$WORK/pending.deliveries") (status/attempts)"
else
  fail "deliveries pending while the receiver fails" \
    "$(jq -r -s 'map("\(.status)/\(.attemptCount)") | join(" ")' "$WORK/pending.deliveries")"
fi
kubectl -n "$TENANT" delete webhookendpoint e2e --wait=false >&2 || die "WebhookEndpoint deleted"
if kubectl -n "$TENANT" wait --for=delete webhookendpoint/e2e --timeout=90s >&2; then
  pass "the WebhookEndpoint disappears (finalizer removed)"
else
  fail "the WebhookEndpoint disappears (finalizer removed)" \
    "still there: finalizers $(kubectl -n "$TENANT" get webhookendpoint e2e -o jsonpath='{.metadata.finalizers}')"
fi
if wait_for 60 "the pending deliveries to be cancelled" all_in_state pending cancelled; then
  pass "deleting the endpoint cancels its pending deliveries" "5/5 cancelled"
else
  fail "deleting the endpoint cancels its pending deliveries" \
    "$(jq -r -s 'map(.status) | join(" ")' "$WORK/pending.deliveries")"
fi

# --- 8. nothing forged or garbled along the way ----------------------------------------

received
invalid=$(jq .invalid "$WORK/received.json")
if [[ "$invalid" == 0 ]]; then
  pass "the receiver saw no invalid signature" "$(jq -r '"\(.deliveries) deliveries, \(.unique) ids, \(.duplicates) duplicates"' "$WORK/received.json")"
else
  fail "the receiver saw no invalid signature" "$invalid invalid"
fi
