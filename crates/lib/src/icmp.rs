//! ICMP echo (ping) over a [`Stack`]. Every stack answers echo requests by itself (smoltcp's
//! automatic reply); [`Stack::ping`] sends one and waits for its reply.

use crate::stack::{to_ip, Stack};
use smoltcp::phy::Device;
use smoltcp::socket::icmp;
use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr};
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

static IDENT: AtomicU16 = AtomicU16::new(0);

impl Stack {
    /// Sends one ICMP echo request of `payload` bytes to `dst` and waits at most `timeout` for
    /// its reply; the round trip. `TimedOut` when no reply came.
    pub fn ping(&self, dst: Ipv4Addr, payload: usize, timeout: Duration) -> io::Result<Duration> {
        let payload = payload.min(1400);
        let ident = (std::process::id() as u16)
            .wrapping_mul(31)
            .wrapping_add(IDENT.fetch_add(1, Ordering::Relaxed));
        let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
        let h = {
            let mut g = self.lock();
            let mut s = icmp::Socket::new(
                icmp::PacketBuffer::new(vec![icmp::PacketMetadata::EMPTY; 4], vec![0; 4 * 1500]),
                icmp::PacketBuffer::new(vec![icmp::PacketMetadata::EMPTY; 4], vec![0; 4 * 1500]),
            );
            s.bind(icmp::Endpoint::Ident(ident))
                .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?;
            g.sockets.add(s)
        };
        let t0 = Instant::now();
        let mut sent = false;
        let r = self.block_on(Some(timeout), |g| {
            let caps = g.dev.capabilities().checksum;
            let s = g.sockets.get_mut::<icmp::Socket>(h);
            if !sent {
                let req = Icmpv4Repr::EchoRequest {
                    ident,
                    seq_no: 1,
                    data: &data,
                };
                let buf = match s.send(req.buffer_len(), to_ip(dst)) {
                    Ok(b) => b,
                    Err(_) => return None,
                };
                req.emit(&mut Icmpv4Packet::new_unchecked(buf), &caps);
                sent = true;
                return None;
            }
            while let Ok((bytes, from)) = s.recv() {
                if from != to_ip(dst) {
                    continue;
                }
                let Ok(p) = Icmpv4Packet::new_checked(bytes) else {
                    continue;
                };
                if let Ok(Icmpv4Repr::EchoReply {
                    ident: i,
                    seq_no: 1,
                    ..
                }) = Icmpv4Repr::parse(&p, &caps)
                {
                    if i == ident {
                        return Some(Ok(t0.elapsed()));
                    }
                }
            }
            None
        });
        self.lock().sockets.remove(h);
        r
    }
}
