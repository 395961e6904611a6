//! The daemon's link to the wire: a NIC driven through AF_XDP (with an XDP flow director) or
//! AF_PACKET, moved by the master thread like one more pipe.
//!
//! - [`link`]: the link's facts (index, MAC, MTU, state, queues) and one-line errors;
//! - [`xdp`] and [`packet`]: the two [`Port`]s;
//! - [`wire`]: what a frame goes through at the edge (checksums, MSS, addresses, ARP), pure;
//! - [`neigh`]: the neighbours on the wire;
//! - [`vxlan`]: tunnels to nodes that share no link, pure;
//! - [`offload`]: large TCP segments to and from a port that offloads, pure;
//! - [`host`]: a link to the node's own kernel, made by the daemon;
//! - [`guard`]: keeps the host's kernel from taking in the daemon's frames on a packet socket's link.
//!
//! [`Edge`] is what the master holds: the port, the link, the neighbours and the counters.
//! Frames from a pipe to an address no pipe owns leave through it ([`Edge::send`]); frames
//! arriving for a pipe are checked and delivered ([`Edge::recv`]). The daemon answers ARP for
//! its pipes on the wire with the link's MAC and resolves neighbours itself: a frame's
//! destination, or the next hop of the route covering it ([`crate::route`]).

pub mod guard;
pub mod host;
pub mod link;
pub mod neigh;
pub mod offload;
pub mod packet;
pub mod vxlan;
pub mod wire;
pub mod xdp;

use crate::route::Hop;
use crate::switch::FlowTable;
use docknet_pipe::region::{KernelSrc, Region};
use link::LinkInfo;
use neigh::{Neighbours, Next};
use offload::Offload;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use wire::{Arp, WireDrop};

/// How the daemon drives the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NicMode {
    /// AF_XDP where the driver moves frames without copying them (zero-copy), else AF_PACKET
    /// with segment offload: in copy mode AF_XDP copies every frame as AF_PACKET does, but
    /// cannot carry large segments (docs/design.md §5a).
    Auto,
    /// AF_XDP sockets behind an XDP flow director.
    Xdp,
    /// An AF_PACKET socket (works on any link), with segment offload where the kernel has it.
    Packet,
}

impl FromStr for NicMode {
    type Err = String;
    fn from_str(s: &str) -> Result<NicMode, String> {
        match s {
            "auto" => Ok(NicMode::Auto),
            "xdp" => Ok(NicMode::Xdp),
            "packet" => Ok(NicMode::Packet),
            _ => Err(format!("unknown NIC mode {s:?}: use auto, xdp or packet")),
        }
    }
}

impl std::fmt::Display for NicMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NicMode::Auto => "auto",
            NicMode::Xdp => "xdp",
            NicMode::Packet => "packet",
        })
    }
}

/// What the daemon was asked to drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    /// Interface name.
    pub iface: String,
    /// How.
    pub mode: NicMode,
    /// AF_XDP sockets to bind (queues 0..N); `None`: every receive queue of the link.
    pub queues: Option<u32>,
}

/// Why the link could not be driven.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    /// The link itself.
    #[error(transparent)]
    Link(#[from] link::LinkError),
    /// Setting up the port.
    #[error("{0}")]
    Setup(String),
}

/// A port's fixed facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// `xdp` or `packet`.
    pub mode: &'static str,
    /// Receive queues served.
    pub queues: u32,
    /// How the XDP program is attached: `native`, `generic` (or `-`).
    pub attach: String,
    /// `copy` or `zero-copy`.
    pub copy: String,
    /// Longest frame the port moves.
    pub max_frame: usize,
    /// Segment offload: TCP segments longer than the MTU leave whole, cut by the kernel or the
    /// NIC, and coalesced ones arrive whole ([`offload`]).
    #[serde(default)]
    pub offload: bool,
}

