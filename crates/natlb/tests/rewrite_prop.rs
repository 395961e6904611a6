//! Properties of the rewrite and of the balancer on untrusted bytes.

mod common;
use common::*;
use docknet_natlb::backend::{Params, Policy};
use docknet_natlb::balancer::Service;
use docknet_natlb::packet::{self, Addr, Flags, Rewrite, Segment};
use docknet_natlb::table::Limits;
use docknet_natlb::{Balancer, Config};
use proptest::prelude::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

fn arb_addr() -> impl Strategy<Value = Addr> {
    (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| Addr::new(Ipv4Addr::from(ip), port))
}

fn arb_flags() -> impl Strategy<Value = Flags> {
    any::<[bool; 4]>().prop_map(|[syn, ack, fin, rst]| Flags { syn, ack, fin, rst })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Rewriting forward and back restores the frame byte for byte, and the checksums verify
    /// after each step.
    #[test]
    fn rewrite_forward_then_back_restores_the_frame(
        src in arb_addr(), dst in arb_addr(), to_src in arb_addr(), to_dst in arb_addr(),
        macs in any::<([u8; 6], [u8; 6], [u8; 6], [u8; 6])>(),
        flags in arb_flags(), seq in any::<u32>(), ack in any::<u32>(),
        payload in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let original = frame((macs.0, macs.1), src, dst, flags, seq, ack, &payload);
        let seg = Segment::parse(&original).unwrap();
        prop_assert!(packet::checksums_ok(&original, &seg));
        let mut f = original.clone();
        packet::rewrite(&mut f, &seg, &Rewrite { src_mac: macs.2, dst_mac: macs.3, src: to_src, dst: to_dst });
        let there = Segment::parse(&f).unwrap();
        prop_assert!(packet::checksums_ok(&f, &there));
        prop_assert_eq!((Addr::new(there.src, there.sport), Addr::new(there.dst, there.dport)), (to_src, to_dst));
        prop_assert_eq!((there.seq, there.ack, there.flags, there.payload), (seq, ack, flags, payload.len() as u32));
        packet::rewrite(&mut f, &there, &Rewrite { src_mac: macs.0, dst_mac: macs.1, src, dst });
        prop_assert_eq!(f, original);
    }

    /// A frame whose checksum is wrong stays wrong by the same amount (the rewrite neither
    /// repairs nor hides corruption).
    #[test]
    fn a_wrong_checksum_stays_wrong(
        src in arb_addr(), dst in arb_addr(), to in arb_addr(), flip in 1u16..,
    ) {
        let mut f = frame(([1; 6], [2; 6]), src, dst, ACK, 1, 2, b"abc");
        let at = packet::ETH + 20 + 16;
        let c = u16::from_be_bytes([f[at], f[at + 1]]) ^ flip;
        f[at..at + 2].copy_from_slice(&c.to_be_bytes());
        let seg = Segment::parse(&f).unwrap();
        prop_assert!(!packet::checksums_ok(&f, &seg));
        packet::rewrite(&mut f, &seg, &Rewrite { src_mac: [3; 6], dst_mac: [4; 6], src: to, dst });
        let s = Segment::parse(&f).unwrap();
        prop_assert!(!packet::checksums_ok(&f, &s));
    }

    /// Whatever bytes arrive, from anyone, the balancer neither panics nor sends anything
    /// that does not parse, and its counts stay consistent.
    #[test]
    fn garbage_never_panics(frames in proptest::collection::vec(
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..120),
            // near-valid frames: a real header with random flips
            (arb_flags(), any::<u32>(), any::<u32>(), any::<u8>(), any::<usize>(), 0u16..3)
                .prop_map(|(fl, seq, ack, x, at, who)| {
                    let vip = Addr::new(Ipv4Addr::new(10, 9, 0, 1), 80);
                    let from = match who {
                        0 => Addr::new(Ipv4Addr::new(10, 9, 0, 10), 8080),
                        _ => Addr::new(Ipv4Addr::new(10, 9, 1, 1), 40_000 + who),
                    };
                    let to = if who == 0 { Addr::new(vip.ip, 1024 + (seq % 4) as u16) } else { vip };
                    let mut f = frame(([2; 6], [1; 6]), from, to, fl, seq % 8, ack % 8, b"xy");
                    let n = f.len();
                    if x % 3 == 0 { f[at % n] ^= x; }
                    if x % 5 == 0 { f.truncate(at % n); }
                    f
                }),
        ], 1..60),
    ) {
        let now = Instant::now();
        let cfg = Config {
            vip: Ipv4Addr::new(10, 9, 0, 1),
            mac: [1; 6],
            mss: Some(1460),
            policy: Policy::LeastConn,
            backends: vec![Addr::new(Ipv4Addr::new(10, 9, 0, 10), 8080)],
            services: vec![Service { vport: 80, backends: vec![0] }],
            limits: Limits { max_conns: 4, ..Limits::default() },
            health: Params::default(),
            seed: 5,
        };
        let mut lb = Balancer::new(cfg, |_| Some([2; 6]), now);
        let mut tx = Rec::default();
        for (k, mut f) in frames.into_iter().enumerate() {
            let t = now + Duration::from_millis(k as u64 * 300);
            lb.handle(&mut f, t, &mut tx);
            lb.tick(t, &mut tx);
            for (out, _) in tx.out.drain(..) {
                prop_assert!(Segment::parse(&out).is_ok());
            }
        }
        let active: u32 = lb.backends().iter().map(|b| b.active).sum();
        let open = lb
            .table()
            .iter()
            .filter(|(_, c)| !matches!(c.phase, docknet_natlb::table::Phase::Closing { .. }))
            .count();
        prop_assert_eq!(active as usize, open);
    }
}
