//! DockLib for a socket layer under unmodified programs: streams shared between threads, a
//! waker that ends a wait from another thread, peeking, addresses, options, UDP truncation.

mod common;

use common::{net, B};
use docknet_lib::{Interest, Ready, TcpListener, TcpStream, UdpSocket, Waited, Waker, Watch};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn a_waker_ends_a_wait_from_another_thread_and_a_wake_before_the_wait_is_not_lost() {
    let n = net(false, 1500);
    let l = TcpListener::bind(&n.b, 7100).unwrap();
    let waker = Arc::new(Waker::new());
    let mut out = Vec::new();

    // woken before the wait starts, after the token was read: the wait ends at once
    let token = waker.token();
    waker.wake();
    let t = Instant::now();
    let r =
        n.b.wait_wakeable(
            &[Watch::Listener(&l)],
            Some(Duration::from_secs(5)),
            &[(&waker, token)],
            &mut out,
        )
        .unwrap();
    assert_eq!(r, Waited::Woken);
    assert!(t.elapsed() < Duration::from_secs(1));

    // woken while asleep
    let w2 = waker.clone();
    let token = waker.token();
    let h = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        w2.wake();
    });
    let t = Instant::now();
    let r =
        n.b.wait_wakeable(
            &[Watch::Listener(&l)],
            Some(Duration::from_secs(5)),
            &[(&waker, token)],
            &mut out,
        )
        .unwrap();
    h.join().unwrap();
    assert_eq!(r, Waited::Woken);
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(150) && e < Duration::from_secs(2),
        "{e:?}"
    );

    // not woken: times out
    let token = waker.token();
    let r =
        n.b.wait_wakeable(
            &[Watch::Listener(&l)],
            Some(Duration::from_millis(100)),
            &[(&waker, token)],
            &mut out,
        )
        .unwrap();
    assert_eq!(r, Waited::TimedOut);
    assert!(out.is_empty());

    // ready wins
    let _c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7100)).unwrap();
    let token = waker.token();
    let r =
        n.b.wait_wakeable(
            &[Watch::Listener(&l)],
            Some(Duration::from_secs(5)),
            &[(&waker, token)],
            &mut out,
        )
        .unwrap();
    assert_eq!(r, Waited::Ready);
    assert_eq!(
        out,
        vec![(
            0,
            Ready {
                read: true,
                ..Ready::default()
            }
        )]
    );
}

#[test]
fn threads_share_one_stream_reading_and_writing_at_once() {
    let n = net(true, 1500);
    let l = TcpListener::bind(&n.b, 7101).unwrap();
    let c = Arc::new(TcpStream::connect(&n.a, SocketAddrV4::new(B, 7101)).unwrap());
    let (s, peer) = l
        .try_accept()
        .or_else(|_| l.accept_timeout(Some(Duration::from_secs(5))))
        .unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    assert_eq!(s.local_addr().unwrap(), SocketAddrV4::new(B, 7101).into());
    assert_eq!(c.peer_addr().unwrap(), SocketAddrV4::new(B, 7101).into());
    // the server echoes
    let echo = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut total = 0;
        loop {
            let k = (&s).read(&mut buf).unwrap();
            if k == 0 {
                return total;
            }
            (&s).write_all(&buf[..k]).unwrap();
            total += k;
        }
    });
    // one thread writes, another reads the echo, through the same Arc<TcpStream>
    const TOTAL: usize = 1 << 20;
    let w = c.clone();
    let writer = thread::spawn(move || {
        let chunk: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut sent = 0;
        while sent < TOTAL {
            let k = (TOTAL - sent).min(chunk.len());
            (&*w).write_all(&chunk[..k]).unwrap();
            sent += k;
        }
        w.shutdown_write();
    });
    let mut got = 0;
    let mut buf = [0u8; 8192];
    loop {
        let k = c
            .read_timeout(&mut buf, Some(Duration::from_secs(20)))
            .unwrap();
        if k == 0 {
            break;
        }
        for (j, b) in buf[..k].iter().enumerate() {
            assert_eq!(*b, ((got + j) % 1000) as u8);
        }
        got += k;
    }
    writer.join().unwrap();
    assert_eq!(got, TOTAL);
    assert_eq!(echo.join().unwrap(), TOTAL);
}

