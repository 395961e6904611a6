//! The balancer's logic driven frame by frame (no pipe, no root): full NAT both ways, pinning,
//! spreading, closing, stale client ports, backends taken out and brought back, garbage.

mod common;
use common::*;
use docknet_natlb::backend::{Params, Policy};
use docknet_natlb::balancer::{Service, PROBE_BASE};
use docknet_natlb::packet::{Addr, Segment};
use docknet_natlb::stats::Reason;
use docknet_natlb::table::Limits;
use docknet_natlb::{Balancer, Config, Dest};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
const VIP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

fn backend_mac(ip: Ipv4Addr) -> [u8; 6] {
    [0x02, 0, 0, 0, 1, ip.octets()[3]]
}

fn backends(n: u8) -> Vec<Addr> {
    (0..n)
        .map(|i| Addr::new(Ipv4Addr::new(10, 9, 0, 10 + i), 8080))
        .collect()
}

fn lb(n: u8, policy: Policy, now: Instant) -> Balancer {
    let cfg = Config {
        vip: VIP,
        mac: LB_MAC,
        mss: None,
        policy,
        backends: backends(n),
        services: vec![Service {
            vport: 80,
            backends: (0..u16::from(n)).collect(),
        }],
        limits: Limits::default(),
        health: Params {
            probe_interval: None,
            ..Params::default()
        },
        seed: 1,
    };
    Balancer::new(cfg, |ip| Some(backend_mac(ip)), now)
}

fn client(i: u16) -> (Addr, [u8; 6]) {
    (
        Addr::new(Ipv4Addr::new(10, 9, 1, (i % 200) as u8 + 1), 40_000 + i),
        [0x02, 0, 0, 2, 0, i as u8],
    )
}

fn vip() -> Addr {
    Addr::new(VIP, 80)
}

/// Client `i` sends a SYN; returns what reached the backend.
fn syn(lb: &mut Balancer, tx: &mut Rec, i: u16, isn: u32, now: Instant) -> Segment {
    let (c, mac) = client(i);
    let mut f = frame((mac, LB_MAC), c, vip(), SYN, isn, 0, &[]);
    lb.handle(&mut f, now, tx);
    let (s, _, d) = tx.one();
    assert_eq!(d, Dest::Backend(s.dst));
    s
}

/// The backend that got `s` answers with a SYN-ACK; returns what reached the client.
fn synack(lb: &mut Balancer, tx: &mut Rec, s: &Segment, bisn: u32, now: Instant) -> Segment {
    let mut f = frame(
        (backend_mac(s.dst), LB_MAC),
        Addr::new(s.dst, s.dport),
        Addr::new(s.src, s.sport),
        SYNACK,
        bisn,
        s.seq.wrapping_add(1),
        &[],
    );
    lb.handle(&mut f, now, tx);
    tx.one().0
}

#[test]
fn full_nat_both_ways_then_fin_both_ways_closes() {
    let now = Instant::now();
    let mut lb = lb(1, Policy::Rr, now);
    let mut tx = Rec::default();
    let (c, cmac) = client(1);
    let to_b = syn(&mut lb, &mut tx, 1, 1000, now);
    // client -> backend: from the VIP and a balancer port, to the backend
    assert_eq!(
        (to_b.src, to_b.dst, to_b.dport),
        (VIP, backends(1)[0].ip, 8080)
    );
    assert_eq!(to_b.src_mac, LB_MAC);
    assert!(to_b.sport >= 1024 && to_b.sport < PROBE_BASE);
    assert_eq!(to_b.seq, 1000, "sequence numbers are not touched");
    assert_eq!(lb.backends()[0].active, 1);
    // backend -> client: from VIP:80 to the client, to the client's MAC
    let to_c = synack(&mut lb, &mut tx, &to_b, 5000, now);
    assert_eq!(
        (to_c.src, to_c.sport, to_c.dst, to_c.dport),
        (VIP, 80, c.ip, c.port)
    );
    assert_eq!((to_c.seq, to_c.ack), (5000, 1001));
    let mut f = frame((cmac, LB_MAC), c, vip(), ACK, 1001, 5001, b"hello");
    lb.handle(&mut f, now, &mut tx);
    let (s, raw, _) = tx.one();
    assert_eq!((s.sport, s.payload), (to_b.sport, 5));
    assert_eq!(&raw[raw.len() - 5..], b"hello", "payload untouched");
    // FIN both ways: the entry lingers, then goes
    let bside = Addr::new(to_b.dst, to_b.dport);
    let lbside = Addr::new(VIP, to_b.sport);
    let mut f = frame((cmac, LB_MAC), c, vip(), FIN, 1006, 5001, &[]);
    lb.handle(&mut f, now, &mut tx);
    tx.one();
    let mut f = frame(
        (backend_mac(bside.ip), LB_MAC),
        bside,
        lbside,
        FIN,
        5001,
        1007,
        &[],
    );
    lb.handle(&mut f, now, &mut tx);
    let (s, _, d) = tx.one();
    assert!(s.flags.fin);
    assert_eq!(d, Dest::Client);
    let mut f = frame((cmac, LB_MAC), c, vip(), ACK, 1007, 5002, &[]);
    lb.handle(&mut f, now, &mut tx);
    tx.one();
    assert_eq!(lb.table().len(), 1, "lingers for the last ACK");
    // the sweep goes round the table once per second
    for k in 0..=300 {
        lb.tick(now + Duration::from_millis(10 * k), &mut tx);
    }
    assert_eq!(lb.table().len(), 0);
    assert_eq!(lb.backends()[0].active, 0);
    let snap = lb.snapshot(now);
    assert_eq!(snap.counters.conns_total, 1);
    assert_eq!(snap.counters.conns_expired, 1);
}

