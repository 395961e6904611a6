//! TCP and UDP over DockPipes in one process: two stacks, the daemon's master thread between
//! them (or a fast channel), real regions made by the registry. No root needed.

mod common;
use common::*;
use docknet_daemon::registry::Registry;
use docknet_lib::{Endpoint, Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use docknet_pipe::IdlePolicy;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

#[test]
fn stream_through_the_daemon_arrives_intact() {
    let n = net(false, 9000);
    transfer(&n, 7000, 1 << 30);
    assert!(n.master.forwarded.load(Ordering::Relaxed) > 20_000);
}

#[test]
fn stream_between_two_masters_arrives_intact_while_pipes_come_and_go() {
    let n = net_masters(false, 9000, StackConfig::default(), 2);
    std::thread::scope(|sc| {
        let churn = sc.spawn(|| {
            // pipes of both masters created and removed while the stream flows
            for k in 0..40u32 {
                let mut r = n.reg.lock().unwrap();
                let name = format!("x{k}");
                r.create_pipe(&name, &format!("10.8.0.{}/24", 10 + k), None, None)
                    .unwrap();
                n.master.publish(r.snapshot());
                drop(r);
                thread::sleep(Duration::from_millis(5));
                let mut r = n.reg.lock().unwrap();
                r.remove_pipe(&name).unwrap();
                n.master.publish(r.snapshot());
            }
        });
        transfer(&n, 7002, 256 << 20);
        churn.join().unwrap();
    });
    // 256 MiB in segments of up to 64 KiB: at least 4,096 frames
    let cross = n.master.cross.load(Ordering::Relaxed);
    assert!(
        cross > 4_000,
        "only {cross} frames passed between the masters"
    );
    assert_eq!(n.master.cross_drops.load(Ordering::Relaxed), 0);
}

#[test]
fn a_gigabyte_through_two_masters_at_64k_mtu_arrives_intact() {
    // pipes of different masters, 64 KiB frames: every segment crosses the masters' queue
    let n = net_masters(false, 65535, StackConfig::default(), 2);
    transfer(&n, 7003, 1 << 30);
    assert!(n.master.cross.load(Ordering::Relaxed) > 16_000);
    assert_eq!(n.master.cross_drops.load(Ordering::Relaxed), 0);
}

#[test]
fn stream_over_a_fast_channel_arrives_intact() {
    let n = net(true, 9000);
    let before = n.master.forwarded.load(Ordering::Relaxed);
    transfer(&n, 7001, 1 << 30);
    // only ARP went through the daemon
    assert!(n.master.forwarded.load(Ordering::Relaxed) - before < 10);
    // the receiver's segments had their payload copied once, out of the partner's ring, and
    // the sender's went into it once, from the send buffer
    let b = n.b.device_stats();
    assert!(b.rx_split > b.rx / 2, "{b:?}");
    let a = n.a.device_stats();
    assert!(a.tx_tail > a.tx / 2, "{a:?}");
}

#[test]
fn segments_take_the_size_of_their_path() {
    // through the daemon at MTU 1500: the pipes carry TCP segments of up to 64 KiB within the
    // host (as veth carries GSO segments), so each side's 64 KiB MSS stands and nothing is cut
    let n = net(false, 1500);
    transfer(&n, 7010, 16 << 20);
    let a = n.a.device_stats();
    assert_eq!((a.tx_segmented, a.tx_too_big), (0, 0), "{a:?}");
    // 1460-byte segments would be ~11,500 frames
    assert!(
        a.tx < (16 << 20) / 4000,
        "{} frames for 16 MiB: the pipe's segments were small",
        a.tx
    );
    drop(n);

    // pipes at MTU 1500 with a fast channel of 64 KiB frames: large segments on the channel
    let n = net(true, 1500);
    transfer(&n, 7011, 64 << 20);
    let a = n.a.device_stats();
    assert_eq!((a.tx_segmented, a.tx_too_big), (0, 0), "{a:?}");
    assert!(
        a.tx < (64 << 20) / 4000,
        "{} frames for 64 MiB: the channel's segments were small",
        a.tx
    );

    // the channel goes in the middle of a stream: its large segments go on through the
    // daemon, and the stream goes on intact
    let before = n.master.forwarded.load(Ordering::Relaxed);
    std::thread::scope(|sc| {
        let cut = sc.spawn(|| {
            // gives up after 30 s (the stream then failed): the assertions below say so
            let (start, t) = (n.b.device_stats().rx, std::time::Instant::now());
            while n.b.device_stats().rx < start + 200 {
                if t.elapsed() > Duration::from_secs(30) {
                    return;
                }
                thread::sleep(Duration::from_millis(1));
            }
            let mut r = n.reg.lock().unwrap();
            r.remove_fc("a", "b").unwrap();
            n.master.publish(r.snapshot());
        });
        transfer(&n, 7012, 256 << 20);
        cut.join().unwrap();
    });
    let a = n.a.device_stats();
    assert_eq!((a.tx_segmented, a.tx_too_big), (0, 0), "{a:?}");
    assert!(n.master.forwarded.load(Ordering::Relaxed) - before > 1000);
}

#[test]
fn a_datagram_too_large_for_the_channel_goes_through_the_daemon() {
    // pipes at MTU 9000, a channel of 1500: what the channel cannot carry takes the pipe
    let n = net(false, 9000);
    {
        let mut r = n.reg.lock().unwrap();
        r.connect_fc("a", "b", Some(1500)).unwrap();
        n.master.publish(r.snapshot());
    }
    let mut b = UdpSocket::bind(&n.b, 5354).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5)));
    let a = UdpSocket::bind(&n.a, 0).unwrap();
    let to = SocketAddrV4::new(B, 5354);
    let mut buf = vec![0u8; 16384];
    for len in [100, 1400, 4000, 8000, 1000] {
        a.send_to(&vec![len as u8; len], to).unwrap();
        let (k, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!((k, buf[k - 1]), (len, len as u8));
    }
    let d = n.a.device_stats();
    assert_eq!((d.tx_too_big, d.tx_dropped), (0, 0), "{d:?}");
    assert!(
        n.master.forwarded.load(Ordering::Relaxed) >= 2,
        "the large ones went through the daemon"
    );
}

