#!/usr/bin/env bash
# Installs what DockNet needs on a Debian machine and builds it in release mode.
# Safe to run again: installs only what is missing. Runs as root; a normal user is re-run
# under sudo.
#
#   ./scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"

# command -> Debian package
declare -A NEED=(
    [ip]=iproute2       # namespaces, veth, bridge, lo inside containers
    [umount]=mount      # tests check that containers cannot unmount their covers
    [dd]=coreutils      # the hostile-container test scribbles with dd
    [ps]=procps
    [cc]=gcc            # linker for cargo; AFL++ (scripts/fuzz.sh) is built with it
    [make]=make         # AFL++'s build
    [pkg-config]=pkg-config
    [iptables]=iptables # the CNI portmap plugin (bridge-nat) writes iptables rules
    [nft]=nftables      # bench http --service: kube-proxy's nftables rules
    [sockperf]=sockperf # cross-check of dnperf's latency (bench --crosscheck)
    [iperf3]=iperf3     # cross-check of dnperf's goodput
    [ethtool]=ethtool   # the ovs mode turns off tx checksum offload on its veths
    [ovs-vswitchd]=openvswitch-switch  # the ovs mode (userspace datapath; the lab runs its own)
    [taskset]=util-linux
    [clang]=clang       # builds the XDP flow director (crates/daemon/bpf) in the daemon's build
    [ping]=iputils-ping # the NIC tests check the hosts keep their own traffic
    [tc]=iproute2       # shapes the two-host wire (--wire-rate)
    [wrk]=wrk           # bench http: the HTTP load generator people use, beside docknet-load
    [nginx]=nginx       # bench http: the HTTP server people deploy (kernel modes)
    [curl]=curl         # tests fetch files from servers in containers
    [containerd]=containerd  # the CNI plugin's CRI test runs pods through containerd
    [runc]=runc
    [nsenter]=util-linux
    [tcpdump]=tcpdump   # the capture test reads docknet capture's pcap back
    [redis-server]=redis-server  # unmodified programs over DockNet (docknet run --preload)
    [redis-benchmark]=redis-tools
    [pgbench]=postgresql  # PostgreSQL, whose postmaster forks a backend per connection, and pgbench
    [gunicorn]=gunicorn   # a pre-forked pool of sync workers, a connection per request
    [openvpn]=openvpn   # bench chain's encrypted overlay (VXLAN through a static-key tunnel)
    [valgrind]=valgrind # scripts/instructions.sh counts a round trip's instructions (callgrind)
)
# files -> Debian package
declare -A NEED_FILES=(
    [/usr/lib/cni/bridge]=containernetworking-plugins  # kernel modes are built with CNI
    [/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf]=fonts-dejavu-core  # text in the figures
    [/usr/include/bpf/bpf_helpers.h]=libbpf-dev  # headers of the XDP flow director
)
# extra packages from the caller (scripts/test.sh adds chromium for the report test)
missing=(${DOCKNET_EXTRA_PACKAGES:-})
for cmd in "${!NEED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
for f in "${!NEED_FILES[@]}"; do
    [ -e "$f" ] || missing+=("${NEED_FILES[$f]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "docknet setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup default stable
    else
        echo "docknet setup: no Rust toolchain; installing Debian's (needs Rust >= 1.87)" >&2
        apt-get install -y -qq --no-install-recommends cargo rustc >/dev/null
    fi
fi
if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

cargo build --release --locked

# The CNI plugin (Go, cni/): bin/docknet-cni (also as bin/docknet, the name its type gives it),
# its installer, the node agent that keeps routes to other nodes (bin/docknet-agent), and the reference plugins it works with (host-local, bridge, loopback), built
# from the versions cni/go.mod pins; cnitool for the tests. bin/ is a CNI_PATH.
GO=$(command -v go || true)
[ -n "$GO" ] || [ ! -x /usr/local/go/bin/go ] || GO=/usr/local/go/bin/go
if [ -z "$GO" ]; then
    echo "docknet setup: no Go toolchain; installing Debian's" >&2
    apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    GO=$(command -v go)
fi
# the CRI test's module (k8s.io/cri-api v0.37) needs Go 1.26; an older go (Debian 12 has 1.19)
# fetches that toolchain from the Go module proxy, where it is published as a module
GO_NEED=go1.26.8
if [ "$(printf '%s\n' "$GO_NEED" "$("$GO" env GOVERSION)" | sort -V | head -1)" != "$GO_NEED" ]; then
    echo "docknet setup: $("$GO" env GOVERSION) is too old; fetching $GO_NEED as a module" >&2
    mod=golang.org/toolchain@v0.0.1-$GO_NEED.linux-$("$GO" env GOARCH)
    dir=$(cd /tmp && GOFLAGS=-mod=mod "$GO" mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
    GO=$dir/bin/go
fi
mkdir -p bin
echo "$GO" > bin/.go  # test.sh uses the same toolchain
export GOFLAGS=${GOFLAGS:--mod=readonly}
(
    cd cni
    "$GO" build -trimpath -ldflags='-s -w' -o ../bin/docknet-cni ./cmd/docknet-cni
    "$GO" build -trimpath -ldflags='-s -w' -o ../bin/docknet-cni-install ./cmd/docknet-cni-install
    "$GO" build -trimpath -o ../bin/ \
        github.com/containernetworking/plugins/plugins/ipam/host-local \
        github.com/containernetworking/plugins/plugins/main/bridge \
        github.com/containernetworking/plugins/plugins/main/loopback
)
# the node agent (its own module: client-go stays out of the plugin's)
(cd cni/agent && "$GO" build -trimpath -ldflags='-s -w' -o ../../bin/docknet-agent ./cmd/docknet-agent)
ln -sf docknet-cni bin/docknet
[ -x bin/cnitool ] || GOBIN=$PWD/bin "$GO" install github.com/containernetworking/cni/cnitool@v1.3.1
