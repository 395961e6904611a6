//! Endpoints over real regions made by the daemon's registry, in one process (no root):
//! fast-channel routing, its discovery and removal, and the daemon path with a master thread.

use docknet_daemon::master::{self, MasterShared};
use docknet_daemon::registry::Registry;
use docknet_lib::frame::{write_ipv4_headers, PROTO_EXPERIMENT};
use docknet_lib::{Endpoint, Via};
use docknet_pipe::IdlePolicy;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const A: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 2);

fn frame(src: &Endpoint, dst: Ipv4Addr, dst_mac: [u8; 6], len: usize, tag: u8) -> Vec<u8> {
    let mut f = vec![tag; len];
    write_ipv4_headers(
        &mut f,
        src.mac(),
        dst_mac,
        src.ip(),
        dst,
        PROTO_EXPERIMENT,
        len,
    );
    f
}

fn recv_within(ep: &mut Endpoint, buf: &mut [u8], t: Duration) -> Option<(usize, Via)> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some(r) = ep.recv(buf) {
            return Some(r);
        }
        ep.idle(Duration::from_millis(5));
    }
    None
}

fn setup() -> (tempfile::TempDir, Registry) {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path()).unwrap();
    r.create_pipe("a", "10.3.0.1/24", None, None).unwrap();
    r.create_pipe("b", "10.3.0.2/24", None, None).unwrap();
    (d, r)
}

#[test]
fn fast_channel_carries_frames_both_ways_in_order() {
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Spin).unwrap();
    let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::Spin).unwrap();
    assert_eq!(a.fc_peers().len(), 1);
    assert_eq!(b.fc_peers()[0].0, A);
    let mut buf = vec![0u8; 70000];
    for round in 0..3000u32 {
        let len = 60 + (round as usize * 37) % 9000;
        let f = frame(&a, B, b.mac(), len, round as u8);
        assert_eq!(a.send(&f), Ok(Via::FastChannel));
        a.flush();
        let (n, via) = b.recv(&mut buf).expect("frame over the channel");
        assert_eq!((n, via), (len, Via::FastChannel));
        assert_eq!(&buf[..n], &f[..]);
        let back = frame(&b, A, a.mac(), 64, 0xee);
        assert_eq!(b.send(&back), Ok(Via::FastChannel));
        b.flush();
        let (n, via) = a.recv(&mut buf).expect("reply over the channel");
        assert_eq!((n, via), (64, Via::FastChannel));
    }
    // a fresh attachment resumes where the last one stopped
    drop(a);
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Spin).unwrap();
    b.send(&frame(&b, A, a.mac(), 100, 7)).unwrap();
    b.flush();
    assert_eq!(a.recv(&mut buf).map(|x| x.0), Some(100));
    assert!(a.recv(&mut buf).is_none());
}

#[test]
fn frames_read_before_detaching_are_not_delivered_again() {
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Spin).unwrap();
    let mut buf = vec![0u8; 2048];
    {
        let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::Spin).unwrap();
        for tag in 1..=5u8 {
            a.send(&frame(&a, B, b.mac(), 64, tag)).unwrap();
        }
        a.flush();
        // read two of five, then detach with the rest still queued
        for tag in 1..=2u8 {
            b.recv(&mut buf).unwrap();
            assert_eq!(buf[40], tag);
        }
    }
    let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::Spin).unwrap();
    for tag in 3..=5u8 {
        b.recv(&mut buf).unwrap();
        assert_eq!(
            buf[40], tag,
            "a re-attached endpoint resumes after what was read"
        );
    }
    assert!(b.recv(&mut buf).is_none());
}

#[test]
fn channels_appear_and_disappear_while_attached() {
    let (_d, mut r) = setup();
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Spin).unwrap();
    let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::Spin).unwrap();
    assert!(a.fc_peers().is_empty());
    let f = frame(&a, B, b.mac(), 64, 1);
    assert_eq!(a.send(&f), Ok(Via::Daemon));
    r.connect_fc("a", "b", None).unwrap();
    let mut buf = vec![0u8; 2048];
    assert!(b.recv(&mut buf).is_none());
    a.refresh();
    assert_eq!(a.send(&f), Ok(Via::FastChannel));
    a.flush();
    assert_eq!(b.recv(&mut buf).map(|x| x.1), Some(Via::FastChannel));
    r.remove_fc("a", "b").unwrap();
    a.refresh();
    assert!(a.fc_peers().is_empty());
    assert_eq!(a.send(&f), Ok(Via::Daemon));
}

#[test]
fn daemon_path_with_a_master_thread_and_a_sleeping_receiver() {
    let (_d, r) = setup();
    let shared = Arc::new(MasterShared::new(r.snapshot()));
    let m = shared.clone();
    let master = std::thread::spawn(move || master::run(m, IdlePolicy::ADAPTIVE));
    let mut a = Endpoint::attach(&r.pipe_dir("a"), IdlePolicy::Block).unwrap();
    let mut b = Endpoint::attach(&r.pipe_dir("b"), IdlePolicy::Block).unwrap();
    let mac_b = a
        .resolve(B, Duration::from_secs(2))
        .expect("ARP answered by the daemon");
    assert_eq!(mac_b, b.mac());
    let mut buf = vec![0u8; 2048];
    // let everyone fall asleep, then wake the chain with one frame
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..200u32 {
        let f = frame(&a, B, mac_b, 64 + (i as usize % 1400), i as u8);
        a.send_blocking(&f, Instant::now() + Duration::from_secs(1))
            .unwrap();
        let (n, via) = recv_within(&mut b, &mut buf, Duration::from_secs(2)).expect("forwarded");
        assert_eq!(via, Via::Daemon);
        assert_eq!(&buf[..n], &f[..]);
    }
    // a frame to nobody and a spoofed frame are dropped and counted, not delivered
    a.send(&frame(&a, Ipv4Addr::new(10, 3, 0, 99), mac_b, 64, 0))
        .unwrap();
    let mut spoof = frame(&a, B, mac_b, 64, 0);
    spoof[26..30].copy_from_slice(&[10, 3, 0, 50]);
    a.send(&spoof).unwrap();
    a.flush();
    assert!(recv_within(&mut b, &mut buf, Duration::from_millis(100)).is_none());
    let snap = shared.snap.load_full();
    let pa = snap.pipes.iter().find(|p| p.name == "a").unwrap();
    let t = Instant::now();
    loop {
        let c = pa.counters.load_all();
        let get = |n: &str| {
            c[docknet_daemon::registry::COUNTER_NAMES
                .iter()
                .position(|x| *x == n)
                .unwrap()]
        };
        if get("drop_no_route") == 1 && get("drop_spoofed") == 1 {
            assert_eq!(get("arp_replies"), 1);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "counters never showed the drops: {c:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        shared.sleeps.load(Ordering::Relaxed) > 0,
        "the adaptive master slept"
    );
    shared.shutdown.store(true, Ordering::Release);
    shared.poke();
    master.join().unwrap();
}