#[test]
fn connect_to_a_closed_port_is_refused() {
    let n = net(false, 1500);
    let e = TcpStream::connect(&n.a, SocketAddrV4::new(B, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

#[test]
fn a_server_that_closed_first_takes_a_new_connection_on_the_same_port_pair_at_once() {
    // The server closes first, so its side goes through TIME-WAIT (10 s in smoltcp, where it
    // answered a new SYN for the port pair and the client waited in SYN retransmissions, 1 + 2
    // + 4 s ...); the client comes back from the same port at once, as a kernel client or
    // another stack may. DockLib lets the connection go as it enters TIME-WAIT.
    let n = net(false, 1500);
    let mut l = TcpListener::bind(&n.b, 7010).unwrap();
    let srv = thread::spawn(move || {
        for msg in [&b"one"[..], b"two"] {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(msg).unwrap();
            drop(s); // the server closes first
        }
    });
    let to = SocketAddrV4::new(B, 7010);
    let fetch = |what: &str| {
        let t = std::time::Instant::now();
        let mut c = TcpStream::connect_start_from(&n.a, 40_000, to).unwrap();
        while c.connect_result().is_none() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}: no answer");
            thread::sleep(Duration::from_millis(1));
        }
        c.connect_result().unwrap().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5)));
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        (out, t.elapsed())
    };
    let (first, _) = fetch("first");
    assert_eq!(first, b"one");
    // the client's side of the first connection closes (the server's went into TIME-WAIT)
    thread::sleep(Duration::from_millis(200));
    let (second, took) = fetch("second");
    assert_eq!(second, b"two");
    assert!(
        took < Duration::from_millis(900),
        "the new connection took {took:?}"
    );
    srv.join().unwrap();
}

#[test]
fn connections_a_server_closes_first_leave_no_socket_behind() {
    // A connection per request, the server closing first (gunicorn's workers, inetd's
    // children): each used to stay in TIME-WAIT for 10 s with its buffers, walked by every
    // poll. After 300 of them the server holds what it held after the first.
    let n = net(false, 1500);
    let mut l = TcpListener::bind(&n.b, 7011).unwrap();
    let srv = thread::spawn(move || {
        for _ in 0..301 {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"x").unwrap();
            drop(s);
        }
        l
    });
    let to = SocketAddrV4::new(B, 7011);
    let one = || {
        let mut c = TcpStream::connect(&n.a, to).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5)));
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"x");
    };
    one();
    thread::sleep(Duration::from_millis(50));
    let after_one = n.b.sockets();
    for _ in 0..300 {
        one();
    }
    let _l = srv.join().unwrap();
    let t = std::time::Instant::now();
    while n.b.sockets() > after_one && t.elapsed() < Duration::from_secs(2) {
        thread::sleep(Duration::from_millis(10));
    }
    assert!(
        n.b.sockets() <= after_one,
        "{} sockets after 301 connections, {after_one} after the first",
        n.b.sockets()
    );
}

