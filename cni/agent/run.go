package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Source gives the cluster's nodes and says when they may have changed.
type Source interface {
	// Nodes returns the nodes as the source knows them now.
	Nodes() ([]Node, error)
	// Changed is signalled (coalesced) when the nodes may have changed.
	Changed() <-chan struct{}
}

// Config is what Run needs besides its source and daemon.
type Config struct {
	// Self is this node's name (its own pod network is local, not routed).
	Self string
	// Cluster is the cluster's pod network: the agent owns the routes inside it.
	Cluster netip.Prefix
	// Resync is how often the routes are checked again without a change (a route removed
	// by hand comes back).
	Resync time.Duration
	// Log receives one line per change, skipped node, refused route and failure.
	Log func(string)
	// OnSelf, when set, is called with this node (when the source has it) at every pass: the
	// CNI configuration follows the node's own pod network. Its failure does not stop the
	// routes from being reconciled.
	OnSelf func(Node) error
	// Vxlan, when set, routes the other nodes' pod networks through VXLAN tunnels to their
	// addresses with this network identifier (nodes that share no link), not on the link.
	Vxlan *uint32
	// NoRoutes leaves the daemon's routes alone (a daemon on a link to the node's own kernel
	// keeps none: the node routes): a pass does only OnSelf.
	NoRoutes bool
	// Kernel, when set, also keeps the node's own kernel routes to the other nodes' pod
	// networks through their addresses (ReconcileKernel).
	Kernel KernelRoutes
}

// Pass is what one pass found and did.
type Pass struct {
	// Changes made to the daemon's routes.
	Changes []Change
	// Skipped nodes and networks, with the reason.
	Skipped []string
	// Routes the daemon refused.
	Refused []string
	// Changes made to the node's kernel routes (Config.Kernel).
	Kernel []string
}

// Sync makes one pass: this node's configuration (OnSelf), then the source's nodes into the
// daemon's routes. The error says the nodes could not be read, the daemon could not be asked,
// or OnSelf failed; what could be done was done.
func Sync(cfg Config, src Source, d Daemon) (Pass, error) {
	nodes, err := src.Nodes()
	if err != nil {
		return Pass{}, fmt.Errorf("reading the nodes: %w", err)
	}
	var errs []error
	if err := cfg.self(nodes); err != nil {
		errs = append(errs, err)
	}
	if cfg.NoRoutes {
		return Pass{}, errors.Join(errs...)
	}
	want, skipped := Desired(cfg.Self, nodes, cfg.Cluster)
	changes, refused, err := Reconcile(d, want, cfg.Cluster, cfg.Vxlan)
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range changes {
		cfg.log(c.String())
	}
	var kernel []string
	if cfg.Kernel != nil {
		lines, no, err := ReconcileKernel(cfg.Kernel, want, cfg.Cluster)
		if err != nil {
			errs = append(errs, err)
		}
		for _, l := range lines {
			cfg.log(l)
		}
		kernel = lines
		refused = append(refused, no...)
	}
	return Pass{Changes: changes, Skipped: skipped, Refused: refused, Kernel: kernel}, errors.Join(errs...)
}

func (c Config) self(nodes []Node) error {
	if c.OnSelf == nil {
		return nil
	}
	for _, n := range nodes {
		if n.Name == c.Self {
			return c.OnSelf(n)
		}
	}
	return nil
}

func (c Config) log(s string) {
	if c.Log != nil {
		c.Log(s)
	}
}

// Run keeps the daemon's routes equal to the source's nodes until ctx ends: a pass at start,
// at every change, every Resync, and again after a failure (backing off from 100 ms to 5 s
// while the nodes cannot be read or the daemon does not answer). Skipped nodes and refused
// routes are logged when they change, not at every pass.
func Run(ctx context.Context, cfg Config, src Source, d Daemon) error {
	return keep(ctx, cfg, src.Changed(), func() (Pass, error) { return Sync(cfg, src, d) })
}

// RunServices keeps the daemon's services equal to the source's Services and EndpointSlices
// until ctx ends, the way Run keeps the routes (the same passes, backoff and logging).
func RunServices(ctx context.Context, cfg Config, src ServiceSource, d ServiceDaemon) error {
	return keep(ctx, cfg, src.ServicesChanged(), func() (Pass, error) { return SyncServices(src, d, cfg.Log) })
}

// keep runs pass at start, whenever changed is signalled, every cfg.Resync, and again after a
// failure (backing off from 100 ms to 5 s), until ctx ends.
func keep(ctx context.Context, cfg Config, changed <-chan struct{}, pass func() (Pass, error)) error {
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	resync := time.NewTicker(cfg.Resync)
	defer resync.Stop()
	backoff := 100 * time.Millisecond
	var retry <-chan time.Time
	said := map[string]string{}
	once := func(kind string, lines []string) {
		joined := strings.Join(lines, "\n")
		if said[kind] == joined {
			return
		}
		said[kind] = joined
		for _, l := range lines {
			cfg.log(kind + ": " + l)
		}
	}
	for {
		p, err := pass()
		once("skipped", p.Skipped)
		once("refused", p.Refused)
		if err != nil {
			cfg.log(fmt.Sprintf("failed: %v (again in %v)", err, backoff))
			retry = time.After(backoff)
			backoff = min(backoff*2, 5*time.Second)
		} else {
			retry = nil
			backoff = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-resync.C:
		case <-retry:
		}
	}
}

// staticNodes is a Source of nodes already read.
type staticNodes []Node

func (s staticNodes) Nodes() ([]Node, error)   { return s, nil }
func (s staticNodes) Changed() <-chan struct{} { return nil }
