//! Frames and a recording way out for driving the balancer without a pipe.

#![allow(dead_code)]

use docknet_natlb::packet::{Addr, Flags, Segment, ETH};
use docknet_natlb::{Dest, Sent, Tx};
use smoltcp::wire::{IpAddress, TcpPacket, TcpSeqNumber};

/// A TCP segment, complete with valid checksums.
pub fn frame(
    macs: ([u8; 6], [u8; 6]),
    src: Addr,
    dst: Addr,
    flags: Flags,
    seq: u32,
    ack: u32,
    payload: &[u8],
) -> Vec<u8> {
    let total = ETH + 40 + payload.len();
    let mut f = vec![0u8; total];
    docknet_lib::frame::write_ipv4_headers(&mut f, macs.0, macs.1, src.ip, dst.ip, 6, total);
    let mut t = TcpPacket::new_unchecked(&mut f[ETH + 20..]);
    t.set_src_port(src.port);
    t.set_dst_port(dst.port);
    t.set_header_len(20);
    t.set_seq_number(TcpSeqNumber(seq as i32));
    t.set_ack_number(TcpSeqNumber(ack as i32));
    t.set_syn(flags.syn);
    t.set_ack(flags.ack);
    t.set_fin(flags.fin);
    t.set_rst(flags.rst);
    t.set_window_len(8192);
    t.payload_mut().copy_from_slice(payload);
    t.fill_checksum(&IpAddress::Ipv4(src.ip), &IpAddress::Ipv4(dst.ip));
    f
}

pub const SYN: Flags = Flags {
    syn: true,
    ack: false,
    fin: false,
    rst: false,
};
pub const SYNACK: Flags = Flags {
    syn: true,
    ack: true,
    fin: false,
    rst: false,
};
pub const ACK: Flags = Flags {
    syn: false,
    ack: true,
    fin: false,
    rst: false,
};
pub const FIN: Flags = Flags {
    syn: false,
    ack: true,
    fin: true,
    rst: false,
};
pub const RST: Flags = Flags {
    syn: false,
    ack: false,
    fin: false,
    rst: true,
};

pub fn addr(s: &str) -> Addr {
    let (ip, port) = s.split_once(':').unwrap();
    Addr::new(ip.parse().unwrap(), port.parse().unwrap())
}

/// Records every frame sent; `full` makes every send fail as a full ring; `gone` lists
/// backends without a channel.
#[derive(Default)]
pub struct Rec {
    pub out: Vec<(Vec<u8>, Dest)>,
    pub full: bool,
    pub gone: Vec<std::net::Ipv4Addr>,
}

impl Tx for Rec {
    fn send(&mut self, frame: &[u8], dest: Dest) -> Sent {
        if let Dest::Backend(ip) = dest {
            if self.gone.contains(&ip) {
                return Sent::NoChannel;
            }
        }
        if self.full {
            return Sent::Full;
        }
        self.out.push((frame.to_vec(), dest));
        Sent::Ok
    }
}

impl Rec {
    /// Takes the frames sent so far, parsed (and checked: every frame the balancer sends must
    /// parse and carry valid checksums, since every frame these tests feed it does).
    pub fn take(&mut self) -> Vec<(Segment, Vec<u8>, Dest)> {
        self.out
            .drain(..)
            .map(|(f, d)| {
                let s = Segment::parse(&f).expect("the balancer sent a frame that parses");
                assert!(
                    docknet_natlb::packet::checksums_ok(&f, &s),
                    "checksums verify: {s:?}"
                );
                (s, f, d)
            })
            .collect()
    }

    /// The one frame sent since the last call.
    pub fn one(&mut self) -> (Segment, Vec<u8>, Dest) {
        let mut v = self.take();
        assert_eq!(
            v.len(),
            1,
            "exactly one frame out: {:?}",
            v.iter().map(|x| x.0).collect::<Vec<_>>()
        );
        v.remove(0)
    }
}
