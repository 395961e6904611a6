// Command docknet-cni is DockNet's CNI plugin (spec 1.1). A container runtime runs it with
// CNI_COMMAND and friends in the environment and the network configuration on stdin; it is
// installed under the name of its type, "docknet".
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"docknet/cni/internal/plugin"
)

// Supported lists the CNI spec versions spoken (GC and STATUS need 1.1.0).
var Supported = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	switch os.Getenv("CNI_COMMAND") {
	case "ADD", "DEL", "CHECK", "GC", "STATUS":
		if err := boundStdin(plugin.MaxConfig); err != nil {
			_ = err.Print()
			os.Exit(1)
		}
	}
	skel.PluginMainFuncs(plugin.Funcs(), Supported, "docknet-cni: DockNet pipes for pods (CNI plugin)")
}

// boundStdin reads at most limit bytes of configuration and hands skel (which reads stdin
// whole) those bytes through a pipe, so an endless stdin cannot exhaust a root process.
func boundStdin(limit int) *types.Error {
	data, err := io.ReadAll(io.LimitReader(os.Stdin, int64(limit)+1))
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("reading the configuration from stdin: %v", err), "")
	}
	if len(data) > limit {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid network configuration: longer than %d bytes", limit), "")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("pipe: %v", err), "")
	}
	go func() {
		_, _ = w.Write(data)
		_ = w.Close()
	}()
	os.Stdin = r
	return nil
}
