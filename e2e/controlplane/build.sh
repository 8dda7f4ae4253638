#!/usr/bin/env bash
# Builds the e2e control plane (etcd, kube-apiserver, kube-controller-manager) from Go modules
# into a cache directory outside the repository, and prints that bin directory on stdout.
#
#   ${HOOKD_CONTROLPLANE_CACHE:-$HOME/.cache/hookd/controlplane}/<key>/bin
#
# The key hashes the two modules' go.mod/go.sum (and etcd's main.go) and the Go version, so a
# version bump builds afresh and anything else is a no-op. Go's own module and build caches make
# a rebuild after a key change incremental. Progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${HOOKD_CONTROLPLANE_CACHE:-$HOME/.cache/hookd/controlplane}"

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
# The toolchain on the machine builds; a go directive newer than it is an error, not a download.
export GOTOOLCHAIN=local

# The release the servers report (/version, kubectl version): upstream's build stamps it
# with -X; without it they say v0.0.0-master.
k8s_version=$(sed -n 's#^require k8s.io/kubernetes \(v[0-9.]*\).*#\1#p' "$here/k8s/go.mod")
[[ -n "$k8s_version" ]] || { echo "build.sh: no k8s.io/kubernetes version in k8s/go.mod" >&2; exit 1; }
k8s_minor=$(cut -d. -f2 <<<"$k8s_version")
v=k8s.io/component-base/version
k8s_ldflags="-X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$k8s_minor -X $v.gitTreeState=clean"

key="$(
  {
    go env GOVERSION
    echo "$k8s_ldflags"
    for f in k8s/go.mod k8s/go.sum etcd/go.mod etcd/go.sum etcd/main.go; do
      echo "$f"
      cat "$here/$f"
    done
  } | sha256sum | cut -c1-16
)"
dir="$cache_root/$key"
bins=(etcd kube-apiserver kube-controller-manager)

complete() {
  local b
  for b in "${bins[@]}"; do [ -x "$dir/bin/$b" ] || return 1; done
}

if complete; then
  echo "$dir/bin"
  exit 0
fi

mkdir -p "$cache_root"
# One build at a time per cache (two suite runs on one machine would both build otherwise).
exec 9>"$cache_root/.lock"
flock -w 7200 9 || { echo "build.sh: timed out waiting for another build" >&2; exit 1; }
if complete; then
  echo "$dir/bin"
  exit 0
fi

tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
flags=(-trimpath "-ldflags=-s -w")
start=$SECONDS
echo "build.sh: building the control plane into $dir (cold: module download + build, tens of minutes)" >&2
(cd "$here/etcd" && nice -n 10 go build "${flags[@]}" -o "$tmp/etcd" .)
echo "build.sh: etcd built after $((SECONDS - start)) s" >&2
(cd "$here/k8s" && nice -n 10 go build -trimpath "-ldflags=-s -w $k8s_ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
echo "build.sh: kube-apiserver and kube-controller-manager built after $((SECONDS - start)) s" >&2

mkdir -p "$dir"
rm -rf "$dir/bin"
mv "$tmp" "$dir/bin"
trap - EXIT
chmod 755 "$dir/bin"
echo "$dir/bin"
