//! TCP over a faulty link (drop, duplicate, reorder, delay), in a test binary of its own so it
//! does not share the machine with the 1 GiB transfers of `tcp.rs`.

mod common;
use common::*;
use docknet_lib::{TcpListener, TcpStream};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddrV4;
use std::thread;
use std::time::Duration;

#[test]
fn transfers_survive_a_lossy_duplicating_reordering_delaying_link() {
    // pipes and channels carry TCP segments of up to 64 KiB (1500-byte pipes, a 64 KiB
    // channel): 8 MiB makes enough frames for the faults either way
    for (fc, seed, total) in [(false, 11, 8 << 20), (true, 12, 8 << 20)] {
        let n = net_with(fc, 1500, faulty(seed, 2));
        transfer(&n, 7010, total);
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