#[test]
fn round_robin_spreads_and_every_connection_stays_on_its_backend() {
    let now = Instant::now();
    let mut lb = lb(3, Policy::Rr, now);
    let mut tx = Rec::default();
    let mut seen = Vec::new();
    for i in 0..30 {
        let s = syn(&mut lb, &mut tx, i, 7 * u32::from(i), now);
        synack(&mut lb, &mut tx, &s, 1, now);
        seen.push(s);
    }
    let per: Vec<u32> = lb.backends().iter().map(|b| b.active).collect();
    assert_eq!(per, [10, 10, 10]);
    // data from every client, twice, in another order: always the same backend and port
    for round in 0..2 {
        for i in (0..30u16).rev() {
            let (c, mac) = client(i);
            let mut f = frame(
                (mac, LB_MAC),
                c,
                vip(),
                ACK,
                7 * u32::from(i) + 1,
                2,
                &[round; 3],
            );
            lb.handle(&mut f, now, &mut tx);
            let (s, _, _) = tx.one();
            let first = &seen[usize::from(i)];
            assert_eq!((s.dst, s.sport), (first.dst, first.sport));
        }
    }
}

#[test]
fn least_connections_fills_the_emptiest_backend() {
    let now = Instant::now();
    let mut lb = lb(3, Policy::LeastConn, now);
    let mut tx = Rec::default();
    let mut conns = Vec::new();
    for i in 0..6 {
        let s = syn(&mut lb, &mut tx, i, 100, now);
        synack(&mut lb, &mut tx, &s, 1, now);
        conns.push((i, s));
    }
    // both connections on the second backend end (RST from the client)
    let b1 = backends(3)[1].ip;
    for (i, s) in conns.iter().filter(|(_, s)| s.dst == b1) {
        let (c, mac) = client(*i);
        let mut f = frame((mac, LB_MAC), c, vip(), RST, 101, 0, &[]);
        lb.handle(&mut f, now, &mut tx);
        let (r, _, _) = tx.one();
        assert!(r.flags.rst && r.sport == s.sport);
    }
    assert_eq!(lb.backends()[1].active, 0);
    // least-conn sends the next two there (round robin would not)
    for i in 6..8 {
        let s = syn(&mut lb, &mut tx, i, 100, now);
        assert_eq!(s.dst, b1);
    }
}

