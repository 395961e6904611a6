#!/bin/sh
# Builds a real Kubernetes API server and its storage into bin/, for the node agent's
# end-to-end test (cni/agent, run by scripts/test.sh): kube-apiserver from k8s.io/kubernetes
# at the version cni/k8s-api/go.mod pins, and kine (etcd's API over SQLite, as k3s uses it),
# both from the Go module proxy. Cached: what is already in bin/ is kept (remove it to rebuild),
# and a copy waits in ~/.cache/docknet for the next clone.
# A fresh machine takes about 5 minutes on 2 cores; the Go build cache makes it seconds after.
set -eu
cd "$(dirname "$0")/.."
case "${1:-}" in
    -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
GO=$(cat bin/.go 2>/dev/null || command -v go)
mkdir -p bin
KINE=v0.17.5
# the binaries are also kept in the user's cache, by what they are built from (the pinned
# modules and the toolchain), so a fresh clone (CI's) copies them instead of linking again
key=$( (cat cni/k8s-api/go.sum; echo "$KINE"; "$GO" env GOVERSION) | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/docknet/k8s-api-$key
for b in kube-apiserver kine; do
    [ -x "bin/$b" ] || [ ! -x "$cache/$b" ] || cp "$cache/$b" "bin/$b"
done
if [ ! -x bin/kube-apiserver ]; then
    echo "k8s-api: building kube-apiserver (cni/k8s-api)" >&2
    (cd cni/k8s-api && GOFLAGS=-mod=readonly "$GO" build -trimpath -ldflags='-s -w' \
        -o ../../bin/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver)
fi
if [ ! -x bin/kine ]; then
    echo "k8s-api: building kine" >&2
    GOBIN=$PWD/bin "$GO" install -trimpath -ldflags='-s -w' "github.com/k3s-io/kine@$KINE"
fi
mkdir -p "$cache" 2>/dev/null && for b in kube-apiserver kine; do
    [ -x "$cache/$b" ] || { cp "bin/$b" "$cache/$b.tmp.$$" && mv -f "$cache/$b.tmp.$$" "$cache/$b"; }
done 2>/dev/null || true
