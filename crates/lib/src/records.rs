//! Records: an established connection's bytes over a fast channel, outside TCP's segments.
//!
//! A fast channel's ring is lossless and ordered, and both its ends are DockLib stacks, so a
//! connection that has nothing in flight and owes nothing needs neither headers nor
//! acknowledgements for its next bytes: a `write` puts them in the ring behind a small header
//! (the connection's addresses and ports, and the sequence number of the first byte,
//! [`crate::frame::Record`]), straight from the application's buffer, and the sender's smoltcp
//! counts them as sent and acknowledged ([`smoltcp::socket::tcp::Socket::record_sent`]); the
//! receiver's smoltcp takes them as if a segment had brought them and its acknowledgement had
//! left ([`smoltcp::socket::tcp::Socket::record_received`]). Sequence numbers, windows and
//! timers stay TCP's on both sides, so the connection goes on with segments whenever a record
//! does not fit (bytes queued or in flight, an acknowledgement owed, the window spent, another
//! path) and closes with TCP's FIN.
//!
//! A record goes only to a peer known to take it. The channel's partner may not end the
//! connection at all but forward it (the NAT balancer rewrites segments and passes them on),
//! and would drop a record its sender counted as delivered. So a connection that could send a
//! record asks first ([`RecordKind::Ask`], a record without bytes, once) and goes on with
//! segments; a stack that holds the connection answers ([`RecordKind::Confirm`]), and each end
//! sends records once it has the other's word (the question tells the answerer as much as the
//! answer tells the asker). A forwarder knows no records and answers nothing. What a stack
//! learnt holds until one of its channels is removed (`Endpoint::channel_epoch`): another
//! container may then have the peer's address, and would drop records silently.
//!
//! What the receiver checks (the partner is another container): the record came from a fast
//! channel, carries the partner's address (as every frame of a channel must), is well formed,
//! and names a connection of this stack that expects exactly its first byte next and has room
//! for all of it within the window it advertised. Anything else is dropped and counted
//! (`rx_records_refused`); nothing is read twice from the ring. A partner can write into its
//! own connections only, as it could with segments.
//!
//! A record counts as delivered once written, so a removed channel is read until its ring is
//! empty (`raw`, `DRAIN`), and fault injection (a network's faults) never touches one.

use crate::device::PipeDevice;
use crate::frame::{Record, RecordKind, RECORD_HEAD};
use crate::raw::{Route, Via};
use crate::stack::Inner;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, RecordHead, RecordPeer, RecordRefused};
use smoltcp::wire::{IpAddress, IpEndpoint, TcpSeqNumber};
use std::net::{IpAddr, Ipv4Addr};

