//! IPv6 and dual-stack pipes, in one process (no root): DockLib TCP and UDP over IPv6 through
//! the daemon's master thread and over a fast channel, one dual-stack server taking IPv4 and
//! IPv6 clients at once, and the daemon's proxy NDP, anti-spoofing and header checks seen from
//! a raw endpoint.

use docknet_daemon::master::{self, MasterShared};
use docknet_daemon::registry::{Registry, COUNTER_NAMES};
use docknet_lib::frame::{self, ETH};
use docknet_lib::{Endpoint, Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use docknet_pipe::delivery::link_local;
use docknet_pipe::IdlePolicy;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const A4: Ipv4Addr = Ipv4Addr::new(10, 8, 6, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 8, 6, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 8, 6, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 8, 6, 0, 0, 0, 0, 2);

/// Dual-stack pipes `a` and `b` (with a fast channel between them when `fc`), a master thread,
/// and stacks on both.
struct Lab {
    _dir: tempfile::TempDir,
    reg: Registry,
    master: Arc<MasterShared>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Lab {
    fn new(fc: bool) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = Registry::open(dir.path(), None).unwrap();
        let none = Default::default;
        r.create_pipe_dual(
            "a",
            "10.8.6.1/24",
            Some("fd00:8:6::1/64"),
            None,
            None,
            none(),
        )
        .unwrap();
        r.create_pipe_dual(
            "b",
            "10.8.6.2/24",
            Some("fd00:8:6::2/64"),
            None,
            None,
            none(),
        )
        .unwrap();
        r.create_pipe("c", "10.8.6.3/24", None, None).unwrap();
        if fc {
            r.connect_fc("a", "b", None).unwrap();
        }
        let master = Arc::new(MasterShared::new(r.snapshot()));
        let m = master.clone();
        let handle = Some(thread::spawn(move || {
            master::run(m, IdlePolicy::ADAPTIVE, None)
        }));
        Lab {
            _dir: dir,
            reg: r,
            master,
            handle,
        }
    }

    fn endpoint(&mut self, pipe: &str) -> Endpoint {
        Endpoint::from_connection(
            self.reg.connect_local(pipe).unwrap(),
            IdlePolicy::ADAPTIVE,
            None,
        )
        .unwrap()
    }

    fn stack(&mut self, pipe: &str) -> Stack {
        let ep = self.endpoint(pipe);
        Stack::new(ep, StackConfig::default())
    }

    /// Pipe `pipe`'s daemon counter `name`, once the master has published it.
    fn counter(&self, pipe: &str, name: &str) -> u64 {
        let snap = self.master.snap.load_full();
        let p = snap.pipes.iter().find(|p| p.name == pipe).unwrap();
        p.counters.load_all()[COUNTER_NAMES.iter().position(|x| *x == name).unwrap()]
    }

    /// Waits until `pipe`'s counter `name` reaches `want`.
    fn wait_counter(&self, pipe: &str, name: &str, want: u64) {
        let t = Instant::now();
        while self.counter(pipe, name) < want {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{pipe}: {name} is {}, expected {want}",
                self.counter(pipe, name)
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.master.shutdown.store(true, Ordering::Release);
        self.master.poke();
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Echo rounds and then `total` bytes from `a` to `b` over TCP to `to` (b's address); the
/// server checks every byte and the peer's address family.
fn tcp_exchange(a: &Stack, b: &Stack, to: SocketAddr, total: u64) {
    let mut l = TcpListener::bind(b, to.port()).unwrap();
    let srv = thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30)));
        let mut buf = [0u8; 64];
        for _ in 0..100 {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        let (mut got, mut big) = (0u64, vec![0u8; 65536]);
        loop {
            let k = s.read(&mut big).unwrap();
            if k == 0 {
                break;
            }
            for (j, x) in big[..k].iter().enumerate() {
                assert_eq!(*x, pattern(got + j as u64), "byte {}", got + j as u64);
            }
            got += k as u64;
        }
        (peer, got)
    });
    let mut s = TcpStream::connect(a, to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = [0u8; 64];
    for i in 0..100u8 {
        let m = [i; 64];
        s.write_all(&m).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(buf, m);
    }
    let local = s.local_addr().unwrap();
    assert_eq!(local.is_ipv6(), to.is_ipv6());
    let (mut sent, mut chunk) = (0u64, vec![0u8; 50_000]);
    while sent < total {
        let k = chunk.len().min((total - sent) as usize);
        for (j, x) in chunk[..k].iter_mut().enumerate() {
            *x = pattern(sent + j as u64);
        }
        s.write_all(&chunk[..k]).unwrap();
        sent += k as u64;
    }
    s.shutdown_write();
    let (peer, got) = srv.join().unwrap();
    assert_eq!(got, total);
    assert_eq!(peer.ip(), local.ip(), "the server saw the client's address");
}

/// `n` datagrams from `a` to `to` and back; the server sees a's IPv6 address.
fn udp_exchange(a: &Stack, b: &Stack, to: SocketAddr, n: usize) {
    let mut sb = UdpSocket::bind(b, to.port()).unwrap();
    sb.set_read_timeout(Some(Duration::from_secs(5)));
    let srv = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut peers = Vec::new();
        for _ in 0..n {
            let (k, from) = sb.recv_from(&mut buf).unwrap();
            sb.send_to(&buf[..k], from).unwrap();
            peers.push(from);
        }
        peers
    });
    let mut sa = UdpSocket::bind(a, 0).unwrap();
    sa.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 2048];
    for i in 0..n {
        let m = vec![i as u8; 100 + i];
        sa.send_to(&m, to).unwrap();
        let (k, from) = sa.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..k], &m[..]);
        assert_eq!(from, to);
    }
    let peers = srv.join().unwrap();
    assert!(peers
        .iter()
        .all(|p| p.ip() == IpAddr::V6(A6) && p.port() == sa.local_addr().port()));
}