#[test]
fn a_client_reaches_two_new_peers_without_waiting_for_the_second_address() {
    // smoltcp silenced address discovery for the whole neighbour cache for a second after each
    // request: a client that opened connections to two peers it had not talked to within a
    // second sent the second ARP request, and so its SYN, a second late.
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path(), None).unwrap();
    for (p, ip) in [
        ("a", "10.9.0.1/24"),
        ("b", "10.9.0.2/24"),
        ("c", "10.9.0.3/24"),
    ] {
        r.create_pipe(p, ip, Some(1500), None).unwrap();
    }
    let master = Arc::new(docknet_daemon::master::MasterShared::new(r.snapshot()));
    let m = master.clone();
    let h = thread::spawn(move || docknet_daemon::master::run(m, IdlePolicy::ADAPTIVE, None));
    let stack = |p: &str, r: &mut Registry| {
        let conn = r.connect_local(p).unwrap();
        Stack::new(
            Endpoint::from_connection(conn, IdlePolicy::ADAPTIVE, None).unwrap(),
            StackConfig::default(),
        )
    };
    let (a, b, c) = (stack("a", &mut r), stack("b", &mut r), stack("c", &mut r));
    let mut servers = Vec::new();
    for st in [&b, &c] {
        let mut l = TcpListener::bind(st, 7020).unwrap();
        servers.push(thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"hi").unwrap();
        }));
    }
    for ip in [[10, 9, 0, 2], [10, 9, 0, 3]] {
        let t = std::time::Instant::now();
        let mut s = TcpStream::connect(&a, SocketAddrV4::new(ip.into(), 7020)).unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(500), "{ip:?}: {took:?}");
    }
    for s in servers {
        s.join().unwrap();
    }
    master.shutdown.store(true, Ordering::Release);
    master.poke();
    h.join().unwrap();
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

/// A reader that waits lends its buffer to the socket, and the next bytes go straight into it:
/// two threads reading one connection at once must still get each byte once, and only bytes
/// that came (their buffers are filled with a value the stream never carries before each read).
#[test]
fn two_readers_of_one_connection_get_each_byte_once() {
    for fc in [false, true] {
        let n = net(fc, 1500);
        let mut l = TcpListener::bind(&n.b, 7013).unwrap();
        const TOTAL: usize = 4 << 20;
        let srv = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let s = Arc::new(s);
            let readers: Vec<_> = [7usize, 4096, 40_000]
                .into_iter()
                .map(|len| {
                    let s = s.clone();
                    thread::spawn(move || {
                        let mut seen = vec![0u64; 256];
                        let mut buf = vec![0u8; len];
                        loop {
                            buf.fill(0xee);
                            let k = (&*s).read(&mut buf).unwrap();
                            if k == 0 {
                                return seen;
                            }
                            for b in &buf[..k] {
                                seen[usize::from(*b)] += 1;
                            }
                        }
                    })
                })
                .collect();
            let mut seen = vec![0u64; 256];
            for r in readers {
                for (t, c) in seen.iter_mut().zip(r.join().unwrap()) {
                    *t += c;
                }
            }
            seen
        });
        let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7013)).unwrap();
        let data: Vec<u8> = (0..TOTAL).map(|i| (i % 200) as u8).collect();
        for chunk in data.chunks(50_000) {
            c.write_all(chunk).unwrap();
        }
        c.shutdown_write();
        let seen = srv.join().unwrap();
        let mut want = vec![0u64; 256];
        for b in &data {
            want[usize::from(*b)] += 1;
        }
        assert_eq!(
            seen[0xee], 0,
            "fc {fc}: a reader was given bytes that never came"
        );
        assert_eq!(seen, want, "fc {fc}");
    }
}

