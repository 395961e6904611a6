//! Records: an established connection's bytes over a fast channel outside TCP's segments
//! (`docknet_lib::frame::Record`), mixed with segments, byte-exact, and closed with TCP's FIN.

mod common;
use common::*;
use docknet_lib::device::DeviceStats;
use docknet_lib::{StackConfig, TcpListener, TcpStream};
use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::thread;

/// An echo server on `n.b`, port `port`, for one connection: echoes until the client closes,
/// then checks that its read sees the end.
fn echo(n: &Net, port: u16) -> thread::JoinHandle<()> {
    let mut l = TcpListener::bind(&n.b, port).unwrap();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let k = s.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            s.write_all(&buf[..k]).unwrap();
        }
    })
}

/// A stack that sends records (they are off by default).
fn on() -> StackConfig {
    StackConfig {
        records: true,
        ..StackConfig::default()
    }
}

fn delta(after: DeviceStats, before: DeviceStats) -> (u64, u64, u64) {
    (
        after.tx_records - before.tx_records,
        after.rx_records - before.rx_records,
        after.rx_records_refused - before.rx_records_refused,
    )
}

#[test]
fn a_ping_pong_moves_as_records_and_larger_messages_mix_them_with_segments_byte_exact() {
    let n = net_with(true, 1500, on());
    let srv = echo(&n, 7100);
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7100)).unwrap();
    let mut m = [0u8; 64];
    c.write_all(&m).unwrap();
    c.read_exact(&mut m).unwrap();
    let (a0, b0) = (n.a.device_stats(), n.b.device_stats());
    const ROUNDS: u64 = 300;
    for i in 0..ROUNDS {
        c.write_all(&[i as u8; 64]).unwrap();
        c.read_exact(&mut m).unwrap();
        assert_eq!(m, [i as u8; 64], "round {i}");
    }
    let (a1, b1) = (n.a.device_stats(), n.b.device_stats());
    let (ca, cb) = (delta(a1, a0), delta(b1, b0));
    // every message a record, both ways, and nothing else sent
    assert!(
        ca.0 >= ROUNDS && cb.0 >= ROUNDS && ca.1 >= ROUNDS && cb.1 >= ROUNDS,
        "records: client {ca:?}, server {cb:?}"
    );
    assert_eq!((ca.2, cb.2), (0, 0), "refused");
    assert!(
        a1.tx - a0.tx <= ROUNDS + 2 && b1.tx - b0.tx <= ROUNDS + 2,
        "frames besides the records: {a1:?} {b1:?}"
    );
    // messages larger than a window, of every size: records where the window allows them,
    // segments where not, the window announced again by the reader
    let mut seed = 0x9e37_79b9u64;
    let mut back = vec![0u8; 600 * 1024];
    for i in 0..120u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = match i % 4 {
            0 => 1 + (seed >> 8) as usize % (600 * 1024),
            1 => 1 + (seed >> 8) as usize % 70_000,
            _ => 1 + (seed >> 8) as usize % 1460,
        };
        let out: Vec<u8> = (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect();
        // written by one thread, read by this one: a message past the buffers needs both
        let cr = &c;
        thread::scope(|sc| {
            let writer = sc.spawn(|| {
                let mut w = cr;
                w.write_all(&out)
            });
            let mut r = cr;
            r.read_exact(&mut back[..len])
                .unwrap_or_else(|e| panic!("message {i} ({len} bytes): {e}"));
            writer.join().unwrap().unwrap();
        });
        assert_eq!(back[..len], out[..], "message {i}, {len} bytes");
    }
    let (a2, b2) = (n.a.device_stats(), n.b.device_stats());
    let (ca, cb) = (delta(a2, a1), delta(b2, b1));
    assert!(
        ca.0 > 0 && cb.0 > 0,
        "records: client {ca:?}, server {cb:?}"
    );
    assert!(
        a2.tx - a1.tx > ca.0 && b2.tx - b1.tx > cb.0,
        "segments besides the records: {a2:?} {b2:?}"
    );
    assert_eq!((ca.2, cb.2), (0, 0), "refused");
    // the long records' payloads were copied once, from the ring to where they went
    assert!(
        a2.rx_records_split > a1.rx_records_split && b2.rx_records_split > b1.rx_records_split,
        "records split on receive: client {a2:?}, server {b2:?}"
    );
    // and the connection closes with TCP's FIN after its records
    c.write_all(b"last").unwrap();
    c.read_exact(&mut m[..4]).unwrap();
    assert_eq!(&m[..4], b"last");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn a_stack_that_sends_no_records_takes_them_and_segments_answer_records() {
    // the server sends records (a stream of messages the client only reads), the client
    // sends none but answers the server's question whether it takes them; then the client's
    // segments arrive after them, and are answered
    let off = StackConfig {
        records: false,
        ..StackConfig::default()
    };
    let n = net_two(true, 1500, off, on());
    let mut l = TcpListener::bind(&n.b, 7101).unwrap();
    let srv = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut m = [0u8; 100];
        // two exchanges first: in the first, the server asks whether the client takes
        // records (the question goes before its answer); the client's answer to that comes
        // before its next message, so the stream after it goes as records
        for _ in 0..2 {
            s.read_exact(&mut m).unwrap();
            s.write_all(&m).unwrap();
        }
        for i in 0..50u8 {
            s.write_all(&[i; 100]).unwrap();
        }
        s.read_exact(&mut m).unwrap();
        s.write_all(&m).unwrap();
        assert_eq!(s.read(&mut m).unwrap(), 0);
    });
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7101)).unwrap();
    let mut m = [0u8; 100];
    for i in 0..2u8 {
        c.write_all(&[i; 100]).unwrap();
        c.read_exact(&mut m).unwrap();
        assert_eq!(m, [i; 100]);
    }
    for i in 0..50u8 {
        c.read_exact(&mut m).unwrap();
        assert_eq!(m, [i; 100]);
    }
    let (a0, b0) = (n.a.device_stats(), n.b.device_stats());
    c.write_all(&[77; 100]).unwrap();
    c.read_exact(&mut m).unwrap();
    assert_eq!(m, [77; 100]);
    let b1 = n.b.device_stats();
    drop(c);
    srv.join().unwrap();
    let (a, b) = (n.a.device_stats(), n.b.device_stats());
    assert_eq!(a.tx_records, 0, "the client sent records: {a:?}");
    assert!(b.tx_records >= 45 && a.rx_records >= 45, "{a:?} {b:?}");
    assert_eq!(a.rx_records_refused + b.rx_records_refused, 0);
    // the answer to the client's segment owed it an acknowledgement, which a record does
    // not carry: it left first, in a segment of its own, then the answer as a record
    assert_eq!(
        (b1.tx - b0.tx, b1.tx_records - b0.tx_records),
        (2, 1),
        "{b0:?} {b1:?}"
    );
    assert!(a.tx > a0.tx);
}