/// A port's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// Frames received from the link.
    pub rx_frames: u64,
    /// Frames queued for the link.
    pub tx_frames: u64,
    /// Bytes of those.
    pub tx_bytes: u64,
    /// Frames dropped for want of room: the tx ring or queue full (AF_PACKET), no transmit
    /// slot free (AF_XDP).
    pub tx_ring_full: u64,
    /// Frames the kernel took with their payload straight from the pipe's ring
    /// ([`Port::send_split`], AF_PACKET; those it refused are in `tx_ring_full`).
    #[serde(default)]
    pub tx_split: u64,
    /// Transmissions the kernel reported complete (AF_XDP).
    pub tx_completed: u64,
    /// `sendto` kicks of the tx ring (AF_XDP).
    pub tx_kicks: u64,
    /// Receive descriptors outside the port's memory, and multi-buffer frames (AF_XDP) refused
    /// for one (or for more bytes than the link's frame).
    pub rx_bad_desc: u64,
    /// AF_XDP: completions of no transmit in flight (none expected from the kernel).
    #[serde(default)]
    pub tx_bad_completion: u64,
    /// Times the kernel said it lost frames (AF_PACKET ring full).
    pub rx_ring_losing: u64,
    /// Frames the flow director sent to the daemon (AF_XDP).
    pub director_redirected: u64,
    /// Frames it passed to the host's kernel.
    pub director_passed: u64,
    /// Frames for a pipe it passed because no socket sat at their queue.
    pub director_no_socket: u64,
    /// AF_XDP: frames the kernel dropped for the sockets (rx ring full, no fill buffers).
    pub xsk_rx_dropped: u64,
    /// AF_XDP: times the rx ring was full.
    pub xsk_rx_ring_full: u64,
    /// AF_XDP: times the fill ring was empty.
    pub xsk_fill_ring_empty: u64,
    /// AF_XDP: invalid tx descriptors.
    pub xsk_tx_invalid: u64,
}

/// Frames from this many bytes on leave through [`Port::send_split`] where the port can: the
/// copy saved is worth more than the system call of their own.
const SPLIT_FROM: usize = 8192;

/// A received frame.
#[derive(Debug)]
pub struct Rx<'a> {
    /// Its bytes (the port's memory, ours until `recv` returns).
    pub frame: &'a mut [u8],
    /// The sender's kernel left the checksum to offload (AF_PACKET on a virtual link).
    pub csum_partial: bool,
    /// The kernel (or the NIC) verified the checksums (AF_PACKET).
    pub csum_valid: bool,
}

/// What writes a frame for [`Port::send`].
pub type Fill<'a> = dyn FnMut(&mut [u8]) -> Option<(usize, Offload)> + 'a;

