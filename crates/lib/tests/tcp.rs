//! TCP and UDP over DockPipes in one process: two stacks, the daemon's master thread between
//! them (or a fast channel), real regions made by the registry. No root needed.

use docknet_daemon::master::{self, MasterShared};
use docknet_daemon::registry::Registry;
use docknet_lib::{Endpoint, Faults, Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use docknet_pipe::IdlePolicy;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

struct Net {
    _dir: tempfile::TempDir,
    master: Arc<MasterShared>,
    handle: Option<thread::JoinHandle<()>>,
    a: Stack,
    b: Stack,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.master.shutdown.store(true, Ordering::Release);
        self.master.poke();
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}

const B: Ipv4Addr = Ipv4Addr::new(10, 8, 0, 2);

fn net(fc: bool, mtu: u32) -> Net {
    net_with(fc, mtu, StackConfig::default())
}

/// A lossy, duplicating, reordering, delaying link (on both stacks' receive side).
fn faulty(seed: u64, drop_pct: u8) -> StackConfig {
    StackConfig {
        faults: Some(Faults {
            drop_pct,
            dup_pct: 5,
            reorder_pct: 5,
            max_delay: Duration::from_micros(300),
            seed,
        }),
        ..StackConfig::default()
    }
}

fn net_with(fc: bool, mtu: u32, cfg: StackConfig) -> Net {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path()).unwrap();
    r.create_pipe("a", "10.8.0.1/24", Some(mtu), None).unwrap();
    r.create_pipe("b", "10.8.0.2/24", Some(mtu), None).unwrap();
    if fc {
        r.connect_fc("a", "b", None).unwrap();
    }
    let master = Arc::new(MasterShared::new(r.snapshot()));
    let m = master.clone();
    let handle = thread::spawn(move || master::run(m, IdlePolicy::ADAPTIVE));
    let a = Stack::new(
        Endpoint::attach(&r.pipe_dir("a"), cfg.idle).unwrap(),
        cfg.clone(),
    );
    let b = Stack::new(Endpoint::attach(&r.pipe_dir("b"), cfg.idle).unwrap(), cfg);
    Net {
        _dir: dir,
        master,
        handle: Some(handle),
        a,
        b,
    }
}

/// FNV-1a over a stream of bytes.
fn fnv(h: &mut u64, data: &[u8]) {
    for b in data {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x100000001b3);
    }
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Streams `total` bytes a -> b through port `port`; the receiver checks every byte against the
/// pattern (content and order) and both ends compare an FNV-1a checksum of the payload.
fn transfer(n: &Net, port: u16, total: u64) {
    let mut l = TcpListener::bind(&n.b, port).unwrap();
    let rx = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let (mut got, mut h) = (0u64, 0xcbf29ce484222325u64);
        loop {
            let k = s.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            for (j, b) in buf[..k].iter().enumerate() {
                assert_eq!(
                    *b,
                    pattern(got + j as u64),
                    "byte {} corrupted",
                    got + j as u64
                );
            }
            fnv(&mut h, &buf[..k]);
            got += k as u64;
        }
        (got, h)
    });
    let mut s = TcpStream::connect(&n.a, SocketAddrV4::new(B, port)).unwrap();
    let (mut sent, mut h) = (0u64, 0xcbf29ce484222325u64);
    let mut chunk = vec![0u8; 60_000];
    while sent < total {
        let k = chunk.len().min((total - sent) as usize);
        for (j, b) in chunk[..k].iter_mut().enumerate() {
            *b = pattern(sent + j as u64);
        }
        s.write_all(&chunk[..k]).unwrap();
        fnv(&mut h, &chunk[..k]);
        sent += k as u64;
    }
    s.shutdown_write();
    let (got, hr) = rx.join().unwrap();
    assert_eq!(got, total);
    assert_eq!(hr, h, "checksum of the payload at the receiver");
}

#[test]
fn stream_through_the_daemon_arrives_intact() {
    let n = net(false, 9000);
    transfer(&n, 7000, 1 << 30);
    assert!(n.master.forwarded.load(Ordering::Relaxed) > 20_000);
}

#[test]
fn stream_over_a_fast_channel_arrives_intact() {
    let n = net(true, 9000);
    let before = n.master.forwarded.load(Ordering::Relaxed);
    transfer(&n, 7001, 1 << 30);
    // only ARP went through the daemon
    assert!(n.master.forwarded.load(Ordering::Relaxed) - before < 10);
}