#[test]
fn peek_leaves_the_data_and_options_read_back() {
    let n = net(false, 1500);
    let l = TcpListener::bind(&n.b, 0).unwrap();
    assert!(l.port() >= 49152, "ephemeral port {}", l.port());
    let c = TcpStream::connect(&n.a, SocketAddrV4::new(B, l.port())).unwrap();
    let (s, _) = l.accept_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        s.try_peek(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    c.write_timeout(b"hello", None).unwrap();
    let t = Instant::now();
    let k = loop {
        match s.try_peek(&mut buf) {
            Ok(k) => break k,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(t.elapsed() < Duration::from_secs(5));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(&buf[..k], b"hello");
    assert_eq!(s.bytes_readable(), 5);
    assert_eq!(s.try_read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert!(c.nodelay(), "Nagle is off by default");
    c.set_nodelay(false);
    assert!(!c.nodelay());
    c.set_keepalive(Some(Duration::from_secs(30)));
    // end of stream peeks as 0, like a read
    c.shutdown_write();
    let t = Instant::now();
    loop {
        match s.try_peek(&mut buf) {
            Ok(0) => break,
            Ok(k) => panic!("peeked {k} bytes after FIN"),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(t.elapsed() < Duration::from_secs(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(n.b.on_link(Ipv4Addr::new(10, 8, 0, 200)));
    assert!(!n.b.on_link(Ipv4Addr::new(10, 8, 1, 2)));
    assert!(!n.b.on_link(Ipv4Addr::LOCALHOST));
    assert_eq!(n.b.prefix(), 24);
}

#[test]
fn a_read_with_a_taker_consumes_only_what_it_took() {
    let n = net(false, 1500);
    let l = TcpListener::bind(&n.b, 0).unwrap();
    let c = TcpStream::connect(&n.a, SocketAddrV4::new(B, l.port())).unwrap();
    let (s, _) = l.accept_timeout(Some(Duration::from_secs(5))).unwrap();
    let refuse = |_: &[u8]| Err(std::io::Error::from(ErrorKind::BrokenPipe));
    assert_eq!(
        s.try_read_with(refuse).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "nothing arrived: the taker is not asked"
    );
    c.write_timeout(b"hello world", None).unwrap();
    let t = Instant::now();
    while s.bytes_readable() < 11 {
        let _ = s.try_peek(&mut [0u8; 1]);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    // a taker that refuses leaves every byte; one that takes nothing is a wait
    assert_eq!(
        s.try_read_with(refuse).unwrap_err().kind(),
        ErrorKind::BrokenPipe
    );
    assert_eq!(
        s.try_read_with(|_| Ok(0)).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    assert_eq!(s.bytes_readable(), 11);
    // it sees what arrived and takes part of it; the rest stays for the next read
    let mut seen = Vec::new();
    let took = s
        .try_read_with(|b| {
            seen.extend_from_slice(b);
            Ok(6)
        })
        .unwrap();
    assert_eq!((took, &seen[..]), (6, &b"hello world"[..]));
    // it cannot take more than it was shown
    assert_eq!(s.try_read_with(|_| Ok(1000)).unwrap(), 5);
    c.shutdown_write();
    let t = Instant::now();
    loop {
        match s.try_read_with(refuse) {
            Ok(0) => break,
            Ok(k) => panic!("took {k} bytes after FIN"),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(t.elapsed() < Duration::from_secs(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn udp_messages_longer_than_the_buffer_are_cut_and_peek_keeps_them() {
    let n = net(false, 1500);
    let rx = UdpSocket::bind(&n.b, 7102).unwrap();
    let tx = UdpSocket::bind(&n.a, 0).unwrap();
    tx.send_to(&[7u8; 300], SocketAddrV4::new(B, 7102)).unwrap();
    let watch = [Watch::Udp(&rx, Interest::READ)];
    let mut out = Vec::new();
    n.b.wait(&watch, Some(Duration::from_secs(5)), &mut out)
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(rx.next_len(), Some(300));
    let mut small = [0u8; 100];
    let (k, whole, from) = rx.try_recv_msg(&mut small, true).unwrap();
    assert_eq!((k, whole, from), (100, 300, tx.local_addr().into()));
    let (k, whole, _) = rx.try_recv_msg(&mut small, false).unwrap();
    assert_eq!((k, whole), (100, 300));
    assert_eq!(rx.next_len(), None);
    assert_eq!(
        rx.try_recv_msg(&mut small, false).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
}

#[test]
fn ready_now_reads_the_sockets_state_without_polling() {
    let n = net(false, 1500);
    let l = TcpListener::bind(&n.b, 7103).unwrap();
    let c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7103)).unwrap();
    let (s, _) = l.accept_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    n.b.ready_now(&[Watch::Stream(&s, Interest::READ)], &mut out);
    assert!(out.is_empty());
    c.write_timeout(b"x", None).unwrap();
    // the byte may still be in the rings: a wait polls it in, ready_now sees it afterwards
    n.b.wait(
        &[Watch::Stream(&s, Interest::READ)],
        Some(Duration::from_secs(5)),
        &mut out,
    )
    .unwrap();
    assert_eq!(out.len(), 1);
    n.b.ready_now(&[Watch::Stream(&s, Interest::BOTH)], &mut out);
    assert_eq!(
        out,
        vec![(
            0,
            Ready {
                read: true,
                write: true,
                ..Ready::default()
            }
        )]
    );
}