/// A way to move frames to and from the link. Used by the master thread only.
pub trait Port: Send + std::fmt::Debug {
    /// Fixed facts.
    fn info(&self) -> &PortInfo;
    /// Whether a frame is waiting (cheap; decides whether the master may sleep).
    fn rx_ready(&self) -> bool;
    /// Receives up to `max` frames, handing each to `f`. Returns how many.
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Rx<'_>)) -> usize;
    /// Queues one frame: `fill` writes it into a buffer of up to `max_len` bytes and returns
    /// its length and what the link must finish in it (`None`: nothing to send; a port without
    /// [`PortInfo::offload`] is only ever asked for [`Offload::NONE`]). False when there was no
    /// room or nothing was sent.
    fn send(&mut self, max_len: usize, fill: &mut Fill<'_>) -> bool;
    /// Sends one frame at once, after what is queued: `head` (its headers, readied in the
    /// daemon's memory) and then `tail` (its payload, copied by the kernel straight from the
    /// pipe's ring), with `o` for the link. False, and nothing sent, when the port cannot (then
    /// the frame is to go through [`Port::send`]). A port that offloads may; the default cannot.
    fn send_split(&mut self, head: &[u8], tail: KernelSrc<'_>, o: Offload) -> bool {
        let _ = (head, tail, o);
        false
    }
    /// Sends what is queued and reclaims what was sent. False when frames are still waiting
    /// for the device (call again soon).
    fn flush(&mut self) -> bool;
    /// Descriptors that become readable when frames arrive (for the waker thread).
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>>;
    /// Keeps the flow director's set of pipe addresses equal to `ips`.
    fn set_pipes(&mut self, ips: &[Ipv4Addr]);
    /// Takes VXLAN datagrams to `addr` from the link too (`None`: none).
    fn set_vtep(&mut self, addr: Option<Ipv4Addr>);
    /// Counters.
    fn counters(&mut self) -> PortCounters;
}

/// Readies a frame a pipe sent for the wire: through [`offload::to_wire`] when the port
/// offloads, else [`wire::to_wire`] (nothing left to the link).
fn ready(
    frame: &mut [u8],
    link_mac: [u8; 6],
    hop_mac: [u8; 6],
    mtu: u32,
    offload: bool,
) -> Result<(usize, Offload), WireDrop> {
    if offload {
        offload::to_wire(frame, link_mac, hop_mac, mtu)
    } else {
        wire::to_wire(frame, link_mac, hop_mac, mtu).map(|n| (n, Offload::NONE))
    }
}

/// Opens the port `cfg` asks for on its link.
pub fn open(cfg: &NicConfig) -> Result<(LinkInfo, Box<dyn Port>), NicError> {
    let link = LinkInfo::read(&cfg.iface)?;
    let port: Box<dyn Port> = match cfg.mode {
        NicMode::Xdp => Box::new(xdp::XdpPort::open(&link, cfg.queues)?),
        NicMode::Packet => Box::new(packet::PacketPort::open(&link)?),
        NicMode::Auto => match xdp::XdpPort::open(&link, cfg.queues) {
            Ok(p) if p.info().copy == "zero-copy" => Box::new(p),
            tried => {
                let why = match tried {
                    Ok(_) => "the driver has no AF_XDP zero-copy".to_string(),
                    Err(e) => format!("AF_XDP: {e}"),
                };
                // (a copy-mode port is dropped here: its XDP program leaves the link)
                tracing::info!("{}: AF_PACKET with segment offload ({why})", link.name);
                Box::new(packet::PacketPort::open(&link)?)
            }
        },
    };
    Ok((link, port))
}

macro_rules! edge_counters {
    ($($field:ident: $doc:literal,)*) => {
        /// The edge's counters (beyond the port's own).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct EdgeCounters { $(#[doc = $doc] pub $field: u64,)* }
        /// The same, shared with the control plane.
        #[derive(Debug, Default)]
        pub struct SharedEdgeCounters { $($field: AtomicU64,)* }
        impl SharedEdgeCounters {
            fn store(&self, c: &EdgeCounters) { $(self.$field.store(c.$field, Ordering::Relaxed);)* }
            /// Reads them.
            pub fn load(&self) -> EdgeCounters {
                EdgeCounters { $($field: self.$field.load(Ordering::Relaxed),)* }
            }
        }
    };
}

edge_counters! {
    delivered: "Frames from the wire delivered into a pipe.",
    sent: "Frames from pipes sent to the wire.",
    not_for_us: "Frames from the wire for no pipe (AF_PACKET sees the host's traffic too).",
    drop_malformed: "Frames from the wire whose headers do not parse.",
    drop_bad_checksum: "Frames from the wire with a wrong checksum.",
    drop_too_big: "Frames larger than the MTU of where they were going.",
    drop_rx_full: "Frames from the wire for a pipe whose rx ring was full.",
    drop_unresolved: "Frames to the wire dropped while their next hop did not answer ARP.",
    drop_tx_full: "Frames to the wire dropped because the port had no room.",
    arp_requests: "ARP requests the daemon sent on the wire.",
    arp_replies: "ARP requests on the wire for a pipe the daemon answered.",
    arp_learnt: "ARP messages the daemon learnt a neighbour from.",
    vxlan_sent: "Frames from pipes sent through a VXLAN tunnel (also counted in sent).",
    vxlan_received: "Tunnelled frames taken from VXLAN datagrams (delivered or dropped as any frame).",
    drop_vxlan_malformed: "VXLAN datagrams whose outer headers do not parse or agree, or are fragments.",
    drop_vxlan_bad_checksum: "VXLAN datagrams with a wrong outer IPv4 checksum.",
    drop_vxlan_unknown_vni: "VXLAN datagrams for a network identifier no route uses.",
    drop_vxlan_spoofed: "VXLAN datagrams not from the far end of a tunnel whose network holds the inner frame's source.",
}

/// What the control plane sees of the edge.
#[derive(Debug)]
pub struct EdgeShared {
    /// The link.
    pub link: LinkInfo,
    /// The port's facts.
    pub port: PortInfo,
    /// The edge's counters, published by the master.
    pub counters: SharedEdgeCounters,
    /// The port's counters, published by the master.
    pub port_counters: std::sync::Mutex<PortCounters>,
    /// Neighbours resolved, published by the master.
    pub neighbours: AtomicU64,
}

/// The link as the master holds it.
#[derive(Debug)]
pub struct Edge {
    port: Box<dyn Port>,
    link: LinkInfo,
    neigh: Neighbours,
    c: EdgeCounters,
    /// ARP frames (and frames that waited for one) to send after a receive batch.
    out: Vec<(Vec<u8>, Offload)>,
    /// What the control plane reads.
    pub shared: std::sync::Arc<EdgeShared>,
    dirty: bool,
    sent_since_flush: bool,
    /// When the port's counters (a system call for AF_XDP) were last read.
    port_read: Instant,
    /// The routes (the tunnels among them: which far ends may send what).
    routes: std::sync::Arc<crate::route::Routes>,
    /// The next hop of every destination (the node's end of a host link), whatever the routes
    /// say.
    default_via: Option<Ipv4Addr>,
}

/// What became of a frame a pipe sent to the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Queued on the port.
    Sent,
    /// Held until its next hop answers ARP.
    Held,
    /// Dropped: longer than the wire's MTU.
    TooBig,
    /// Dropped: another reason, counted on the edge.
    Dropped,
}