impl Inner {
    /// Sends the first bytes of `buf` on connection `h` as a record, when its stack sends
    /// records, the connection allows one now, its peer is known to take them, and its path
    /// is a fast channel with room in its ring and nothing waiting for it; returns how many
    /// bytes left (`None`: none, for the segments' way). A peer not asked yet is asked first
    /// (and the bytes go as segments meanwhile).
    pub(crate) fn try_record(&mut self, h: SocketHandle, buf: &[u8]) -> Option<usize> {
        if !self.cfg.records || buf.is_empty() || !self.dev.ep.has_open_channel() {
            return None;
        }
        // (a channel the daemon removed since this stack last looked is not written: what it
        // takes counts as delivered, and its partner may have stopped reading it; and what
        // was learnt of peers before a removal is forgotten)
        self.dev.ep.refresh();
        let epoch = self.dev.ep.channel_epoch();
        let peer = self.sockets.get::<tcp::Socket>(h).record_peer_at(epoch);
        if peer == RecordPeer::Asked {
            return None;
        }
        if peer == RecordPeer::Unknown {
            self.ask_records(h, epoch);
            return None;
        }
        // a record carries no acknowledgement: one owed leaves first, in a segment of its own,
        // where a record could go but for it (once: records owe none, so a connection that
        // moves records stays without)
        if self.sockets.get::<tcp::Socket>(h).owes_ack() && self.record_path(h).is_some() {
            self.tcp(h).expire_ack_delay();
            self.poll_out();
        }
        let now = self.now();
        let dev = &mut self.dev;
        let n = self
            .iface
            .tcp_record_send(now, &mut self.sockets, h, epoch, |head, room| {
                let (src, dst) = v4(head.local.addr, head.remote.addr)?;
                let (route, max) = channel_to(dev, dst)?;
                let n = buf.len().min(room).min(max.checked_sub(RECORD_HEAD)?);
                let mac = dev.ep.fc_peer_mac(dst)?;
                let rec = Record {
                    src,
                    dst,
                    src_port: head.local.port,
                    dst_port: head.remote.port,
                    seq: head.seq.0 as u32,
                    kind: RecordKind::Data,
                };
                let hdr = rec.head(mac, dev.ep.mac());
                // (a channel closing sends through the daemon, which takes no record: then
                // the bytes go as segments)
                match dev.ep.send_parts_on(route, &[&hdr, &buf[..n]]) {
                    Ok(Via::FastChannel) => Some(n),
                    _ => None,
                }
            })?;
        self.dev.stats.tx += 1;
        self.dev.stats.tx_records += 1;
        self.dev.ep.flush();
        Some(n)
    }

    /// Asks the peer of connection `h` whether it takes records (a record without bytes,
    /// [`RecordKind::Ask`]), where the connection could send one now: only a stack that ends
    /// the connection answers. A partner on the channel that forwards the connection instead
    /// (a balancer) drops the question, and the connection goes on with segments. The
    /// question is noted as asked in `epoch`, the paths' epoch it was decided in.
    fn ask_records(&mut self, h: SocketHandle, epoch: u32) {
        let Some((head, dst, route)) = self.record_path(h) else {
            return;
        };
        let IpAddress::Ipv4(src) = head.local.addr else {
            return;
        };
        let ask = Record {
            src,
            dst,
            src_port: head.local.port,
            dst_port: head.remote.port,
            seq: head.seq.0 as u32,
            kind: RecordKind::Ask,
        };
        if self.send_bare(ask, route) {
            self.dev.stats.tx_record_asks += 1;
            self.tcp_quiet(h).record_asked(epoch);
        }
    }

    /// Writes record `r`, which carries no bytes (a question or an answer), to `route`'s
    /// ring; whether it went. (Not flushed: the segment or poll that follows flushes it.)
    fn send_bare(&mut self, r: Record, route: Route) -> bool {
        let Some(mac) = self.dev.ep.fc_peer_mac(r.dst) else {
            return false;
        };
        let hdr = r.head(mac, self.dev.ep.mac());
        if !matches!(
            self.dev.ep.send_parts_on(route, &[&hdr]),
            Ok(Via::FastChannel)
        ) {
            return false;
        }
        self.dev.stats.tx += 1;
        true
    }

    /// Where a record of connection `h` goes, when the connection allows one now (but for an
    /// acknowledgement it may owe): its head, its peer's address, and the fast channel to it.
    fn record_path(&mut self, h: SocketHandle) -> Option<(RecordHead, Ipv4Addr, Route)> {
        let (head, _) = self
            .sockets
            .get::<tcp::Socket>(h)
            .record_room(self.iface.context())?;
        let (_, dst) = v4(head.local.addr, head.remote.addr)?;
        let (route, _) = channel_to(&mut self.dev, dst)?;
        Some((head, dst, route))
    }

