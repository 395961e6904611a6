// Package daemon is a client of the DockNet daemon's control socket: one JSON request and one
// JSON reply per line over a Unix socket (crates/daemon/src/proto.rs is the other side).
//
// Every reply is read with a bound on its size and every call with a deadline, so a daemon
// that hangs or misbehaves cannot hang the plugin (a container runtime waits for it).
package daemon

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// ProtocolVersion is the control protocol version this client speaks.
const ProtocolVersion = 1

// DefaultSocket is the daemon's control socket unless configured otherwise.
const DefaultSocket = "/run/docknet/docknetd.sock"

// maxReply bounds one reply line (a pipe list of thousands of pipes fits).
const maxReply = 16 << 20

// Error codes the daemon answers with (proto.rs ErrorCode).
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeExists     = "exists"
	CodeBadName    = "bad_name"
	CodeBadIP      = "bad_ip"
	CodeIPInUse    = "ip_in_use"
	CodeBadParams  = "bad_params"
	CodeInternal   = "internal"
	CodeBusy       = "busy"
)

// APIError is a refusal from the daemon.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string { return e.Message }

// UnavailableError says the daemon did not answer: no socket, nobody listening (it is
// restarting), a time-out, or busy for longer than the client's patience.
type UnavailableError struct {
	Socket string
	Err    error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("docknet daemon not answering at %s: %v", e.Socket, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// IsCode reports whether err is the daemon's refusal with the given code.
func IsCode(err error, code string) bool {
	var a *APIError
	return errors.As(err, &a) && a.Code == code
}

// Client talks to one daemon. Each call opens its own connection (the plugin makes a handful
// of calls per run), so a daemon restart between calls is survived.
type Client struct {
	Socket string
	// Timeout bounds each call (connect, write, read).
	Timeout time.Duration
	// Patience bounds how long a `busy` daemon is asked again.
	Patience time.Duration
}

// New returns a client of the daemon at socket with the plugin's default bounds.
func New(socket string) *Client {
	return &Client{Socket: socket, Timeout: 10 * time.Second, Patience: 5 * time.Second}
}

type reply struct {
	V      int             `json:"v"`
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *APIError       `json:"error"`
}

// Call sends one request (its "op" and fields; "v" is added) and decodes the result into out
// (which may be nil). A `busy` daemon is asked again, backing off from 5 ms to 200 ms, for up
// to Patience.
func (c *Client) Call(req map[string]any, out any) error {
	start := time.Now()
	pause := 5 * time.Millisecond
	for {
		err := c.callOnce(req, out)
		if IsCode(err, CodeBusy) {
			if time.Since(start) >= c.Patience {
				return &UnavailableError{Socket: c.Socket, Err: err}
			}
			time.Sleep(pause)
			pause = min(pause*2, 200*time.Millisecond)
			continue
		}
		return err
	}
}

func (c *Client) callOnce(req map[string]any, out any) error {
	unavailable := func(err error) error { return &UnavailableError{Socket: c.Socket, Err: err} }
	line := map[string]any{"v": ProtocolVersion}
	for k, v := range req {
		line[k] = v
	}
	body, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("encoding a request: %w", err)
	}
	conn, err := net.DialTimeout("unix", c.Socket, c.Timeout)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) ||
			errors.Is(err, syscall.ENOENT) {
			return unavailable(errors.New("no daemon listening (not started, or restarting)"))
		}
		return unavailable(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(c.Timeout))
	// a daemon at its limit writes `busy` and closes without reading: the write may fail and
	// the reply still says why
	_, werr := conn.Write(append(body, '\n'))
	rd := bufio.NewReaderSize(conn, 64<<10)
	buf, rerr := readLine(rd, maxReply)
	if len(buf) == 0 {
		if werr != nil {
			return unavailable(werr)
		}
		if rerr != nil {
			return unavailable(rerr)
		}
		return unavailable(errors.New("connection closed without a reply"))
	}
	var rep reply
	if err := json.Unmarshal(buf, &rep); err != nil {
		return fmt.Errorf("daemon sent an unreadable reply: %w", err)
	}
	if !rep.OK {
		if rep.Error == nil {
			return errors.New("daemon sent an error without details")
		}
		return rep.Error
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rep.Result, out); err != nil {
		return fmt.Errorf("daemon sent an unreadable result: %w", err)
	}
	return nil
}