impl Edge {
    /// The edge over `port` on `link`.
    pub fn new(link: LinkInfo, port: Box<dyn Port>) -> Edge {
        let shared = std::sync::Arc::new(EdgeShared {
            link: link.clone(),
            port: port.info().clone(),
            counters: SharedEdgeCounters::default(),
            port_counters: std::sync::Mutex::new(PortCounters::default()),
            neighbours: AtomicU64::new(0),
        });
        Edge {
            port,
            link,
            neigh: Neighbours::new(),
            c: EdgeCounters::default(),
            out: Vec::new(),
            shared,
            dirty: false,
            sent_since_flush: false,
            port_read: Instant::now(),
            routes: Default::default(),
            default_via: None,
        }
    }

    /// Sends everything to `via` instead of looking for the destination (or a route's next
    /// hop) on the link: a host link, whose node's kernel routes it on.
    pub fn set_default_via(&mut self, via: Option<Ipv4Addr>) {
        self.default_via = via;
    }

    /// The link's MAC (the pipes' next hop to the wire).
    pub fn mac(&self) -> [u8; 6] {
        self.link.mac
    }

    /// The link's IPv4 address, if it has one (where tunnels start and end).
    pub fn link_addr(&self) -> Option<Ipv4Addr> {
        self.link.ipv4
    }

    /// Whether frames wait on the link.
    pub fn rx_ready(&self) -> bool {
        self.port.rx_ready()
    }

    /// Copies of the descriptors to wait on while the master sleeps (for the waker thread).
    pub fn waker_fds(&self) -> Vec<OwnedFd> {
        self.port
            .wait_fds()
            .into_iter()
            .filter_map(|fd| fd.try_clone_to_owned().ok())
            .collect()
    }

    /// Keeps the flow director's addresses equal to the pipes'.
    pub fn set_pipes(&mut self, ips: &[Ipv4Addr]) {
        self.port.set_pipes(ips);
    }

    /// Takes the routes: VXLAN datagrams are taken at the link's address while any route
    /// tunnels, and only from the far ends of those tunnels, for their networks.
    pub fn set_routes(&mut self, routes: &std::sync::Arc<crate::route::Routes>) {
        if !std::sync::Arc::ptr_eq(&self.routes, routes) {
            self.routes = routes.clone();
            self.port.set_vtep(self.vtep());
        }
    }

    /// Where this node's tunnels end: the link's address while any route tunnels.
    fn vtep(&self) -> Option<Ipv4Addr> {
        self.link.ipv4.filter(|_| !self.routes.vnis().is_empty())
    }

    /// The tunnel a hop asks for, from the link's address (`None` also when the link has
    /// none: the registry refuses tunnels then, so that is not reached).
    fn tunnel(&self, hop: &Hop) -> Option<vxlan::Tunnel> {
        let (remote, vni) = hop.vxlan?;
        Some(vxlan::Tunnel {
            local: self.link.ipv4?,
            remote,
            vni,
        })
    }

    fn arp_request(&mut self, from: Ipv4Addr, to: Ipv4Addr) {
        let f = wire::arp_frame(&Arp {
            request: true,
            sha: self.link.mac,
            spa: from,
            tha: [0; 6],
            tpa: to,
        });
        self.c.arp_requests += 1;
        self.out.push((f.to_vec(), Offload::NONE));
    }