#[test]
fn a_reused_client_port_starts_a_new_connection_and_a_repeated_syn_does_not() {
    let now = Instant::now();
    let mut lb = lb(2, Policy::Rr, now);
    let mut tx = Rec::default();
    let a = syn(&mut lb, &mut tx, 1, 1000, now);
    // the same SYN again (a retransmission): same backend, same port
    let (c, mac) = client(1);
    let mut f = frame((mac, LB_MAC), c, vip(), SYN, 1000, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    let (b, _, _) = tx.one();
    assert_eq!((b.dst, b.sport), (a.dst, a.sport));
    synack(&mut lb, &mut tx, &a, 1, now);
    // a SYN with another ISN from the same client port: the old connection is reset on its
    // backend, a new one starts on a new balancer port
    let mut f = frame((mac, LB_MAC), c, vip(), SYN, 9_000_000, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    let out = tx.take();
    assert_eq!(out.len(), 2, "RST to the old backend, SYN to the new one");
    assert!(out[0].0.flags.rst && out[0].0.sport == a.sport && out[0].0.dst == a.dst);
    assert!(out[1].0.flags.syn && out[1].0.sport != a.sport);
    assert_eq!(lb.table().len(), 1);
    assert_eq!(lb.snapshot(now).counters.port_reused, 1);
    let active: u32 = lb.backends().iter().map(|b| b.active).sum();
    assert_eq!(active, 1);
}

#[test]
fn frames_of_no_connection_get_a_reset_and_resets_get_nothing() {
    let now = Instant::now();
    let mut lb = lb(1, Policy::Rr, now);
    let mut tx = Rec::default();
    let (c, mac) = client(3);
    let mut f = frame((mac, LB_MAC), c, vip(), ACK, 10, 20, b"x");
    lb.handle(&mut f, now, &mut tx);
    let (r, _, d) = tx.one();
    assert_eq!(d, Dest::Client);
    assert!(r.flags.rst && r.seq == 20 && r.dst == c.ip && r.dport == c.port);
    let mut f = frame((mac, LB_MAC), c, vip(), RST, 10, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    assert!(tx.take().is_empty());
    // from a backend, for a port nobody holds
    let b = backends(1)[0];
    let mut f = frame(
        (backend_mac(b.ip), LB_MAC),
        b,
        Addr::new(VIP, 5555),
        ACK,
        1,
        2,
        &[],
    );
    lb.handle(&mut f, now, &mut tx);
    let (r, _, d) = tx.one();
    assert_eq!(d, Dest::Backend(b.ip));
    assert!(r.flags.rst);
    // unserved port and foreign destination: dropped, counted
    let mut f = frame((mac, LB_MAC), c, Addr::new(VIP, 81), SYN, 1, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    let mut f = frame(
        (mac, LB_MAC),
        c,
        Addr::new([10, 9, 0, 99].into(), 80),
        SYN,
        1,
        0,
        &[],
    );
    lb.handle(&mut f, now, &mut tx);
    assert!(tx.take().is_empty());
    assert_eq!(lb.dropped(Reason::NoService), 1);
    assert_eq!(lb.dropped(Reason::NotForVip), 1);
    assert_eq!(lb.dropped(Reason::NoConnection), 3);
}

#[test]
fn a_lost_channel_resets_that_backends_connections_and_moves_waiting_syns() {
    let now = Instant::now();
    let mut lb = lb(2, Policy::Rr, now);
    let mut tx = Rec::default();
    let s0 = syn(&mut lb, &mut tx, 0, 100, now); // backend 0
    let a0 = synack(&mut lb, &mut tx, &s0, 7000, now);
    let s1 = syn(&mut lb, &mut tx, 1, 200, now); // backend 1
    synack(&mut lb, &mut tx, &s1, 1, now);
    let s2 = syn(&mut lb, &mut tx, 2, 300, now); // backend 0, not answered yet
    assert_eq!(s2.dst, s0.dst);
    let b0 = backends(2)[0].ip;
    lb.refresh_channels(|ip| (ip != b0).then(|| backend_mac(ip)), now);
    assert_eq!(lb.backends()[0].state(), "no-channel");
    lb.tick(now, &mut tx);
    // the established connection on backend 0 is reset towards its client, in its window
    let (r, _, d) = tx.one();
    let (c0, _) = client(0);
    assert_eq!(d, Dest::Client);
    assert!(r.flags.rst && r.dst == c0.ip && r.dport == c0.port && r.sport == 80);
    assert_eq!(
        r.seq,
        a0.seq.wrapping_add(1),
        "the backend's next sequence number"
    );
    assert_eq!(lb.backends()[0].counters.conns_reset, 1);
    // the connection on backend 1 carries on
    let (c1, m1) = client(1);
    let mut f = frame((m1, LB_MAC), c1, vip(), ACK, 201, 2, b"still");
    lb.handle(&mut f, now, &mut tx);
    assert_eq!(tx.one().0.dst, s1.dst);
    // the client still waiting for its SYN-ACK sends the SYN again: it goes to backend 1
    let (c2, m2) = client(2);
    let mut f = frame((m2, LB_MAC), c2, vip(), SYN, 300, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    let (m, _, _) = tx.one();
    assert_eq!((m.dst, m.sport), (s1.dst, s2.sport));
    assert_eq!(lb.snapshot(now).counters.syn_moved, 1);
    assert_eq!(lb.backends()[0].active, 0);
    assert_eq!(lb.backends()[1].active, 2);
    // new connections avoid backend 0
    for i in 3..6 {
        assert_eq!(syn(&mut lb, &mut tx, i, 1, now).dst, s1.dst);
    }
    // its channel comes back: probed at once, up when the probe is answered
    lb.refresh_channels(|ip| Some(backend_mac(ip)), now);
    lb.tick(now + Duration::from_millis(20), &mut tx);
    let (p, _, d) = tx.one();
    assert_eq!(d, Dest::Backend(b0));
    assert!(p.flags.syn && p.sport == PROBE_BASE && p.dport == 8080);
    let back = Addr::new(b0, 8080);
    let mut f = frame(
        (backend_mac(b0), LB_MAC),
        back,
        Addr::new(VIP, p.sport),
        SYNACK,
        42,
        p.seq.wrapping_add(1),
        &[],
    );
    lb.handle(&mut f, now, &mut tx);
    let (r, _, _) = tx.one();
    assert!(
        r.flags.rst && r.seq == p.seq.wrapping_add(1),
        "the probe's half-open connection is closed"
    );
    assert_eq!(lb.backends()[0].state(), "up");
    assert_eq!(
        syn(&mut lb, &mut tx, 9, 1, now).dst,
        b0,
        "least loaded in turn"
    );
}

#[test]
fn unanswered_syns_take_a_backend_out_and_probes_with_backoff_bring_it_back() {
    let t0 = Instant::now();
    let mut lb = lb(2, Policy::Rr, t0);
    let mut tx = Rec::default();
    let b0 = backends(2)[0];
    // three connections to backend 0 go unanswered (backend 1 answers its own)
    for i in 0..6 {
        let s = syn(&mut lb, &mut tx, i, 1, t0);
        if s.dst != b0.ip {
            synack(&mut lb, &mut tx, &s, 1, t0);
        }
    }
    let t1 = t0 + Duration::from_millis(1100);
    lb.tick(t1, &mut tx);
    assert_eq!(lb.backends()[0].state(), "down");
    assert_eq!(lb.backends()[0].counters.syn_timeouts, 3);
    assert_eq!(lb.backends()[1].state(), "up");
    assert!(
        tx.take().is_empty(),
        "connections still in their SYN are not reset"
    );
    // the first probe after 250 ms; unanswered, the next after 500 ms more
    lb.tick(t1 + Duration::from_millis(200), &mut tx);
    assert!(tx.take().is_empty());
    let t2 = t1 + Duration::from_millis(260);
    lb.tick(t2, &mut tx);
    let (p, _, _) = tx.one();
    assert!(p.flags.syn && p.dst == b0.ip);
    let t3 = t2 + Duration::from_millis(1000);
    lb.tick(t3, &mut tx); // timed out
    assert!(tx.take().is_empty());
    assert_eq!(lb.backends()[0].counters.probe_failures, 1);
    lb.tick(t3 + Duration::from_millis(490), &mut tx);
    assert!(tx.take().is_empty(), "backoff doubled to 500 ms");
    let t4 = t3 + Duration::from_millis(510);
    lb.tick(t4, &mut tx);
    let (p, _, _) = tx.one();
    // a RST answer (nothing listening) is a failure too
    let mut f = frame(
        (backend_mac(b0.ip), LB_MAC),
        b0,
        Addr::new(VIP, p.sport),
        Flags_rst_ack(),
        0,
        p.seq.wrapping_add(1),
        &[],
    );
    lb.handle(&mut f, t4, &mut tx);
    assert_eq!(lb.backends()[0].counters.probe_failures, 2);
    assert_eq!(lb.backends()[0].state(), "down");
    // the next probe is answered: up again
    let t5 = t4 + Duration::from_millis(1010);
    lb.tick(t5, &mut tx);
    let (p, _, _) = tx.one();
    let mut f = frame(
        (backend_mac(b0.ip), LB_MAC),
        b0,
        Addr::new(VIP, p.sport),
        SYNACK,
        9,
        p.seq.wrapping_add(1),
        &[],
    );
    lb.handle(&mut f, t5, &mut tx);
    assert!(tx.one().0.flags.rst);
    assert_eq!(lb.backends()[0].state(), "up");
    assert_eq!(lb.backends()[0].counters.taken_out, 1);
}

#[allow(non_snake_case)]
fn Flags_rst_ack() -> docknet_natlb::packet::Flags {
    docknet_natlb::packet::Flags {
        rst: true,
        ack: true,
        ..Default::default()
    }
}

#[test]
fn no_backend_answers_the_syn_with_a_reset_and_full_rings_drop() {
    let now = Instant::now();
    let mut lb = lb(1, Policy::Rr, now);
    let mut tx = Rec::default();
    let b0 = backends(1)[0].ip;
    lb.refresh_channels(|_| None, now);
    let (c, mac) = client(1);
    let mut f = frame((mac, LB_MAC), c, vip(), SYN, 77, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    let (r, _, _) = tx.one();
    assert!(r.flags.rst && r.flags.ack && r.ack == 78);
    assert_eq!(lb.dropped(Reason::NoBackend), 1);
    // channel back and up; a full fast channel drops (the client retransmits)
    lb.refresh_channels(|ip| Some(backend_mac(ip)), now);
    let s = {
        let mut l2 = self::lb(1, Policy::Rr, now);
        let mut t2 = Rec::default();
        let s = syn(&mut l2, &mut t2, 1, 5, now);
        t2.full = true;
        let (c, mac) = client(1);
        let mut f = frame((mac, LB_MAC), c, vip(), ACK, 6, 1, b"data");
        l2.handle(&mut f, now, &mut t2);
        assert_eq!(l2.dropped(Reason::BackendRingFull), 1);
        assert_eq!(l2.backends()[0].counters.ring_full, 1);
        s
    };
    assert_eq!(s.dst, b0);
}

#[test]
fn a_full_table_drops_syns_and_counts_them() {
    let now = Instant::now();
    let cfg = Config {
        vip: VIP,
        mac: LB_MAC,
        mss: None,
        policy: Policy::Rr,
        backends: backends(1),
        services: vec![Service {
            vport: 80,
            backends: vec![0],
        }],
        limits: Limits {
            max_conns: 2,
            ..Limits::default()
        },
        health: Params::default(),
        seed: 3,
    };
    let mut lb = Balancer::new(cfg, |ip| Some(backend_mac(ip)), now);
    let mut tx = Rec::default();
    syn(&mut lb, &mut tx, 1, 1, now);
    syn(&mut lb, &mut tx, 2, 1, now);
    let (c, mac) = client(3);
    let mut f = frame((mac, LB_MAC), c, vip(), SYN, 1, 0, &[]);
    lb.handle(&mut f, now, &mut tx);
    assert!(tx.take().is_empty());
    assert_eq!(lb.dropped(Reason::TableFull), 1);
}

#[test]
fn a_connection_cannot_be_hijacked_by_another_backend() {
    let now = Instant::now();
    let mut lb = lb(2, Policy::Rr, now);
    let mut tx = Rec::default();
    let s = syn(&mut lb, &mut tx, 1, 1, now);
    let other = backends(2).into_iter().find(|b| b.ip != s.dst).unwrap();
    let mut f = frame(
        (backend_mac(other.ip), LB_MAC),
        other,
        Addr::new(VIP, s.sport),
        SYNACK,
        1,
        2,
        &[],
    );
    lb.handle(&mut f, now, &mut tx);
    assert!(tx.take().is_empty());
    assert_eq!(lb.dropped(Reason::WrongBackend), 1);
}

/// Counts frames without keeping them.
struct Count(u64);
impl docknet_natlb::Tx for Count {
    fn send(&mut self, _: &[u8], _: Dest) -> docknet_natlb::Sent {
        self.0 += 1;
        docknet_natlb::Sent::Ok
    }
}

/// The balancer's own work per frame (parse, lookup, rewrite, checksum updates), both
/// directions, without rings: `cargo test --release -p docknet-natlb --test balancer --
/// --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn cost_per_frame() {
    let now = Instant::now();
    let mut lb = lb(3, Policy::Rr, now);
    let mut tx = Rec::default();
    let s = syn(&mut lb, &mut tx, 1, 100, now);
    synack(&mut lb, &mut tx, &s, 1, now);
    let (c, mac) = client(1);
    let req = frame((mac, LB_MAC), c, vip(), ACK, 101, 2, &[7; 64]);
    let b = Addr::new(s.dst, s.dport);
    let rsp = frame(
        (backend_mac(b.ip), LB_MAC),
        b,
        Addr::new(VIP, s.sport),
        ACK,
        2,
        165,
        &[8; 64],
    );
    let mut count = Count(0);
    let n = 2_000_000u32;
    let t = Instant::now();
    let (mut f, mut g) = (req.clone(), rsp.clone());
    for _ in 0..n {
        f.copy_from_slice(&req);
        lb.handle(&mut f, now, &mut count);
        g.copy_from_slice(&rsp);
        lb.handle(&mut g, now, &mut count);
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(2 * n);
    assert_eq!(count.0, 2 * u64::from(n));
    eprintln!("{ns:.1} ns per frame (with a 118-byte copy)");
}
