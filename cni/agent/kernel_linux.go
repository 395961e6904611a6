package agent

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
)

// Netlink is the node's main routing table through netlink (the agent's network namespace:
// the node's, where the DaemonSet runs it with hostNetwork and NET_ADMIN).
type Netlink struct{}

// Owned lists the main table's IPv4 routes of protocol KernelProto.
func (Netlink) Owned() (map[string]string, error) {
	filter := &netlink.Route{Table: 254, Protocol: KernelProto}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range routes {
		if r.Dst == nil || r.Gw == nil {
			continue
		}
		out[r.Dst.String()] = r.Gw.String()
	}
	return out, nil
}

func route(dst, via string) (*netlink.Route, error) {
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		return nil, err
	}
	gw := net.ParseIP(via).To4()
	if gw == nil {
		return nil, fmt.Errorf("%q is not an IPv4 address", via)
	}
	// no device: the kernel takes the one its route to the gateway names (the link)
	return &netlink.Route{Dst: n, Gw: gw, Table: 254, Protocol: KernelProto}, nil
}

// Add adds the route; the kernel refuses it (EEXIST) where the table has a route to the same
// network already.
func (Netlink) Add(dst, via string) error {
	r, err := route(dst, via)
	if err != nil {
		return err
	}
	if err := netlink.RouteAdd(r); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return errors.New("the node has a route to that network already, not the agent's: left as it is")
		}
		return err
	}
	return nil
}

// Change points the agent's route to the same network through the new gateway.
func (Netlink) Change(dst, via string) error {
	r, err := route(dst, via)
	if err != nil {
		return err
	}
	return netlink.RouteChange(r)
}

// Delete removes the route.
func (Netlink) Delete(dst, via string) error {
	r, err := route(dst, via)
	if err != nil {
		return err
	}
	return netlink.RouteDel(r)
}