    /// Sends a frame pipe region `region` holds at `off` (`len` bytes, whose first bytes the
    /// master checked as `hdr`) to the wire through `hop` (the route covering its destination:
    /// [`crate::route::Routes::next_hop`]), wrapped in VXLAN when the hop says so. The frame is
    /// copied once, into the port, and `hdr` written over its start, so what leaves is what was
    /// checked.
    pub fn send(
        &mut self,
        region: &Region,
        off: usize,
        len: usize,
        hdr: &[u8],
        hop: Hop,
        now: Instant,
    ) -> Sent {
        self.dirty = true;
        // over a host link everything goes to the node, which routes it (no route of the
        // daemon's is used there: the registry refuses them)
        let hop = match self.default_via {
            Some(via) => Hop {
                link: via,
                vxlan: None,
            },
            None => hop,
        };
        let copy = |buf: &mut [u8]| -> bool {
            buf.len() >= len && region.read(off, &mut buf[..len]) && {
                buf[..hdr.len().min(len)].copy_from_slice(&hdr[..hdr.len().min(len)]);
                true
            }
        };
        let tunnel = self.tunnel(&hop);
        if hop.vxlan.is_some() && tunnel.is_none() {
            self.c.drop_malformed += 1;
            return Sent::Dropped;
        }
        let (link_mac, mtu) = (self.link.mac, self.link.mtu);
        let offload = self.port.info().offload;
        // the inner frame at `at`, wrapped when tunnelled (outer MACs set on release)
        let at = if tunnel.is_some() { vxlan::OVERHEAD } else { 0 };
        let wrap =
            |buf: &mut [u8], hop_mac: [u8; 6]| -> Result<(usize, Offload), Option<WireDrop>> {
                if buf.len() < at || !copy(&mut buf[at..]) {
                    return Err(Some(WireDrop::Malformed));
                }
                match &tunnel {
                    Some(t) => vxlan::encap(buf, len, t, link_mac, hop_mac, mtu)
                        .map(|n| (n, Offload::NONE)),
                    None => ready(&mut buf[..len], link_mac, hop_mac, mtu, offload),
                }
                .map_err(Some)
            };
        // ARP asks from the pod's address, so that the answer comes back through the flow
        // director to the daemon (the link's own address belongs to the host's kernel)
        let from = wire::ipv4_src(hdr).unwrap_or(Ipv4Addr::UNSPECIFIED);
        let hop_ip = hop.link;
        let mac = match self.neigh.route(hop_ip, from, now, || {
            let mut v = vec![0u8; at + len];
            match wrap(&mut v, [0; 6]) {
                Ok((n, _)) => v.truncate(n),
                Err(_) => v.clear(),
            }
            v
        }) {
            Next::Send(m) => m,
            Next::SendAndAsk(m) => {
                self.arp_request(from, hop_ip);
                m
            }
            Next::HeldAsk => {
                self.arp_request(from, hop_ip);
                self.flush_out();
                return Sent::Held;
            }
            Next::Held => return Sent::Held,
            Next::Dropped => {
                self.c.drop_unresolved += 1;
                return Sent::Dropped;
            }
        };
        if tunnel.is_none() && offload && len >= SPLIT_FROM {
            if let Some(sent) = self.send_split(region, off, len, hdr, mac) {
                return sent;
            }
        }
        let mut why = None;
        let ok = self.port.send(at + len, &mut |buf| match wrap(buf, mac) {
            Ok(r) => Some(r),
            Err(e) => {
                why = e;
                None
            }
        });
        self.sent_since_flush |= ok;
        match (ok, why) {
            (true, _) => {
                self.c.sent += 1;
                self.c.vxlan_sent += u64::from(tunnel.is_some());
                Sent::Sent
            }
            (false, Some(WireDrop::TooBig)) => {
                self.c.drop_too_big += 1;
                Sent::TooBig
            }
            (false, Some(_)) => {
                self.c.drop_malformed += 1;
                Sent::Dropped
            }
            (false, None) => {
                self.c.drop_tx_full += 1;
                Sent::Dropped
            }
        }
    }

