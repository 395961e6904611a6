// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// DockNet's flow director: the XDP program on the link the daemon owns. Frames for a pipe's
// address (IPv4 to it, or ARP asking for it or answering it), and VXLAN datagrams (UDP port
// 4789) to the address the daemon's tunnels end at, go to the daemon's AF_XDP socket of the
// queue they arrived on; everything else passes to the host's kernel untouched, so the host
// keeps its own networking.
//
// Maps (the daemon fills them):
//   xsks   queue index -> AF_XDP socket
//   pipes  IPv4 address (network byte order) -> 1, one entry per pipe
//   vteps  IPv4 address (network byte order) -> 1: the link's own, while VXLAN routes exist
//   stats  per-CPU counters: [0] redirected, [1] passed, [2] redirect failed (no socket)
//
// Built by the daemon crate's build script: clang -O2 -g -target bpf.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_QUEUES 64
#define MAX_PIPES 4096
#define MAX_VTEPS 16
#define VXLAN_PORT 4789

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PIPES);
	__type(key, __u32);
	__type(value, __u8);
} pipes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VTEPS);
	__type(key, __u32);
	__type(value, __u8);
} vteps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

enum { REDIRECTED = 0, PASSED = 1, NO_SOCKET = 2 };

// ARP for IPv4 over Ethernet: the fixed part, then sender MAC, sender IP, target MAC, target IP.
struct arp_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[ETH_ALEN];
	__be32 spa;
	__u8 tha[ETH_ALEN];
	__be32 tpa;
} __attribute__((packed));

static __always_inline void count(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &k);
	if (v)
		*v += 1;
}

static __always_inline int pass(void)
{
	count(PASSED);
	return XDP_PASS;
}

// Headers are read from the frame's first buffer: in a multi-buffer frame (the frags program
// below) it holds the frame's first 3.5 KiB or so, far more than Ethernet, IPv4, UDP or ARP take.
static __always_inline int direct(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__be32 dst;

	if ((void *)(eth + 1) > end)
		return pass();
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return pass();
		dst = ip->daddr;
		// a VXLAN datagram to a tunnel end of the daemon's (not a fragment: the daemon
		// takes whole datagrams only, and a fragment's port is not where it seems)
		if (ip->protocol == IPPROTO_UDP && ip->ihl == 5 &&
		    !(ip->frag_off & bpf_htons(0x3fff)) &&
		    bpf_map_lookup_elem(&vteps, &dst)) {
			struct udphdr *udp = (void *)(ip + 1);
			if ((void *)(udp + 1) <= end && udp->dest == bpf_htons(VXLAN_PORT))
				goto redirect;
		}
	} else if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_ipv4 *arp = (void *)(eth + 1);
		if ((void *)(arp + 1) > end || arp->hlen != ETH_ALEN || arp->plen != 4)
			return pass();
		dst = arp->tpa;
	} else {
		return pass();
	}
	if (!bpf_map_lookup_elem(&pipes, &dst))
		return pass();
redirect:;
	// XDP_PASS when no socket sits at this queue (the daemon binds one per queue)
	int act = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	count(act == XDP_REDIRECT ? REDIRECTED : NO_SOCKET);
	return act;
}

// Single-buffer frames: links whose MTU fits a 4 KiB chunk.
SEC("xdp")
int docknet_flow_director(struct xdp_md *ctx)
{
	return direct(ctx);
}

// The same director for links with a larger MTU (jumbo frames): loaded with the kernel's
// multi-buffer flag, so that a frame may come in several buffers (and reach an AF_XDP socket
// bound with XDP_USE_SG as several descriptors).
SEC("xdp.frags")
int docknet_flow_director_frags(struct xdp_md *ctx)
{
	return direct(ctx);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