/// One 64 B exchange on `c`, checked.
fn round(c: &mut TcpStream, i: u8) {
    let mut m = [0u8; 64];
    c.write_all(&[i; 64]).unwrap();
    c.read_exact(&mut m).unwrap();
    assert_eq!(m, [i; 64], "round {i}");
}

#[test]
fn a_connection_asks_again_after_a_channel_is_removed_and_records_resume_on_a_new_one() {
    // what a stack learnt of a peer over a channel is forgotten when a channel goes (another
    // container may have the peer's address next): the connection goes on through the daemon,
    // then over the new channel it asks again, and moves records once answered
    let n = net_with(true, 1500, on());
    let srv = echo(&n, 7102);
    let mut c = TcpStream::connect(&n.a, SocketAddrV4::new(B, 7102)).unwrap();
    for i in 0..20 {
        round(&mut c, i);
    }
    let asks = || n.a.device_stats().tx_record_asks + n.b.device_stats().tx_record_asks;
    let first = n.a.device_stats();
    // (one end asks: the other learns from the question)
    assert_eq!(asks(), 1, "{first:?}");
    assert!(first.tx_records >= 15, "{first:?}");
    let publish = |add: bool| {
        let mut r = n.reg.lock().unwrap();
        if add {
            r.connect_fc("a", "b", None).unwrap();
        } else {
            r.remove_fc("a", "b").unwrap();
        }
        n.master.publish(r.snapshot());
    };
    publish(false);
    // (the daemon tells both stacks in its own time)
    thread::sleep(std::time::Duration::from_millis(50));
    for i in 20..60 {
        round(&mut c, i);
    }
    let gone = n.a.device_stats();
    publish(true);
    for i in 60..160 {
        round(&mut c, i);
    }
    let back = n.a.device_stats();
    // asked again (by each end at most: one may learn of the removal after the other's
    // question came)
    assert!((2..=3).contains(&asks()), "asked again: {back:?}");
    assert!(
        back.tx_records - gone.tx_records >= 50,
        "records resumed: {gone:?} {back:?}"
    );
    let b = n.b.device_stats();
    assert_eq!(
        back.rx_records_refused + b.rx_records_refused,
        0,
        "{back:?} {b:?}"
    );
    drop(c);
    srv.join().unwrap();
}
