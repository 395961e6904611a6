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
//! What the receiver checks (the partner is another container): the record came from a fast
//! channel, carries the partner's address (as every frame of a channel must), is well formed,
//! and names a connection of this stack that expects exactly its first byte next and has room
//! for all of it within the window it advertised. Anything else is dropped and counted
//! (`rx_records_refused`); nothing is read twice from the ring. A partner can write into its
//! own connections only, as it could with segments.
//!
//! A record counts as delivered once written, so a removed channel is read until its ring is
//! empty (`raw`, `DRAIN`), and fault injection (a network's faults) never touches one.

use crate::frame::{Record, RECORD_HEAD};
use crate::raw::{Route, Via};
use crate::stack::Inner;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, RecordRefused};
use smoltcp::wire::{IpAddress, IpEndpoint, TcpSeqNumber};
use std::net::IpAddr;

impl Inner {
    /// Sends the first bytes of `buf` on connection `h` as a record, when its stack sends
    /// records, the connection allows one now, and its path is a fast channel with room in
    /// its ring and nothing waiting for it; returns how many bytes left (`None`: none, for the
    /// segments' way).
    pub(crate) fn try_record(&mut self, h: SocketHandle, buf: &[u8]) -> Option<usize> {
        if !self.cfg.records || buf.is_empty() || !self.dev.ep.has_open_channel() {
            return None;
        }
        // (a channel the daemon removed since this stack last looked is not written: what it
        // takes counts as delivered, and its partner may have stopped reading it)
        self.dev.ep.refresh();
        // a record carries no acknowledgement: one owed leaves first, in a segment of its own,
        // where a record could go but for it (once: records owe none, so a connection that
        // moves records stays without)
        if self.sockets.get::<tcp::Socket>(h).owes_ack() && self.record_path(h) {
            self.tcp(h).expire_ack_delay();
            self.poll_out();
        }
        let now = self.now();
        let dev = &mut self.dev;
        let n = self
            .iface
            .tcp_record_send(now, &mut self.sockets, h, |head, room| {
                let (IpAddress::Ipv4(src), IpAddress::Ipv4(dst)) =
                    (head.local.addr, head.remote.addr)
                else {
                    return None;
                };
                let (route, max) = dev.ep.path_to(IpAddr::V4(dst), true, RECORD_HEAD + 1);
                if !matches!(route, Route::FastChannel(_)) || dev.backlogged_on(route) {
                    return None;
                }
                let n = buf.len().min(room).min(max.checked_sub(RECORD_HEAD)?);
                let mac = dev.ep.fc_peer_mac(dst)?;
                let rec = Record {
                    src,
                    dst,
                    src_port: head.local.port,
                    dst_port: head.remote.port,
                    seq: head.seq.0 as u32,
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

    /// Whether connection `h` could send a record now but for an acknowledgement it owes: it
    /// allows one, and its path is a fast channel.
    fn record_path(&mut self, h: SocketHandle) -> bool {
        let Some((head, _)) = self
            .sockets
            .get::<tcp::Socket>(h)
            .record_room(self.iface.context())
        else {
            return false;
        };
        let IpAddress::Ipv4(dst) = head.remote.addr else {
            return false;
        };
        let (route, _) = self.dev.ep.path_to(IpAddr::V4(dst), true, RECORD_HEAD + 1);
        matches!(route, Route::FastChannel(_)) && !self.dev.backlogged_on(route)
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
            let r = match Record::parse(f).filter(|r| r.dst == me) {
                Some(r) => self.iface.tcp_record_received(
                    now,
                    &mut self.sockets,
                    IpEndpoint::new(IpAddress::Ipv4(r.dst), r.dst_port),
                    IpEndpoint::new(IpAddress::Ipv4(r.src), r.src_port),
                    TcpSeqNumber(r.seq as i32),
                    &f[RECORD_HEAD..],
                ),
                None => Err(RecordRefused::NoSocket),
            };
            match r {
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
}
