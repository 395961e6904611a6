// Command dnsd is the CRI test's cluster DNS: a name server on kernel UDP sockets that
// answers A questions for the names it is given and NXDOMAIN for every other name, as a
// cluster's DNS answers for names it has no record of. It runs in the node's network
// namespace (as a hostNetwork DNS pod, or NodeLocal DNSCache, does), behind a DockNet
// Service. It prints one line per question to stderr.
//
//	dnsd --listen 192.168.81.1:53 web.ns.svc.cluster.local=10.96.0.20 ...
package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

func main() {
	listen := flag.String("listen", "", "address and port to answer on (UDP)")
	flag.Parse()
	records := map[string][4]byte{}
	for _, r := range flag.Args() {
		name, addr, ok := strings.Cut(r, "=")
		a, err := netip.ParseAddr(addr)
		if !ok || err != nil || !a.Is4() {
			fmt.Fprintf(os.Stderr, "dnsd: %q is not NAME=IPV4\n", r)
			os.Exit(2)
		}
		records[strings.ToLower(strings.TrimSuffix(name, "."))+"."] = a.As4()
	}
	conn, err := net.ListenPacket("udp4", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dnsd: %v\n", err)
		os.Exit(1)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dnsd: %v\n", err)
			os.Exit(1)
		}
		answer, what := reply(buf[:n], records)
		fmt.Fprintf(os.Stderr, "dnsd: from %v: %s\n", from, what)
		if answer != nil {
			_, _ = conn.WriteTo(answer, from)
		}
	}
}

// reply answers one question: its A record, or NXDOMAIN for a name it has no record of (with
// no records of any other type). nil for what is not one question.
func reply(b []byte, records map[string][4]byte) ([]byte, string) {
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil || h.Response {
		return nil, "not a question"
	}
	q, err := p.Question()
	if err != nil {
		return nil, "no question"
	}
	name := strings.ToLower(q.Name.String())
	addr, known := records[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	out := dnsmessage.NewBuilder(nil, rh)
	out.EnableCompression()
	if err := out.StartQuestions(); err != nil {
		return nil, err.Error()
	}
	if err := out.Question(q); err != nil {
		return nil, err.Error()
	}
	if err := out.StartAnswers(); err != nil {
		return nil, err.Error()
	}
	what := fmt.Sprintf("%s %v: no such name", name, q.Type)
	if known && q.Type == dnsmessage.TypeA {
		if err := out.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: addr}); err != nil {
			return nil, err.Error()
		}
		what = fmt.Sprintf("%s A: %v", name, netip.AddrFrom4(addr))
	} else if known {
		what = fmt.Sprintf("%s %v: no record of that type", name, q.Type)
	}
	msg, err := out.Finish()
	if err != nil {
		return nil, err.Error()
	}
	return msg, what
}
