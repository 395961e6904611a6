module docknet/cni

go 1.24.2

require (
	github.com/containernetworking/cni v1.3.1
	github.com/containernetworking/plugins v1.9.1
	golang.org/x/sys v0.35.0
)

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/coreos/go-iptables v0.8.0 // indirect
	github.com/networkplumbing/go-nft v0.4.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/safchain/ethtool v0.6.2 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.opentelemetry.io/otel v1.29.0 // indirect
	go.opentelemetry.io/otel/trace v1.29.0 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)
