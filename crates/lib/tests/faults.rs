//! TCP over a faulty link (drop, duplicate, reorder, delay), in a test binary of its own so it
//! does not share the machine with the 1 GiB transfers of `tcp.rs`.

mod common;
use common::*;
use docknet_lib::{StackConfig, TcpListener, TcpStream};
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

#[test]
fn messages_of_every_size_cross_a_lossy_fast_channel_byte_exact_both_ways() {
    // An echo over a fast channel whose frames are dropped, duplicated, reordered and delayed:
    // messages of sizes from 1 byte to past a segment, each answered whole and checked; then
    // the same without faults. Without faults most of them go as records (with them, some:
    // the faults touch the segments around them, never a record, which a ring never loses);
    // without records, most of them leave from the headers of the connection's last segment
    // (the device's fast path).
    let with_records = |records, cfg| StackConfig { records, ..cfg };
    for (cfg, rounds) in [
        (with_records(true, faulty(31, 1)), 150u64),
        (with_records(true, StackConfig::default()), 400),
        (with_records(false, faulty(32, 1)), 150),
        (with_records(false, StackConfig::default()), 400),
    ] {
        let lossy = cfg.faults.is_some();
        let records = cfg.records;
        let n = net_with(true, 1500, cfg);
        let mut l = TcpListener::bind(&n.b, 7012).unwrap();
        let srv = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60)));
            let mut buf = vec![0u8; 80 * 1024];
            loop {
                let k = s.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                s.write_all(&buf[..k]).unwrap();
            }
        });
        let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7012)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60)));
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let (mut out, mut back) = (Vec::new(), vec![0u8; 80 * 1024]);
        for i in 0..rounds {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // mostly within one segment (1,460 bytes here), now and then several
            let len = match seed % 10 {
                0 => 1 + (seed >> 8) as usize % (70 * 1024),
                _ => 1 + (seed >> 8) as usize % 1460,
            };
            out.clear();
            out.extend((0..len).map(|j| (i as usize * 31 + j * 7) as u8));
            c.write_all(&out).unwrap();
            c.read_exact(&mut back[..len])
                .unwrap_or_else(|e| panic!("round {i} ({len} bytes, lossy {lossy}): {e}"));
            assert_eq!(back[..len], out[..], "round {i}, {len} bytes");
        }
        drop(c);
        srv.join().unwrap();
        let (a, b) = (n.a.device_stats(), n.b.device_stats());
        if lossy {
            assert!(a.injected + b.injected > 0, "{a:?} {b:?}");
        }
        assert_eq!(
            a.rx_records_refused + b.rx_records_refused,
            0,
            "{a:?} {b:?}"
        );
        // (every frame of a lossy link is delayed: a connection there rarely has nothing in
        // flight and nothing owed, and its messages go as segments, from kept headers)
        let carried = match (records, lossy) {
            (true, false) => a.tx_records.min(b.tx_records) >= rounds / 2,
            // (with the faults' drops, some go as segments)
            (true, true) => a.tx_records + b.tx_records >= rounds / 2,
            (false, _) => {
                a.tx_records + b.tx_records == 0 && a.tx_fast.min(b.tx_fast) >= rounds / 2
            }
        };
        assert!(carried, "lossy {lossy}, records {records}: {a:?} {b:?}");
    }
}