/// A read that times out takes its buffer back: what comes later goes to the next read.
#[test]
fn a_read_that_timed_out_leaves_the_next_bytes_to_the_next_read() {
    let n = net(true, 1500);
    let mut l = TcpListener::bind(&n.b, 7014).unwrap();
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7014)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut first = vec![0u8; 64];
    assert!(s.read(&mut first).is_err(), "nothing came");
    drop(first);
    c.write_all(b"after the timeout").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut second = vec![0u8; 64];
    let k = s.read(&mut second).unwrap();
    assert_eq!(&second[..k], b"after the timeout");
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
        assert_eq!(from, to.into());
        assert_eq!(&buf[..k], &msg[..]);
    }
    echo.join().unwrap();
}

#[test]
fn a_gone_daemon_or_a_removed_pipe_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(dir.path(), None).unwrap();
    r.create_pipe("a", "10.8.1.1/24", None, None).unwrap();
    // no master thread: nothing forwards, like a dead daemon
    let cfg = StackConfig {
        connect_timeout: Duration::from_millis(300),
        ..StackConfig::default()
    };
    let a = Stack::new(
        Endpoint::from_connection(r.connect_local("a").unwrap(), cfg.idle, None).unwrap(),
        cfg,
    );
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
    let (mut r, _) = Registry::open(dir.path(), None).unwrap();
    r.create_pipe("a", "10.8.2.1/24", None, None).unwrap();
    r.create_pipe("b", "10.8.2.2/24", None, None).unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let mut a =
        Endpoint::from_connection(r.connect_local("a").unwrap(), IdlePolicy::Spin, None).unwrap();
    let mut b =
        Endpoint::from_connection(r.connect_local("b").unwrap(), IdlePolicy::ADAPTIVE, None)
            .unwrap();
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