// readLine reads one '\n'-terminated line of at most limit bytes (without the newline). A
// reply cut short by the end of the connection is returned as read, with the error.
func readLine(rd *bufio.Reader, limit int) ([]byte, error) {
	var out []byte
	for {
		chunk, err := rd.ReadSlice('\n')
		out = append(out, chunk...)
		if len(out) > limit {
			return nil, fmt.Errorf("reply longer than %d bytes", limit)
		}
		switch {
		case err == nil:
			return out[:len(out)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return out, err
		}
	}
}

// Pipe is a pipe as the daemon reports it.
type Pipe struct {
	Name         string            `json:"name"`
	IP           string            `json:"ip"`
	IP6          string            `json:"ip6,omitempty"`
	MAC          string            `json:"mac"`
	MTU          uint32            `json:"mtu"`
	RingDepth    uint32            `json:"ring_depth"`
	Socket       *string           `json:"socket"`
	Connections  int               `json:"connections"`
	FastChannels []string          `json:"fast_channels"`
	Labels       map[string]string `json:"labels"`
}

// Status is what the daemon says about itself (the fields the plugin uses).
type Status struct {
	Protocol int    `json:"protocol"`
	Version  string `json:"version"`
	PID      int    `json:"pid"`
	Pipes    int    `json:"pipes"`
}

// RateDir is one direction of a pipe's limits.
type RateDir struct {
	RateBps   uint64 `json:"rate_bps"`
	BurstBits uint64 `json:"burst_bits"`
}

// RateInfo is a pipe's rate limits.
type RateInfo struct {
	Pipe       string   `json:"pipe"`
	EgressBps  *uint64  `json:"egress_bps"`
	IngressBps *uint64  `json:"ingress_bps"`
	Egress     *RateDir `json:"egress"`
	Ingress    *RateDir `json:"ingress"`
}

// Status asks the daemon who it is.
func (c *Client) Status() (*Status, error) {
	var s Status
	return &s, c.Call(map[string]any{"op": "status"}, &s)
}

// PipeCreate creates a pipe with labels; with cidr6 (not empty) a dual-stack one.
func (c *Client) PipeCreate(name, cidr, cidr6 string, mtu uint32, labels map[string]string) (*Pipe, error) {
	req := map[string]any{"op": "pipe_create", "name": name, "ip": cidr, "labels": labels}
	if cidr6 != "" {
		req["ip6"] = cidr6
	}
	if mtu != 0 {
		req["mtu"] = mtu
	}
	var p Pipe
	return &p, c.Call(req, &p)
}

// PipeShow returns one pipe.
func (c *Client) PipeShow(name string) (*Pipe, error) {
	var p Pipe
	return &p, c.Call(map[string]any{"op": "pipe_show", "name": name}, &p)
}

// PipeLs lists every pipe.
func (c *Client) PipeLs() ([]Pipe, error) {
	// (the call first: the order of `return ps, c.Call(.., &ps)`'s operands is unspecified)
	var ps []Pipe
	err := c.Call(map[string]any{"op": "pipe_ls"}, &ps)
	return ps, err
}

// PipeRm removes a pipe with its fast channels and its socket.
func (c *Client) PipeRm(name string) error {
	return c.Call(map[string]any{"op": "pipe_rm", "name": name}, nil)
}

// PipeAttach binds the pipe's abstract socket (without '@') in the network namespace at netns.
func (c *Client) PipeAttach(name, netns, socket string) error {
	return c.Call(map[string]any{"op": "pipe_attach", "name": name, "netns": netns, "socket": socket}, nil)
}

// RateSet sets the directions given (nil: left as they are).
func (c *Client) RateSet(name string, egress, ingress, egressBurst, ingressBurst *uint64) (*RateInfo, error) {
	req := map[string]any{"op": "rate_set", "name": name}
	for k, v := range map[string]*uint64{
		"egress_bps": egress, "ingress_bps": ingress,
		"egress_burst_bits": egressBurst, "ingress_burst_bits": ingressBurst,
	} {
		if v != nil {
			req[k] = *v
		}
	}
	var r RateInfo
	return &r, c.Call(req, &r)
}

// RateShow returns a pipe's limits.
func (c *Client) RateShow(name string) (*RateInfo, error) {
	var r RateInfo
	return &r, c.Call(map[string]any{"op": "rate_show", "name": name}, &r)
}

// FcConnect builds a fast channel between two pipes.
func (c *Client) FcConnect(a, b string) error {
	return c.Call(map[string]any{"op": "fc_connect", "a": a, "b": b}, nil)
}

// Route is a route to a network beyond the link, as the daemon reports it.
type Route struct {
	Net string `json:"net"`
	Via string `json:"via"`
	// Vxlan is the network identifier of a route through a VXLAN tunnel to Via (nil: plain).
	Vxlan *uint32 `json:"vxlan,omitempty"`
}

// RouteLs lists the daemon's routes.
func (c *Client) RouteLs() ([]Route, error) {
	var rs []Route
	err := c.Call(map[string]any{"op": "route_ls"}, &rs)
	return rs, err
}

// RouteAdd adds a route to network (A.B.C.D/LEN) through next hop via, or through a VXLAN
// tunnel to via with network identifier *vxlan when vxlan is not nil.
func (c *Client) RouteAdd(network, via string, vxlan *uint32) error {
	req := map[string]any{"op": "route_add", "net": network, "via": via}
	if vxlan != nil {
		req["vxlan"] = *vxlan
	}
	return c.Call(req, nil)
}

// RouteRm removes the route to network.
func (c *Client) RouteRm(network string) error {
	return c.Call(map[string]any{"op": "route_rm", "net": network}, nil)
}

// Service is a service as the daemon reports it: a virtual address and port balanced over
// backends.
type Service struct {
	Name     string   `json:"name"`
	Address  string   `json:"address"`
	Proto    string   `json:"proto"`
	Backends []string `json:"backends"`
	Affinity string   `json:"affinity"`
}

// ServiceLs lists the daemon's services.
func (c *Client) ServiceLs() ([]Service, error) {
	var ss []Service
	err := c.Call(map[string]any{"op": "service_ls"}, &ss)
	return ss, err
}

// ServiceSet adds or replaces a service.
func (c *Client) ServiceSet(s Service) error {
	backends := s.Backends
	if backends == nil {
		backends = []string{}
	}
	return c.Call(map[string]any{
		"op": "service_set", "name": s.Name, "address": s.Address, "proto": s.Proto,
		"backends": backends, "affinity": s.Affinity,
	}, nil)
}

// ServiceRm removes a service.
func (c *Client) ServiceRm(name string) error {
	return c.Call(map[string]any{"op": "service_rm", "name": name}, nil)
}