#[test]
fn tcp_and_udp_over_ipv6_through_the_daemon() {
    let mut lab = Lab::new(false);
    let (a, b) = (lab.stack("a"), lab.stack("b"));
    assert_eq!(a.ip6(), Some((A6, 64)));
    tcp_exchange(
        &a,
        &b,
        SocketAddr::V6(SocketAddrV6::new(B6, 7100, 0, 0)),
        4 << 20,
    );
    udp_exchange(&a, &b, SocketAddr::from((B6, 7101)), 50);
    // the daemon carried it, and answered a's neighbour solicitation for b
    assert!(lab.counter("a", "tx_bytes") > 4 << 20);
    lab.wait_counter("a", "ndp_replies", 1);
    assert_eq!(lab.counter("a", "drop_spoofed"), 0);
    assert_eq!(lab.counter("a", "drop_malformed"), 0);
    assert_eq!(lab.counter("a", "drop_ext_header"), 0);
}

#[test]
fn tcp_and_udp_over_ipv6_over_a_fast_channel() {
    let mut lab = Lab::new(true);
    let (a, b) = (lab.stack("a"), lab.stack("b"));
    tcp_exchange(&a, &b, SocketAddr::from((B6, 7200)), 4 << 20);
    udp_exchange(&a, &b, SocketAddr::from((B6, 7201)), 50);
    // the channel carried the data: the daemon saw neighbour discovery at most
    thread::sleep(Duration::from_millis(300));
    assert!(
        lab.counter("a", "tx_packets") < 10,
        "{} frames of a went through the daemon",
        lab.counter("a", "tx_packets")
    );
    // segments with a payload went into the channel straight from the send buffer
    assert!(a.device_stats().tx_tail > 100, "{:?}", a.device_stats());
}

#[test]
fn a_dual_stack_pipe_serves_ipv4_and_ipv6_clients_at_once() {
    let mut lab = Lab::new(false);
    let (a, b, c) = (lab.stack("a"), lab.stack("b"), lab.stack("c"));
    let mut l = TcpListener::bind(&b, 7300).unwrap();
    assert_eq!(l.local_addr6(), Some(SocketAddrV6::new(B6, 7300, 0, 0)));
    let srv = thread::spawn(move || {
        let mut peers = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..3 {
            let (s, peer) = l.accept().unwrap();
            peers.push(peer);
            conns.push(s);
        }
        for s in &mut conns {
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        }
        peers
    });
    // a over IPv6 and over IPv4, c (IPv4 only) over IPv4
    let mut clients = [
        TcpStream::connect(&a, SocketAddrV6::new(B6, 7300, 0, 0)).unwrap(),
        TcpStream::connect(&a, SocketAddrV4::new(B4, 7300)).unwrap(),
        TcpStream::connect(&c, SocketAddrV4::new(B4, 7300)).unwrap(),
    ];
    for s in &mut clients {
        s.write_all(b"hello").unwrap();
    }
    for s in &mut clients {
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }
    let mut ips: Vec<IpAddr> = srv.join().unwrap().iter().map(|p| p.ip()).collect();
    ips.sort();
    let mut want = vec![
        IpAddr::V4(A4),
        IpAddr::V4(Ipv4Addr::new(10, 8, 6, 3)),
        IpAddr::V6(A6),
    ];
    want.sort();
    assert_eq!(ips, want);
    // an IPv4-only stack cannot reach IPv6
    assert!(TcpStream::connect(&c, SocketAddr::from((B6, 7300))).is_err());
}

fn ipv6_frame(src_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, nh: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETH + frame::IPV6];
    f[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&frame::ETHERTYPE_IPV6.to_be_bytes());
    f[ETH] = 0x60;
    f[ETH + 4..ETH + 6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    f[ETH + 6] = nh;
    f[ETH + 7] = 255;
    f[ETH + 8..ETH + 24].copy_from_slice(&src.octets());
    f[ETH + 24..ETH + 40].copy_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    f
}

fn recv_within(ep: &mut Endpoint, buf: &mut [u8], t: Duration) -> Option<usize> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some((n, _)) = ep.recv(buf) {
            return Some(n);
        }
        ep.idle(Duration::from_millis(5));
    }
    None
}