#[test]
fn one_thread_serves_many_connections_with_wait_and_the_non_blocking_calls() {
    use docknet_lib::{Interest, Watch};
    let n = net(false, 1500);
    let listener = TcpListener::bind(&n.b, 7020).unwrap();
    let b = n.b.clone();
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 50;
    // an echo server: one thread, one wait over the listener and every connection
    let server = thread::spawn(move || {
        let mut conns: Vec<(TcpStream, Vec<u8>)> = Vec::new();
        let (mut done, mut ready) = (0, Vec::new());
        while done < CLIENTS {
            let mut w = vec![Watch::Listener(&listener)];
            for (c, pending) in &conns {
                let i = if pending.is_empty() {
                    Interest::READ
                } else {
                    Interest::BOTH
                };
                w.push(Watch::Stream(c, i));
            }
            b.wait(&w, Some(Duration::from_secs(10)), &mut ready)
                .unwrap();
            assert!(!ready.is_empty(), "nothing ready for 10 s");
            drop(w);
            for &(i, r) in ready.iter().rev() {
                if i == 0 {
                    match listener.try_accept() {
                        Ok((c, _)) => conns.push((c, Vec::new())),
                        Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock),
                    }
                    continue;
                }
                let (c, pending) = &mut conns[i - 1];
                if r.read {
                    let mut buf = [0u8; 4096];
                    match c.try_read(&mut buf) {
                        Ok(0) => {
                            conns.swap_remove(i - 1);
                            done += 1;
                            continue;
                        }
                        Ok(k) => pending.extend_from_slice(&buf[..k]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                if !pending.is_empty() {
                    match c.try_write(pending) {
                        Ok(k) => {
                            pending.drain(..k);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let a = n.a.clone();
            thread::spawn(move || {
                // a non-blocking connect, then blocking exchanges
                let mut c = TcpStream::connect_start(&a, SocketAddrV4::new(B, 7020)).unwrap();
                let mut r = Vec::new();
                while c.connect_result().is_none() {
                    a.wait(
                        &[Watch::Stream(&c, Interest::WRITE)],
                        Some(Duration::from_secs(5)),
                        &mut r,
                    )
                    .unwrap();
                }
                c.connect_result().unwrap().unwrap();
                let mut buf = [0u8; 100];
                assert_eq!(
                    c.try_read(&mut buf).unwrap_err().kind(),
                    ErrorKind::WouldBlock
                );
                for round in 0..ROUNDS {
                    let msg = [(k * 7 + round) as u8; 100];
                    c.write_all(&msg).unwrap();
                    c.read_exact(&mut buf).unwrap();
                    assert_eq!(buf, msg);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    server.join().unwrap();
    // a non-blocking connect to a closed port ends in an error, reported as ready
    let c = TcpStream::connect_start(&n.a, SocketAddrV4::new(B, 9)).unwrap();
    let mut r = Vec::new();
    n.a.wait(
        &[Watch::Stream(&c, Interest::WRITE)],
        Some(Duration::from_secs(5)),
        &mut r,
    )
    .unwrap();
    assert!(r.len() == 1 && r[0].1.error, "{r:?}");
    let e = c.connect_result().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    // a wait with nothing ready times out empty
    let idle = TcpListener::bind(&n.b, 7021).unwrap();
    n.b.wait(
        &[Watch::Listener(&idle)],
        Some(Duration::from_millis(20)),
        &mut r,
    )
    .unwrap();
    assert!(r.is_empty());
}

#[test]
fn connections_beyond_the_backlog_are_not_refused_but_retried() {
    // a backlog of 2: six clients connect at once while the server accepts nothing yet; the
    // SYNs beyond the backlog are dropped (not reset), the clients retry, and all six get in
    let cfg = StackConfig {
        backlog: 2,
        ..StackConfig::default()
    };
    let n = net_with(false, 1500, cfg);
    let listener = TcpListener::bind(&n.b, 7030).unwrap();
    assert_eq!(
        TcpListener::bind(&n.b, 7030).unwrap_err().kind(),
        ErrorKind::AddrInUse
    );
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let a = n.a.clone();
            thread::spawn(move || TcpStream::connect(&a, SocketAddrV4::new(B, 7030)))
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let mut accepted = Vec::new();
    for _ in 0..6 {
        accepted.push(
            listener
                .accept_timeout(Some(Duration::from_secs(10)))
                .unwrap(),
        );
    }
    for c in clients {
        c.join().unwrap().expect("every client gets in");
    }
    assert!(
        n.b.device_stats().syn_dropped > 0,
        "the backlog was full once"
    );
}

/// Raw peers on pipes of their own (one source address each) that send `B:port` a SYN each
/// and never complete it; returned so their pipes stay attached.
fn half_open_peers(n: &Net, first: u8, count: u8, port: u16) -> Vec<Endpoint> {
    let mut peers = Vec::new();
    for i in first..first + count {
        let mut r = n.reg.lock().unwrap();
        let name = format!("h{i}");
        r.create_pipe(&name, &format!("10.8.0.{i}/24"), None, None)
            .unwrap();
        n.master.publish(r.snapshot());
        let mut ep =
            Endpoint::from_connection(r.connect_local(&name).unwrap(), IdlePolicy::Spin, None)
                .unwrap();
        drop(r);
        let mac = ep.resolve(B, Duration::from_secs(2)).expect("ARP");
        send_syn(&mut ep, mac, 40000, port);
        peers.push(ep);
    }
    peers
}

#[test]
fn half_open_connections_make_room_for_new_ones_and_expire() {
    // a backlog of 4, and four peers (four addresses) leave a SYN each unanswered: the pool is
    // full of half-open connections
    let cfg = StackConfig {
        backlog: 4,
        half_open_timeout: Duration::from_millis(2500),
        ..StackConfig::default()
    };
    let n = net_with(false, 1500, cfg);
    let listener = TcpListener::bind(&n.b, 7040).unwrap();
    let t0 = std::time::Instant::now();
    let _peers = half_open_peers(&n, 20, 4, 7040);
    // once they are older than HALF_OPEN_MIN_AGE, a fifth SYN takes the oldest one's place
    thread::sleep(docknet_lib::stack::HALF_OPEN_MIN_AGE + Duration::from_millis(100));
    assert_eq!(n.b.device_stats().syn_evicted, 0);
    let c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7040)).expect("room was made");
    listener
        .accept_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(n.b.device_stats().syn_evicted, 1);
    drop(c);
    // past the deadline the other three are gone: four connections at once, none accepted
    // until all are in, fit the backlog without evicting anything
    thread::sleep(Duration::from_millis(3300).saturating_sub(t0.elapsed()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let a = n.a.clone();
            thread::spawn(move || TcpStream::connect(&a, SocketAddrV4::new(B, 7040)))
        })
        .collect();
    let held: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().unwrap().expect("room for all four"))
        .collect();
    for _ in 0..4 {
        listener
            .accept_timeout(Some(Duration::from_secs(5)))
            .unwrap();
    }
    assert_eq!(n.b.device_stats().syn_evicted, 1, "expired, not evicted");
    drop(held);
    // an accepted connection keeps no deadline: idle for longer than it, it lives
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7040)).unwrap();
    let (mut s, _) = listener
        .accept_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    thread::sleep(Duration::from_millis(2600));
    c.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    s.read_exact(&mut got).unwrap();
    s.write_all(b"pong").unwrap();
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

/// Sends `B:to` a SYN from `peer`'s port `from` (never completed).
fn send_syn(peer: &mut Endpoint, mac: [u8; 6], from: u16, to: u16) {
    use docknet_lib::frame::{write_ipv4_headers, ETH, IPV4};
    let len = ETH + IPV4 + 20;
    let mut f = vec![0u8; len];
    write_ipv4_headers(&mut f, peer.mac(), mac, peer.ip(), B, 6, len);
    let t = &mut f[ETH + IPV4..];
    t[0..2].copy_from_slice(&from.to_be_bytes());
    t[2..4].copy_from_slice(&to.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    peer.send(&f).unwrap();
    peer.flush();
}

#[test]
fn one_source_cannot_hold_a_whole_backlog_half_open() {
    // a backlog of 16: one peer's SYNs from 64 ports of its own, never completed, get at most
    // a quarter of it (answered with SYN-ACKs; the rest dropped); another client still gets in
    // without evicting anything
    let cfg = StackConfig {
        backlog: 16,
        ..StackConfig::default()
    };
    let n = net_with(false, 1500, cfg);
    let listener = TcpListener::bind(&n.b, 7041).unwrap();
    let mut peer = half_open_peers(&n, 30, 1, 7041).pop().unwrap();
    let mac = peer.resolve(B, Duration::from_secs(2)).unwrap();
    let mut answered = std::collections::HashSet::new();
    let mut buf = vec![0u8; 2048];
    let mut read = |peer: &mut Endpoint, answered: &mut std::collections::HashSet<u16>| {
        while let Some((k, _)) = peer.recv(&mut buf) {
            let f = &buf[..k];
            // a SYN-ACK from B: its destination port is the SYN's source port
            if k >= 54 && f[12..14] == [8, 0] && f[23] == 6 && f[47] & 0x12 == 0x12 {
                answered.insert(u16::from_be_bytes([f[36], f[37]]));
            }
        }
    };
    for port in 1..=64u16 {
        send_syn(&mut peer, mac, 41000 + port, 7041);
        thread::sleep(Duration::from_micros(300));
        read(&mut peer, &mut answered);
    }
    thread::sleep(Duration::from_millis(100));
    read(&mut peer, &mut answered);
    let st = n.b.device_stats();
    assert!(st.syn_limited > 0, "{st:?}");
    // a quarter of 16, and the SYNs one refill admits beyond it
    assert!(
        (4..=6).contains(&answered.len()),
        "half-open connections one source got: {} ({st:?})",
        answered.len()
    );
    let _c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7041)).expect("room for others");
    listener
        .accept_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(n.b.device_stats().syn_evicted, 0, "no eviction needed");
}

#[test]
fn a_callback_server_keeps_room_for_others_under_a_syn_flood() {
    // the callback server accepts through the stack's listener: one peer's never-completed
    // SYNs get a quarter of its backlog, and another client is served
    use docknet_lib::callback::{serve_tcp, ConnId, TcpHandler};
    struct Echo;
    impl TcpHandler for Echo {
        fn tcp_recved(&mut self, _c: ConnId, data: &[u8], reply: &mut Vec<u8>) {
            reply.extend_from_slice(data);
        }
    }
    let cfg = StackConfig {
        backlog: 8,
        ..StackConfig::default()
    };
    let n = net_with(false, 1500, cfg);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b, stop2) = (n.b.clone(), stop.clone());
    let srv = thread::spawn(move || serve_tcp(&b, 7042, &mut Echo, &stop2));
    thread::sleep(Duration::from_millis(100));
    let mut peer = half_open_peers(&n, 40, 1, 7042).pop().unwrap();
    let mac = peer.resolve(B, Duration::from_secs(2)).unwrap();
    for port in 1..=64u16 {
        send_syn(&mut peer, mac, 42000 + port, 7042);
        thread::sleep(Duration::from_micros(300));
    }
    let st = n.b.device_stats();
    assert!(st.syn_limited > 0, "{st:?}");
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7042)).expect("room for others");
    c.write_all(b"hello").unwrap();
    let mut got = [0u8; 5];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
    stop.store(true, Ordering::Relaxed);
    srv.join().unwrap().unwrap();
}

#[test]
fn a_stack_answers_an_icmp_echo_request() {
    // smoltcp's automatic echo reply: a stack answers ping whatever its sockets do
    let n = net(false, 1500);
    let _l = TcpListener::bind(&n.b, 7010).unwrap();
    let mut r = n.reg.lock().unwrap();
    r.create_pipe("p", "10.8.0.9/24", None, None).unwrap();
    n.master.publish(r.snapshot());
    let mut ep =
        Endpoint::from_connection(r.connect_local("p").unwrap(), IdlePolicy::Spin, None).unwrap();
    drop(r);
    let mac = ep
        .resolve(B, Duration::from_secs(2))
        .expect("ARP through the daemon");
    let payload = b"docknet echo";
    let len = docknet_lib::frame::ETH + docknet_lib::frame::IPV4 + 8 + payload.len();
    let mut f = vec![0u8; len];
    docknet_lib::frame::write_ipv4_headers(&mut f, ep.mac(), mac, ep.ip(), B, 1, len);
    let icmp = &mut f[34..];
    icmp[0] = 8; // echo request
    icmp[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    icmp[6..8].copy_from_slice(&7u16.to_be_bytes());
    icmp[8..].copy_from_slice(payload);
    let c = docknet_lib::frame::checksum(icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ep.send(&f).unwrap();
    ep.flush();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut buf = vec![0u8; 2048];
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no echo reply from {B}"
        );
        let Some((k, _)) = ep.recv(&mut buf) else {
            thread::sleep(Duration::from_micros(100));
            continue;
        };
        let r = &buf[..k];
        if k < 42 || r[12..14] != [8, 0] || r[23] != 1 || r[26..30] != B.octets() {
            continue;
        }
        assert_eq!(r[34], 0, "an echo reply");
        assert_eq!(
            &r[38..42],
            &[0x12, 0x34, 0, 7],
            "its identifier and sequence"
        );
        assert_eq!(&r[42..], payload);
        break;
    }
}

#[test]
fn a_stack_pings_another_and_an_absent_address_times_out() {
    for fc in [false, true] {
        let n = net(fc, 1500);
        let rtt =
            n.a.ping(B, 56, Duration::from_secs(3))
                .expect("an echo reply");
        assert!(rtt < Duration::from_secs(3));
        // again: the neighbours are known now
        n.a.ping(B, 8, Duration::from_secs(3))
            .expect("a second reply");
        let e =
            n.a.ping(Ipv4Addr::new(10, 8, 0, 77), 8, Duration::from_millis(200))
                .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    }
}

#[test]
fn replies_carry_the_acks_and_a_receiver_going_to_sleep_sends_what_it_held_back() {
    one_frame_per_message(IdlePolicy::ADAPTIVE, false);
    one_frame_per_message(IdlePolicy::Block, false);
}

#[test]
fn a_server_thread_asleep_in_accept_does_not_send_acks_ahead_of_the_replies() {
    // The thread in `accept` wakes for every frame too; going back to sleep, it used to send the
    // ACK the reply was about to carry (a bare ACK before every other answer).
    one_frame_per_message(IdlePolicy::ADAPTIVE, true);
    one_frame_per_message(IdlePolicy::Block, true);
}

/// [`ping_pong_frames`], whose frame count must be within its bound in one of three runs. The
/// count depends on the order in which the scheduler wakes two threads for one frame: on a
/// loaded machine a run now and then has the accept thread go back to sleep, releasing the
/// held ACK, between the server's read and its reply (226 frames for 199 answers once, under
/// the whole test suite). Without the rule it bounds, every run sent 243-288.
fn one_frame_per_message(idle: IdlePolicy, accept_thread: bool) {
    let mut tries = Vec::new();
    for _ in 0..3 {
        match ping_pong_frames(idle, accept_thread) {
            None => return,
            Some(e) => tries.push(e),
        }
    }
    panic!("in three runs: {}", tries.join("; "));
}

/// A 64 B ping-pong between a client and a server thread (beside a second server thread blocked
/// in `accept` on the same stack with `accept_thread`), with waits at `idle`: one frame per
/// message each way (else what was counted, returned), and an ACK held back leaves when the
/// server goes to sleep (asserted).
fn ping_pong_frames(idle: IdlePolicy, accept_thread: bool) -> Option<String> {
    // An ACK delay far longer than the test: only a reply or the release before a sleep can
    // acknowledge anything in time. Segments only: records (tests/records.rs) need no ACK.
    let cfg = StackConfig {
        ack_delay: Some(Duration::from_secs(60)),
        idle,
        records: false,
        ..StackConfig::default()
    };
    let n = net_with(true, 1500, cfg);
    const ROUNDS: u64 = 200;
    let mut l = TcpListener::bind(&n.b, 7010).unwrap();
    let srv = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let waiter = accept_thread.then(|| {
            thread::spawn(move || {
                // nobody else connects: this accept ends when the client's last connection
                // comes, after the rounds
                let _ = l.accept();
            })
        });
        let mut m = [0u8; 64];
        for _ in 0..ROUNDS {
            s.read_exact(&mut m).unwrap();
            s.write_all(&m).unwrap();
        }
        // one way: take a message, then sleep in the next read until the client closes
        s.read_exact(&mut m).unwrap();
        assert_eq!(s.read(&mut m).unwrap(), 0);
        waiter
    });
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7010)).unwrap();
    let mut m = [0u8; 64];
    // a first round settles the handshake's frames (and lets the accept thread start)
    c.write_all(&m).unwrap();
    c.read_exact(&mut m).unwrap();
    thread::sleep(Duration::from_millis(20));
    let before = (n.a.device_stats().tx, n.b.device_stats().tx);
    let fast_before = (n.a.device_stats().tx_fast, n.b.device_stats().tx_fast);
    for i in 1..ROUNDS {
        c.write_all(&[i as u8; 64]).unwrap();
        c.read_exact(&mut m).unwrap();
        assert_eq!(m, [i as u8; 64]);
    }
    let sent = (
        n.a.device_stats().tx - before.0,
        n.b.device_stats().tx - before.1,
    );
    // each message of an established connection left from the headers of the one before it
    // (the device's fast path), both ways
    let fast = (
        n.a.device_stats().tx_fast - fast_before.0,
        n.b.device_stats().tx_fast - fast_before.1,
    );
    let least = (ROUNDS - 1) * 9 / 10;
    assert!(
        fast.0 >= least && fast.1 >= least,
        "messages sent from kept headers ({idle}): client {}, server {} of {}",
        fast.0,
        fast.1,
        ROUNDS - 1
    );
    // one frame per message each way: no pure ACK between a request and its reply
    let most = (ROUNDS - 1) * 11 / 10;
    let over = (sent.0 > most || sent.1 > most).then(|| {
        format!(
            "frames sent for {} rounds ({idle}, accept thread {accept_thread}): client {}, \
             server {}",
            ROUNDS - 1,
            sent.0,
            sent.1
        )
    });
    c.write_all(&[7; 64]).unwrap();
    // within the client's shortest retransmission timeout (1 s), whose duplicate would make
    // the server acknowledge at once
    c.flush_acked(Duration::from_millis(800))
        .expect("the server acknowledges before it sleeps, not after the 60 s delay");
    drop(c);
    let waiter = srv.join().unwrap();
    if let Some(w) = waiter {
        let _last = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7010)).unwrap();
        w.join().unwrap();
    }
    over
}

/// The blocked-signal mask (`SigBlk`) of a `/proc/.../status` text.
fn sig_blocked(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap()
}

#[test]
fn the_engine_thread_takes_none_of_the_programs_signals() {
    let _n = net(false, 1500);
    // SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM, SIGCHLD
    let wanted: u64 = [1u32, 2, 3, 10, 12, 14, 15, 17]
        .iter()
        .map(|s| 1u64 << (s - 1))
        .sum();
    let mut engines = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        // (another test's stack may end while this one looks)
        let Ok(comm) = std::fs::read_to_string(t.path().join("comm")) else {
            continue;
        };
        if comm.trim() != "docklib-engine" {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        let blocked = sig_blocked(&status);
        assert_eq!(
            blocked & wanted,
            wanted,
            "an engine thread takes signals: SigBlk {blocked:#x}"
        );
        engines += 1;
    }
    assert!(engines >= 2, "{engines} engine threads found");
    // the thread that made the stacks keeps its own mask
    let mine = sig_blocked(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    assert_eq!(
        mine & (1 << 14),
        0,
        "SIGTERM left blocked in the caller: {mine:#x}"
    );
}