    /// Gives every record at the front of the rings to its connection; true when any was
    /// taken. Stops at the first frame that is not a record (left for smoltcp).
    pub(crate) fn take_records(&mut self, now: smoltcp::time::Instant) -> bool {
        if !self.dev.ep.has_channels() {
            // (no channel, not even one removed and still read: nothing brings a record, and
            // the frames are smoltcp's at once)
            return false;
        }
        let (mut took, mut reset) = (false, false);
        while let Some(n) = self.dev.next_record() {
            let f = &self.dev.rx_buf[..n];
            let me = self.dev.ep.ip();
            let Some(r) = Record::parse(f).filter(|r| r.dst == me) else {
                self.dev.stats.rx_records_refused += 1;
                continue;
            };
            let local = IpEndpoint::new(IpAddress::Ipv4(r.dst), r.dst_port);
            let remote = IpEndpoint::new(IpAddress::Ipv4(r.src), r.src_port);
            let taken = match r.kind {
                RecordKind::Data => {
                    // (a long record's payload is still in its ring: copied from there once,
                    // through the fill; the bytes of `f` past its first ones are stale then,
                    // so nothing may read the payload but the socket's copies, which go
                    // through the fill)
                    let fill = self.dev.record_fill(n);
                    self.iface.tcp_record_received(
                        now,
                        &mut self.sockets,
                        local,
                        remote,
                        TcpSeqNumber(r.seq as i32),
                        &f[RECORD_HEAD..],
                        fill.as_ref().map(|x| x as &dyn smoltcp::phy::PayloadFill),
                    )
                }
                // a question or an answer changes no connection's state but whether records
                // may go to its peer; a question is answered at once (each one: a partner
                // that asks again, as after a removal of one of its channels, has forgotten
                // the answer)
                RecordKind::Ask | RecordKind::Confirm => {
                    let asked = r.kind == RecordKind::Ask;
                    let epoch = self.dev.ep.channel_epoch();
                    let said =
                        self.iface
                            .tcp_record_peer(&mut self.sockets, local, remote, asked, epoch);
                    if said.is_ok() && asked {
                        self.answer(r);
                    }
                    match said {
                        Ok(()) => continue,
                        Err(_) => Err(RecordRefused::NoSocket),
                    }
                }
            };
            match taken {
                Ok(()) => {
                    self.dev.stats.rx_records += 1;
                    took = true;
                }
                Err(e) => {
                    self.dev.stats.rx_records_refused += 1;
                    reset |= e != RecordRefused::NoSocket;
                }
            }
        }
        if reset {
            // the connections a record was refused on were reset: the resets leave now, before
            // anything (a listener's refill) reuses a socket not yet accepted
            while self
                .iface
                .poll_egress(now, &mut self.dev, &mut self.sockets)
                == smoltcp::iface::PollResult::SocketStateChanged
            {}
            took = true;
        }
        took
    }

    /// Answers question `ask` (a partner asked whether this stack takes records on a
    /// connection it holds) on the channel it came by. An answer that finds no room in the
    /// ring is not sent: the asker then goes on with segments.
    fn answer(&mut self, ask: Record) {
        let Some((route, _)) = channel_to(&mut self.dev, ask.src) else {
            return;
        };
        let confirm = Record {
            src: ask.dst,
            dst: ask.src,
            src_port: ask.dst_port,
            dst_port: ask.src_port,
            seq: 0,
            kind: RecordKind::Confirm,
        };
        self.send_bare(confirm, route);
    }
}

/// A connection's IPv4 addresses (records carry IPv4 only).
fn v4(local: IpAddress, remote: IpAddress) -> Option<(Ipv4Addr, Ipv4Addr)> {
    match (local, remote) {
        (IpAddress::Ipv4(l), IpAddress::Ipv4(r)) => Some((l, r)),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The fast channel to `dst` and its largest frame, when that is the path to `dst` and
/// nothing waits for its ring (a record must not overtake frames waiting there).
fn channel_to(dev: &mut PipeDevice, dst: Ipv4Addr) -> Option<(Route, usize)> {
    let (route, max) = dev.ep.path_to(IpAddr::V4(dst), true, RECORD_HEAD + 1);
    (matches!(route, Route::FastChannel(_)) && !dev.backlogged_on(route)).then_some((route, max))
}
