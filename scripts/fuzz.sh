#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Defaults: 60 seconds, every target (apply, secret, signature, ingest). Exits non-zero
# as soon as a target crashes (a panic, a failed assertion, a sanitizer report, a timeout
# or running out of memory) and prints the crashing input's path and the command that
# reproduces it. Not part of scripts/test.sh: the instrumented build of the whole
# dependency graph takes many minutes.
#
# Env:
#   FUZZ_SANITIZER  address (default) or none. ASan matters here although hookd itself
#                   has no unsafe code: the YAML parser (unsafe-libyaml) is C translated
#                   to unsafe Rust. `none` runs about twice as fast.
#
# Only a stable toolchain is assumed. cargo-fuzz passes nightly-only flags to rustc
# (-Zsanitizer=address, and cargo's -Z options); RUSTC_BOOTSTRAP=1 lets the stable
# compiler accept them instead of requiring a nightly toolchain to be installed. It is
# set for this script's build only, never for the main package.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

SECS=${1:-60}
[[ "$SECS" =~ ^[0-9]+$ && "$SECS" -gt 0 ]] || die "seconds-per-target must be a positive integer, got '$SECS'"
shift || true
TARGETS=("$@")
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  TARGETS=(apply secret signature ingest)
fi
SANITIZER=${FUZZ_SANITIZER:-address}

if ! cargo fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

export RUSTC_BOOTSTRAP=1
# The fuzz package is its own workspace with its own target dir: its instrumented
# artifacts must not land in (or be invalidated by) a shared CARGO_TARGET_DIR.
unset CARGO_TARGET_DIR
FUZZ_TARGET_DIR=$ROOT/fuzz/target
# 16 codegen units instead of cargo-fuzz's default of 1: the build of kube, k8s-openapi
# and sqlx with instrumentation is the slow part here, the fuzzing loop is cheap.
BUILD_FLAGS=(--sanitizer "$SANITIZER" --codegen-units 16 --target-dir "$FUZZ_TARGET_DIR")

log "building fuzz targets (sanitizer: $SANITIZER): ${TARGETS[*]}"
start=$SECONDS
for t in "${TARGETS[@]}"; do
  cargo fuzz build "${BUILD_FLAGS[@]}" "$t"
done
log "built in $((SECONDS - start)) s"

summary=()
for t in "${TARGETS[@]}"; do
  seeds=$ROOT/fuzz/corpus/$t
  [[ -d "$seeds" ]] || die "no seed corpus $seeds"
  # libFuzzer adds new inputs to the first corpus directory: a working copy under the
  # (ignored) target dir, so the committed seeds stay a small, reviewed set.
  work=$FUZZ_TARGET_DIR/corpus/$t
  artifacts=$ROOT/fuzz/artifacts/$t
  mkdir -p "$work" "$artifacts"
  log_file=$FUZZ_TARGET_DIR/$t.log
  log "fuzzing $t for $SECS s (log: $log_file)"
  # -timeout: one input taking over 10 s is a hang worth reporting (a slow parser is a
  # denial of service). -rss_limit_mb: libFuzzer's default of 2 GB, stated.
  # -print_final_stats: the figures the summary below reads.
  set +e
  cargo fuzz run "${BUILD_FLAGS[@]}" "$t" "$work" "$seeds" -- \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log_file" 2>&1
  rc=$?
  set -e
  execs=$(awk '/stat::number_of_executed_units:/ {n = $2} END {print (n == "" ? "?" : n)}' "$log_file")
  # libFuzzer's status lines: "#<execs> <event> cov: <edges> ft: <features> corp: <n>/<size>"
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log_file" | tail -n1 || true)
  if [[ $rc -ne 0 ]]; then
    tail -n 60 "$log_file" >&2
    crash=$(grep -Eo "(crash|leak|timeout|oom|slow-unit)-[0-9a-f]+" "$log_file" | tail -n1 || true)
    die "fuzz target $t failed (exit $rc) after ${execs} executions; crashing input: ${artifacts}/${crash:-?}
reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run ${BUILD_FLAGS[*]} $t ${artifacts}/${crash:-<artifact>}"
  fi
  summary+=("$(printf '%-10s %10s execs  %s' "$t" "$execs" "${cov:-?}")")
done

log "no crashes; $SECS s per target"
printf '%s\n' "${summary[@]}"