#[test]
fn connect_to_a_closed_port_is_refused() {
    let n = net(false, 1500);
    let e = TcpStream::connect(&n.a, SocketAddrV4::new(B, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

#[test]
fn close_and_reset_reach_the_peer() {
    let n = net(true, 1500);
    let mut l = TcpListener::bind(&n.b, 7002).unwrap();
    let srv = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"bye").unwrap();
        s.shutdown_write();
        let (s2, _) = l.accept().unwrap();
        s2.abort();
        // keep the listener until the client has seen both
        thread::sleep(Duration::from_millis(300));
    });
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7002)).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"bye", "data then a clean end of stream");
    let mut c2 = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7002)).unwrap();
    c2.set_read_timeout(Some(Duration::from_secs(5)));
    let e = c2.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    srv.join().unwrap();
}

#[test]
fn sixty_four_concurrent_connections_with_interleaved_traffic() {
    let n = net(false, 1500);
    const N: usize = 64;
    let mut l = TcpListener::bind(&n.b, 7003).unwrap();
    let srv = thread::spawn(move || {
        let mut conns: Vec<TcpStream> = (0..N).map(|_| l.accept().unwrap().0).collect();
        // echo 20 rounds, visiting connections in turn
        for _ in 0..20 {
            for c in conns.iter_mut() {
                let mut m = [0u8; 8];
                c.read_exact(&mut m).unwrap();
                c.write_all(&m).unwrap();
            }
        }
    });
    let mut cs: Vec<TcpStream> = (0..N)
        .map(|_| TcpStream::connect(&n.a, SocketAddrV4::new(B, 7003)).unwrap())
        .collect();
    for round in 0..20u32 {
        for (i, c) in cs.iter_mut().enumerate() {
            c.write_all(&(((i as u64) << 32) | u64::from(round)).to_le_bytes())
                .unwrap();
        }
        for (i, c) in cs.iter_mut().enumerate() {
            let mut m = [0u8; 8];
            c.read_exact(&mut m).unwrap();
            assert_eq!(u64::from_le_bytes(m), ((i as u64) << 32) | u64::from(round));
        }
    }
    srv.join().unwrap();
}

#[test]
fn udp_datagrams_both_ways() {
    let n = net(false, 1500);
    let b = UdpSocket::bind(&n.b, 5353).unwrap();
    let mut a = UdpSocket::bind(&n.a, 0).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5)));
    let echo = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..100 {
            let (k, from) = b.recv_from(&mut buf).unwrap();
            b.send_to(&buf[..k], from).unwrap();
        }
    });
    let to = SocketAddrV4::new(B, 5353);
    for i in 0..100u32 {
        let msg = vec![i as u8; 1 + i as usize * 10];
        a.send_to(&msg, to).unwrap();
        let mut buf = [0u8; 2048];
        let (k, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!(from, to);
        assert_eq!(&buf[..k], &msg[..]);
    }
    echo.join().unwrap();
}

#[test]
fn transfers_survive_a_lossy_duplicating_reordering_delaying_link() {
    for (fc, seed) in [(false, 11), (true, 12)] {
        let n = net_with(fc, 1500, faulty(seed, 2));
        transfer(&n, 7010, 1 << 20);
        let (a, b) = (n.a.device_stats(), n.b.device_stats());
        assert!(
            a.injected + b.injected > 100,
            "faults were injected: {a:?} {b:?}"
        );
    }
}

#[test]
fn refusal_close_and_reset_propagate_over_a_reordering_link() {
    let n = net_with(false, 1500, faulty(21, 0));
    let e = TcpStream::connect(&n.a, SocketAddrV4::new(B, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    let mut l = TcpListener::bind(&n.b, 7011).unwrap();
    let srv = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&[7u8; 100_000]).unwrap();
        s.shutdown_write();
        s.flush_acked(Duration::from_secs(10)).unwrap();
        let (s2, _) = l.accept().unwrap();
        s2.abort();
        thread::sleep(Duration::from_millis(500));
    });
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7011)).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    assert_eq!(out, vec![7u8; 100_000]);
    let mut c2 = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7011)).unwrap();
    c2.set_read_timeout(Some(Duration::from_secs(10)));
    let e = c2.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    srv.join().unwrap();
}

