// Command docknet-cni-install is what the DaemonSet's init container runs (like Calico's
// install-cni): it copies the plugin binaries onto the node and writes DockNet's network
// configuration. `docknet-cni-install --help` lists the options. (A binary of its own, so the
// plugin, which a runtime starts for every pod, does not load the installer's packages.)
package main

import (
	"os"

	"docknet/cni/internal/install"
)

func main() {
	os.Exit(install.Main(os.Args[1:], os.Stdout, os.Stderr))
}