    /// [`Edge::send`] of a whole TCP segment through a port that offloads, its headers readied
    /// from `hdr` (the checked copy) and its payload left where it lies in the pipe's ring, for
    /// the kernel to copy once ([`Port::send_split`]): one copy fewer than through the port's
    /// buffer. `None` when the frame does not qualify (its headers are not all within `hdr`,
    /// it is not TCP) or the port cannot: then it goes the usual way.
    fn send_split(
        &mut self,
        region: &Region,
        off: usize,
        len: usize,
        hdr: &[u8],
        hop_mac: [u8; 6],
    ) -> Option<Sent> {
        let mut buf = [0u8; crate::switch::HEADER_PEEK];
        let head = buf.get_mut(..hdr.len())?;
        head.copy_from_slice(hdr);
        let w = match offload::to_wire_head(head, len, self.link.mac, hop_mac, self.link.mtu)? {
            Ok(w) => w,
            Err(WireDrop::TooBig) => {
                self.c.drop_too_big += 1;
                return Some(Sent::TooBig);
            }
            Err(_) => {
                self.c.drop_malformed += 1;
                return Some(Sent::Dropped);
            }
        };
        let tail = region.for_kernel(off.checked_add(w.head)?, w.len - w.head)?;
        // frames queued before (ARP, released) leave first, as they would in the batch
        if !self.out.is_empty() {
            self.flush_out();
        }
        if !self.port.send_split(&head[..w.head], tail, w.offload) {
            return None;
        }
        self.c.sent += 1;
        Some(Sent::Sent)
    }

    /// Sends the ARP frames and released frames queued during a batch.
    fn flush_out(&mut self) {
        for (f, o) in std::mem::take(&mut self.out) {
            let ok = self.port.send(f.len(), &mut |buf| {
                buf.get_mut(..f.len())?.copy_from_slice(&f);
                Some((f.len(), o))
            });
            if ok {
                self.sent_since_flush = true;
            } else {
                self.c.drop_tx_full += 1;
            }
        }
    }

    /// Frames that waited for `ip`'s MAC: readied for the wire and queued for sending.
    fn release(&mut self, held: Vec<Vec<u8>>, mac: [u8; 6]) {
        let (link_mac, mtu) = (self.link.mac, self.link.mtu);
        let offload = self.port.info().offload;
        for mut f in held {
            if f.is_empty() {
                continue;
            }
            match ready(&mut f, link_mac, mac, mtu, offload) {
                Ok((n, o)) => {
                    f.truncate(n);
                    self.c.sent += 1;
                    self.out.push((f, o));
                }
                Err(WireDrop::TooBig) => self.c.drop_too_big += 1,
                Err(_) => self.c.drop_malformed += 1,
            }
        }
    }

