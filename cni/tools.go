//go:build tools

// Package tools pins the reference CNI plugins that setup.sh builds from this module (the
// IPAM plugin docknet-cni delegates to, and bridge and loopback for the chained mode and for
// containerd), at the same version as the packages the plugin imports.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