#[test]
fn a_gone_daemon_or_a_removed_pipe_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path()).unwrap();
    r.create_pipe("a", "10.8.1.1/24", None, None).unwrap();
    // no master thread: nothing forwards, like a dead daemon
    let cfg = StackConfig {
        connect_timeout: Duration::from_millis(300),
        ..StackConfig::default()
    };
    let a = Stack::new(Endpoint::attach(&r.pipe_dir("a"), cfg.idle).unwrap(), cfg);
    let region = &r.get("a").unwrap().region;
    let to = SocketAddrV4::new(Ipv4Addr::new(10, 8, 1, 2), 80);
    let now_ms = docknet_pipe::wake::monotonic_ns() / 1_000_000;
    // a live daemon (fresh heartbeat) that does not answer: a plain timeout
    docknet_pipe::layout::set_heartbeat(region, now_ms);
    let e = TcpStream::connect(&a, to).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    // no heartbeat for 5 s: the daemon is gone
    docknet_pipe::layout::set_heartbeat(region, now_ms.saturating_sub(5000));
    let e = TcpStream::connect(&a, to).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotConnected, "{e}");
    assert!(e.to_string().contains("daemon is gone"), "{e}");
    // the pipe removed
    r.remove_pipe("a").unwrap();
    let e = TcpStream::connect(&a, to).unwrap_err();
    assert!(e.to_string().contains("pipe was removed"), "{e}");
}

struct Upper {
    accepted: usize,
    closed: usize,
}

impl docknet_lib::callback::TcpHandler for Upper {
    fn accepted(&mut self, _c: docknet_lib::callback::ConnId) {
        self.accepted += 1;
    }
    fn tcp_recved(&mut self, _c: docknet_lib::callback::ConnId, data: &[u8], reply: &mut Vec<u8>) {
        reply.extend(data.iter().map(|b| b.to_ascii_uppercase()));
    }
    fn closed(&mut self, _c: docknet_lib::callback::ConnId) {
        self.closed += 1;
    }
}

#[test]
fn callback_style_server_answers_in_the_engine_thread() {
    use std::sync::atomic::AtomicBool;
    let n = net(false, 1500);
    let stop = Arc::new(AtomicBool::new(false));
    let (b, stop2) = (n.b.clone(), stop.clone());
    let srv = thread::spawn(move || {
        let mut h = Upper {
            accepted: 0,
            closed: 0,
        };
        docknet_lib::callback::serve_tcp(&b, 7020, &mut h, &stop2).unwrap();
        (h.accepted, h.closed)
    });
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let a = n.a.clone();
            thread::spawn(move || {
                let mut c = TcpStream::connect(&a, SocketAddrV4::new(B, 7020)).unwrap();
                for round in 0..50 {
                    let msg = format!("hello {i} {round}");
                    c.write_all(msg.as_bytes()).unwrap();
                    let mut back = vec![0u8; msg.len()];
                    c.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg.to_uppercase().as_bytes());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (accepted, closed) = srv.join().unwrap();
    assert_eq!(accepted, 3);
    assert_eq!(closed, 3, "each close reached the handler");
}

#[test]
fn stack_rx_callback_sees_every_frame() {
    use docknet_lib::frame::{write_ipv4_headers, PROTO_EXPERIMENT};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path()).unwrap();
    r.create_pipe("a", "10.8.2.1/24", None, None).unwrap();
    r.create_pipe("b", "10.8.2.2/24", None, None).unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Spin).unwrap();
    let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::ADAPTIVE).unwrap();
    let (stop, seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (stop2, seen2) = (stop.clone(), seen.clone());
    let t = thread::spawn(move || {
        docknet_lib::callback::run_frames(&mut b, &stop2, |f, _| {
            seen2.fetch_add(f.len() as u64, Ordering::Relaxed);
        })
    });
    let mut f = vec![0u8; 100];
    write_ipv4_headers(
        &mut f,
        a.mac(),
        [0; 6],
        a.ip(),
        Ipv4Addr::new(10, 8, 2, 2),
        PROTO_EXPERIMENT,
        100,
    );
    for _ in 0..1000 {
        a.send_blocking(&f, std::time::Instant::now() + Duration::from_secs(1))
            .unwrap();
    }
    let t0 = std::time::Instant::now();
    while seen.load(Ordering::Relaxed) < 100_000 && t0.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert_eq!(seen.load(Ordering::Relaxed), 100_000);
}