    /// Receives up to `max` frames from the wire: ARP is answered or learnt from, IPv4 for a
    /// pipe is checked and handed to `deliver(pipe index, bytes)` (which returns false when the
    /// pipe's rx ring is full). Returns the frames received.
    pub fn recv(
        &mut self,
        max: usize,
        table: &FlowTable,
        mtu_of: &dyn Fn(usize) -> u32,
        deliver: &mut dyn FnMut(usize, &[u8]) -> bool,
        now: Instant,
    ) -> usize {
        let vtep = self.vtep();
        let offload = self.port.info().offload;
        let Edge {
            port,
            link,
            neigh,
            c,
            out,
            routes,
            ..
        } = self;
        let vnis = routes.vnis();
        let mut learnt: Vec<(Vec<Vec<u8>>, [u8; 6])> = Vec::new();
        let n = port.recv(max, &mut |rx| {
            let Rx {
                frame,
                csum_partial,
                csum_valid,
            } = rx;
            // a tunnelled frame: what follows sees the inner frame alone
            let (frame, tunnelled) = match vtep.map(|at| vxlan::decap(frame, at, vnis)) {
                None | Some(vxlan::Arrived::NotTunnelled) => (frame, false),
                Some(vxlan::Arrived::Inner {
                    start,
                    len,
                    from,
                    vni,
                }) => {
                    let inner = &mut frame[start..start + len];
                    // only a tunnel's far end, and only for the networks routed through it:
                    // anyone on the underlay (a pod included) can send a datagram to port 4789
                    let src = wire::ipv4_src(inner);
                    if src.map(|s| routes.next_hop(s).vxlan) != Some(Some((from, vni))) {
                        c.drop_vxlan_spoofed += 1;
                        return;
                    }
                    c.vxlan_received += 1;
                    // (an outer datagram whose checksum was left to offload has its inner
                    // checksum left: the kernel's partial sum points there)
                    (inner, true)
                }
                Some(vxlan::Arrived::Refused(why)) => {
                    match why {
                        vxlan::Refusal::Malformed => c.drop_vxlan_malformed += 1,
                        vxlan::Refusal::BadChecksum => c.drop_vxlan_bad_checksum += 1,
                        vxlan::Refusal::UnknownVni => c.drop_vxlan_unknown_vni += 1,
                    }
                    return;
                }
            };
            if let Some(a) = wire::arp(frame) {
                // neighbours are found on the link, never through a tunnel
                if tunnelled {
                    c.not_for_us += 1;
                    return;
                }
                // only ARP about the pipes is the daemon's business
                if table.lookup(a.tpa).is_none() {
                    c.not_for_us += 1;
                    return;
                }
                if a.request || a.tha == link.mac {
                    if a.spa.is_unspecified() || a.sha[0] & 1 != 0 {
                        c.drop_malformed += 1;
                        return;
                    }
                    c.arp_learnt += 1;
                    let held = neigh.learn(a.spa, a.sha, now);
                    if !held.is_empty() {
                        learnt.push((held, a.sha));
                    }
                }
                if a.request {
                    c.arp_replies += 1;
                    let reply = wire::arp_frame(&Arp {
                        request: false,
                        sha: link.mac,
                        spa: a.tpa,
                        tha: a.sha,
                        tpa: a.spa,
                    });
                    out.push((reply.to_vec(), Offload::NONE));
                }
                return;
            }
            let Some(d) = wire::ipv4_dst(frame).and_then(|ip| table.lookup(ip)) else {
                c.not_for_us += 1;
                return;
            };
            let Some(port) = table.port(d) else { return };
            let how = wire::Inbound {
                pipe_mtu: mtu_of(d),
                // A frame made on this host whose checksum its kernel left to an offload that
                // never happened (a virtual link) enters the pipe as it is: pipes skip
                // checksums, and the kernel's own sockets take such frames unchecked too.
                // What the kernel verified is not checked again, except inside a tunnel (it
                // verified the outer datagram there).
                checked: csum_partial || (csum_valid && !tunnelled),
                // segments coalesced by the port's kernel; a tunnel cuts nothing for us
                large_tcp_from: (offload && !tunnelled).then_some(link.mtu),
            };
            match wire::from_wire_with(frame, link.mac, port.mac, how) {
                Ok((_, len)) => {
                    if deliver(d, &frame[..len]) {
                        c.delivered += 1;
                    } else {
                        c.drop_rx_full += 1;
                    }
                }
                Err(WireDrop::BadChecksum) => c.drop_bad_checksum += 1,
                Err(WireDrop::TooBig) => c.drop_too_big += 1,
                Err(WireDrop::Malformed) => c.drop_malformed += 1,
            }
        });
        for (held, mac) in learnt {
            self.release(held, mac);
        }
        if n > 0 || !self.out.is_empty() {
            self.dirty = true;
        }
        self.flush_out();
        n
    }

    /// Re-asks for unresolved neighbours that are due and gives up on silent ones.
    pub fn tick(&mut self, now: Instant) {
        if !self.neigh.asking() {
            return;
        }
        let (ask, dropped) = self.neigh.tick(now);
        self.c.drop_unresolved += dropped as u64;
        for (ip, from) in ask {
            self.arp_request(from, ip);
        }
        self.flush_out();
        self.dirty = true;
    }

    /// Whether a neighbour is being asked for (the master must not sleep past its retry).
    pub fn asking(&self) -> bool {
        self.neigh.asking()
    }

    /// Sends what is queued on the port.
    pub fn flush(&mut self) {
        if self.sent_since_flush || !self.out.is_empty() {
            self.flush_out();
            // what the device did not take yet is retried on the next round
            self.sent_since_flush = !self.port.flush();
        }
    }

    /// Whether frames wait to be sent (the master must not sleep on them).
    pub fn tx_backlog(&self) -> bool {
        self.sent_since_flush
    }

    /// Publishes the counters for the control plane (when something changed; the port's own,
    /// which may cost a system call, at most every 100 ms unless `force`).
    pub fn publish(&mut self, force: bool) {
        if !self.dirty && !force {
            return;
        }
        self.dirty = false;
        self.shared.counters.store(&self.c);
        let now = Instant::now();
        if force || now.saturating_duration_since(self.port_read).as_millis() >= 100 {
            self.port_read = now;
            if let Ok(mut p) = self.shared.port_counters.lock() {
                *p = self.port.counters();
            }
        }
        self.shared
            .neighbours
            .store(self.neigh.resolved() as u64, Ordering::Relaxed);
    }
}
