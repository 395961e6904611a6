package agent

import (
	"context"
	"fmt"
	"net/netip"
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
	// Log receives one line per change, skipped node and failure.
	Log func(string)
	// Self, when set, is called with this node (when the source has it) before the routes
	// are reconciled: the CNI configuration follows the node's own pod network.
	OnSelf func(Node) error
}

// Sync reconciles once: the source's nodes into the daemon's routes.
func Sync(cfg Config, src Source, d Daemon) ([]Change, error) {
	nodes, err := src.Nodes()
	if err != nil {
		return nil, fmt.Errorf("reading the nodes: %w", err)
	}
	want, skipped := Desired(cfg.Self, nodes, cfg.Cluster)
	for _, s := range skipped {
		cfg.log("skipped: " + s)
	}
	changes, err := Reconcile(d, want, cfg.Cluster)
	for _, c := range changes {
		cfg.log(fmt.Sprintf("route %s %s via %s", c.Op, c.Net, c.Via))
	}
	return changes, err
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

// Run keeps the daemon's routes equal to the source's nodes until ctx ends: at start, at every
// change, every Resync, and again after a failure (backing off from 100 ms to 5 s while the
// daemon does not answer). Skipped nodes are logged once per change of what is skipped.
func Run(ctx context.Context, cfg Config, src Source, d Daemon) error {
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	resync := time.NewTicker(cfg.Resync)
	defer resync.Stop()
	backoff := 100 * time.Millisecond
	var retry <-chan time.Time
	lastSkipped := ""
	quiet := cfg
	quiet.Log = func(s string) {
		if len(s) > 9 && s[:9] == "skipped: " {
			return
		}
		cfg.log(s)
	}
	for {
		nodes, err := src.Nodes()
		if err == nil {
			_, skipped := Desired(cfg.Self, nodes, cfg.Cluster)
			joined := fmt.Sprint(skipped)
			if joined != lastSkipped {
				for _, s := range skipped {
					cfg.log("skipped: " + s)
				}
				lastSkipped = joined
			}
			err = cfg.self(nodes)
			if err == nil {
				_, err = Sync(quiet, staticNodes(nodes), d)
			}
		}
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
		case <-src.Changed():
		case <-resync.C:
		case <-retry:
		}
	}
}

// staticNodes is a Source of nodes already read.
type staticNodes []Node

func (s staticNodes) Nodes() ([]Node, error)   { return s, nil }
func (s staticNodes) Changed() <-chan struct{} { return nil }