#[test]
fn the_daemon_answers_ndp_and_refuses_spoofed_and_odd_ipv6() {
    let mut lab = Lab::new(false);
    let (mut a, mut b) = (lab.endpoint("a"), lab.endpoint("b"));
    let mut buf = vec![0u8; 4096];
    // a neighbour solicitation for b's link-local address from a's link-local address
    let (ll_a, ll_b) = (link_local(a.mac()), link_local(b.mac()));
    let sn = {
        let mut o = [0u8; 16];
        o[0] = 0xff;
        o[1] = 0x02;
        o[11] = 1;
        o[12] = 0xff;
        o[13..].copy_from_slice(&ll_b.octets()[13..]);
        Ipv6Addr::from(o)
    };
    let mut ns = vec![0u8; 32];
    ns[0] = 135;
    ns[8..24].copy_from_slice(&ll_b.octets());
    ns[24] = 1;
    ns[25] = 1;
    ns[26..32].copy_from_slice(&a.mac());
    a.send(&ipv6_frame(a.mac(), ll_a, sn, 58, &ns)).unwrap();
    a.flush();
    let n = recv_within(&mut a, &mut buf, Duration::from_secs(2)).expect("an advertisement");
    let na = &buf[..n];
    assert_eq!(n, frame::NA_LEN);
    assert_eq!(frame::ipv6_src(na), Some(ll_b));
    assert_eq!(frame::ipv6_dst(na), Some(ll_a));
    assert_eq!(na[ETH + frame::IPV6], 136);
    assert_eq!(&na[6..12], &b.mac());
    assert_eq!(&na[na.len() - 6..], &b.mac());
    lab.wait_counter("a", "ndp_replies", 1);
    // a's own packets reach b, from its global and its link-local address
    let udp = [0u8; 16];
    for src in [A6, ll_a] {
        a.send(&ipv6_frame(a.mac(), src, B6, 17, &udp)).unwrap();
    }
    a.flush();
    for _ in 0..2 {
        recv_within(&mut b, &mut buf, Duration::from_secs(2)).expect("forwarded");
    }
    // b's address as source, a lie about the payload's length, a routing header, and a
    // router advertisement: none reaches b, each is counted
    a.send(&ipv6_frame(a.mac(), B6, B6, 17, &udp)).unwrap();
    let mut long = ipv6_frame(a.mac(), A6, B6, 17, &udp);
    long[ETH + 5] = 200;
    a.send(&long).unwrap();
    let mut rh = vec![0u8; 8];
    rh[0] = 17;
    rh.extend_from_slice(&udp);
    a.send(&ipv6_frame(a.mac(), A6, B6, 43, &rh)).unwrap();
    let mut ra = vec![0u8; 16];
    ra[0] = 134;
    a.send(&ipv6_frame(
        a.mac(),
        ll_a,
        "ff02::1".parse().unwrap(),
        58,
        &ra,
    ))
    .unwrap();
    a.flush();
    assert!(recv_within(&mut b, &mut buf, Duration::from_millis(200)).is_none());
    lab.wait_counter("a", "drop_spoofed", 1);
    lab.wait_counter("a", "drop_malformed", 1);
    lab.wait_counter("a", "drop_ext_header", 1);
    lab.wait_counter("a", "drop_unsupported", 1);
    // the IPv4-only pipe sends no IPv6 at all
    let mut c = lab.endpoint("c");
    let ll_c = link_local(c.mac());
    c.send(&ipv6_frame(c.mac(), ll_c, B6, 17, &udp)).unwrap();
    c.flush();
    assert!(recv_within(&mut b, &mut buf, Duration::from_millis(200)).is_none());
    lab.wait_counter("c", "drop_unsupported", 1);
}

#[test]
fn a_fast_channel_carries_ipv6_to_the_partner_and_only_from_it() {
    use docknet_lib::Via;
    let mut lab = Lab::new(true);
    let (mut a, mut b) = (lab.endpoint("a"), lab.endpoint("b"));
    let mut buf = vec![0u8; 4096];
    let udp = [7u8; 16];
    let (ll_a, ll_b) = (link_local(a.mac()), link_local(b.mac()));
    // to b's global and link-local addresses, from a's: the channel, accepted
    for (src, dst) in [(A6, B6), (ll_a, ll_b)] {
        let f = ipv6_frame(a.mac(), src, dst, 17, &udp);
        assert_eq!(a.send(&f), Ok(Via::FastChannel), "{src} -> {dst}");
        a.flush();
        let (n, via) = b.recv(&mut buf).expect("the frame on the channel");
        assert_eq!((via, &buf[..n]), (Via::FastChannel, &f[..]));
    }
    // to an address that is not the partner's: the daemon
    let other = ipv6_frame(a.mac(), A6, "fd00:8:6::9".parse().unwrap(), 17, &udp);
    assert_eq!(a.send(&other), Ok(Via::Daemon));
    // a partner lying about its source: dropped by the receiver and counted
    for src in ["fd00:8:6::99".parse().unwrap(), B6] {
        a.send(&ipv6_frame(a.mac(), src, B6, 17, &udp)).unwrap();
    }
    a.flush();
    assert!(b.recv(&mut buf).is_none());
    assert_eq!(b.stats().fc_spoofed, 2);
}
