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

/// An endpoint on pipe `pipe` of `r`, over an in-process connection.
fn attach(r: &mut Registry, pipe: &str, policy: IdlePolicy) -> Endpoint {
    Endpoint::from_connection(r.connect_local(pipe).unwrap(), policy, None).unwrap()
}

/// A master thread over `shared`, waiting as `policy` says.
fn start_master(shared: &Arc<MasterShared>, policy: IdlePolicy) -> std::thread::JoinHandle<()> {
    let m = shared.clone();
    std::thread::spawn(move || master::run(m, policy, None))
}

/// Asks the master thread to end, and waits for it.
fn stop_master(shared: &MasterShared, master: std::thread::JoinHandle<()>) {
    shared.shutdown.store(true, Ordering::Release);
    shared.poke();
    master.join().unwrap();
}

fn setup() -> (tempfile::TempDir, Registry) {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    r.create_pipe("a", "10.3.0.1/24", None, None).unwrap();
    r.create_pipe("b", "10.3.0.2/24", None, None).unwrap();
    (d, r)
}

/// Pipes `a` and `b` of [`setup`] with a master thread (`adaptive`) between them, each attached
/// at `block`, and `b`'s MAC as the daemon answers `a`'s ARP for it.
struct DaemonPath {
    _d: tempfile::TempDir,
    _r: Registry,
    shared: Arc<MasterShared>,
    master: Option<std::thread::JoinHandle<()>>,
    a: Endpoint,
    b: Endpoint,
    mac_b: [u8; 6],
}

impl DaemonPath {
    fn new() -> Self {
        let (d, mut r) = setup();
        let shared = Arc::new(MasterShared::new(r.snapshot()));
        let master = Some(start_master(&shared, IdlePolicy::ADAPTIVE));
        let mut a = attach(&mut r, "a", IdlePolicy::Block);
        let b = attach(&mut r, "b", IdlePolicy::Block);
        let mac_b = a
            .resolve(B, Duration::from_secs(2))
            .expect("ARP answered by the daemon");
        DaemonPath {
            _d: d,
            _r: r,
            shared,
            master,
            a,
            b,
            mac_b,
        }
    }

    fn stop(mut self) {
        stop_master(&self.shared, self.master.take().unwrap());
    }
}

#[test]
fn fast_channel_carries_frames_both_ways_in_order() {
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
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
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    b.send(&frame(&b, A, a.mac(), 100, 7)).unwrap();
    b.flush();
    assert_eq!(a.recv(&mut buf).map(|x| x.0), Some(100));
    assert!(a.recv(&mut buf).is_none());
}

#[test]
fn frames_read_before_detaching_are_not_delivered_again() {
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut buf = vec![0u8; 2048];
    {
        let mut b = attach(&mut r, "b", IdlePolicy::Spin);
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
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
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
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    assert!(a.fc_peers().is_empty());
    let f = frame(&a, B, b.mac(), 64, 1);
    assert_eq!(a.send(&f), Ok(Via::Daemon));
    r.connect_fc("a", "b", None).unwrap();
    let mut buf = vec![0u8; 2048];
    assert!(b.recv(&mut buf).is_none());
    a.refresh();
    // the first frame still waits for the daemon (no master runs here): the channel waits
    // for it to be taken, at most a few milliseconds, so nothing overtakes it
    assert_eq!(a.send(&f), Ok(Via::Daemon));
    std::thread::sleep(Duration::from_millis(10));
    a.refresh();
    assert_eq!(a.send(&f), Ok(Via::FastChannel));
    a.flush();
    assert_eq!(b.recv(&mut buf).map(|x| x.1), Some(Via::FastChannel));
    r.remove_fc("a", "b").unwrap();
    a.refresh();
    assert!(a.fc_peers().is_empty());
    assert_eq!(a.send(&f), Ok(Via::Daemon));
}

/// A channel made while an endpoint attaches, after the daemon handed the pipe over and
/// before the endpoint first looked at the generation: its message follows the hand-over's end,
/// and its bump is already in the first look. The endpoint knows the channel all the same
/// (it did not, and a server that had just attached never read what its client sent on it).
#[test]
fn an_endpoint_knows_its_gateway_only_from_a_daemon_that_drives_a_link() {
    let (_d, mut r) = setup();
    assert_eq!(attach(&mut r, "a", IdlePolicy::Spin).gateway(), None);
    r.set_gateway(Some([2, 0, 0, 0, 0, 1]));
    let ep = attach(&mut r, "a", IdlePolicy::Spin);
    assert_eq!(ep.gateway(), Some(docknet_pipe::delivery::GATEWAY));
    // and its stack routes beyond the pipe's network through it
    let st = docknet_lib::Stack::new(ep, docknet_lib::StackConfig::default());
    assert_eq!(st.gateway(), Some(docknet_pipe::delivery::GATEWAY));
}

#[test]
fn a_channel_made_while_the_pipe_is_handed_over_is_known_at_once() {
    let (_d, mut r) = setup();
    let conn = r.connect_local("a").unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = Endpoint::from_connection(conn, IdlePolicy::Spin, None).unwrap();
    let b = attach(&mut r, "b", IdlePolicy::Spin);
    assert_eq!(a.fc_peers().len(), 1, "the channel is known");
    a.refresh();
    std::thread::sleep(Duration::from_millis(10));
    a.refresh();
    assert_eq!(a.send(&frame(&a, B, b.mac(), 64, 1)), Ok(Via::FastChannel));
}

/// Pipe `pipe`'s region as the daemon hands it out, mapped by the test through a connection of
/// its own (to change its words behind the endpoints' backs).
fn pipe_region(r: &mut Registry, pipe: &str) -> docknet_pipe::Region {
    use std::os::fd::AsFd;
    let conn = r.connect_local(pipe).unwrap();
    let mut buf = [0u8; docknet_pipe::delivery::MAX_MSG];
    let (_, fd) = docknet_pipe::fdpass::recv(conn.as_fd(), &mut buf)
        .unwrap()
        .expect("the hand-over");
    let file = std::fs::File::from(fd.expect("the pipe's region"));
    let len = file.metadata().unwrap().len() as usize;
    docknet_pipe::Region::map_sealed(file.as_fd(), len).unwrap()
}

/// A message of the daemon whose bump of the generation an endpoint never saw (the class of a
/// channel made while the pipe was handed over, or of one read off a connection a forked
/// process shares) is read after the endpoint's next sleep that ends by its timeout, and
/// counted: such a loss lasts one sleep, not for good.
#[test]
fn a_channel_whose_bump_was_missed_is_found_after_a_sleep_times_out_and_counted() {
    let (_d, mut r) = setup();
    let mut a = attach(&mut r, "a", IdlePolicy::Block);
    let b = attach(&mut r, "b", IdlePolicy::Block);
    let region = pipe_region(&mut r, "a");
    let generation = region.u32_at(docknet_pipe::layout::GENERATION_OFF).unwrap();
    let before = generation.load(Ordering::SeqCst);
    r.connect_fc("a", "b", None).unwrap();
    // the bump, undone: nothing tells the endpoint that anything changed
    generation.store(before, Ordering::SeqCst);
    a.refresh();
    assert!(a.fc_peers().is_empty());
    let t = Instant::now();
    while a.fc_peers().is_empty() && t.elapsed() < Duration::from_secs(2) {
        a.idle(Duration::from_millis(20));
    }
    assert_eq!(a.fc_peers().len(), 1, "the channel is found after a sleep");
    assert_eq!(a.stats().unannounced, 1);
    std::thread::sleep(Duration::from_millis(10));
    a.refresh();
    assert_eq!(a.send(&frame(&a, B, b.mac(), 64, 1)), Ok(Via::FastChannel));
    // an announced change is not counted, nor are later looks that find nothing
    r.remove_fc("a", "b").unwrap();
    a.refresh();
    for _ in 0..8 {
        a.idle(Duration::from_millis(20));
    }
    assert_eq!(a.stats().unannounced, 1);
}

#[test]
fn frames_on_a_removed_channel_are_still_read_and_later_ones_take_the_daemon() {
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    let mut buf = vec![0u8; 2048];
    for tag in 1..=3u8 {
        assert_eq!(
            a.send(&frame(&a, B, b.mac(), 64, tag)),
            Ok(Via::FastChannel)
        );
    }
    a.flush();
    r.remove_fc("a", "b").unwrap();
    // b learns of the removal first; a has not yet, and sends two more on the channel
    b.refresh();
    assert!(b.fc_peers().is_empty(), "b sends nothing more on it");
    for tag in 4..=5u8 {
        assert_eq!(
            a.send(&frame(&a, B, b.mac(), 64, tag)),
            Ok(Via::FastChannel)
        );
    }
    a.flush();
    // every frame written on the channel before its partner knew still arrives, in order
    for tag in 1..=5u8 {
        let (n, via) = b
            .recv(&mut buf)
            .expect("a frame written before the removal");
        assert_eq!((n, via, buf[40]), (64, Via::FastChannel, tag));
    }
    a.refresh();
    assert!(a.fc_peers().is_empty());
    assert_eq!(a.send(&frame(&a, B, b.mac(), 64, 6)), Ok(Via::Daemon));
    // b's reply goes through the daemon too, not on the channel it still reads
    assert_eq!(b.send(&frame(&b, A, a.mac(), 64, 7)), Ok(Via::Daemon));
}

#[test]
fn daemon_path_with_a_master_thread_and_a_sleeping_receiver() {
    let mut p = DaemonPath::new();
    let (a, b, mac_b, shared) = (&mut p.a, &mut p.b, p.mac_b, p.shared.clone());
    assert_eq!(mac_b, b.mac());
    let mut buf = vec![0u8; 2048];
    // let everyone fall asleep, then wake the chain with one frame
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..200u32 {
        let f = frame(a, B, mac_b, 64 + (i as usize % 1400), i as u8);
        a.send_blocking(&f, Instant::now() + Duration::from_secs(1))
            .unwrap();
        let (n, via) = recv_within(b, &mut buf, Duration::from_secs(2)).expect("forwarded");
        assert_eq!(via, Via::Daemon);
        assert_eq!(&buf[..n], &f[..]);
    }
    // a frame to nobody and a spoofed frame are dropped and counted, not delivered
    a.send(&frame(a, Ipv4Addr::new(10, 3, 0, 99), mac_b, 64, 0))
        .unwrap();
    let mut spoof = frame(a, B, mac_b, 64, 0);
    spoof[26..30].copy_from_slice(&[10, 3, 0, 50]);
    a.send(&spoof).unwrap();
    a.flush();
    assert!(recv_within(b, &mut buf, Duration::from_millis(100)).is_none());
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
    p.stop();
}

#[test]
fn pipes_that_talk_through_the_daemon_are_asked_for_and_move_to_an_automatic_channel() {
    let (_d, mut r) = setup();
    r.set_auto_channels(true);
    let shared = Arc::new(MasterShared::new(r.snapshot()));
    shared.auto_channels.store(true, Ordering::Relaxed);
    let master = start_master(&shared, IdlePolicy::ADAPTIVE);
    let mut a = attach(&mut r, "a", IdlePolicy::Block);
    let mut b = attach(&mut r, "b", IdlePolicy::Block);
    let (ia, ib) = (r.get("a").unwrap().id, r.get("b").unwrap().id);
    let mut buf = vec![0u8; 2048];
    let mut vias = Vec::new();
    for i in 0..(3 * master::TALK_FRAMES) {
        // the control plane's part: serve what the master asked for
        while let Some((from, to)) = shared.talkers.pop() {
            assert_eq!((from, to), (ia, ib), "a talks to b");
            assert!(matches!(
                r.auto_connect(from, to, &[]),
                docknet_daemon::registry::AutoOutcome::Made(_)
            ));
        }
        a.refresh();
        let f = frame(&a, B, b.mac(), 64 + i as usize, i as u8);
        let via = a
            .send_blocking(&f, Instant::now() + Duration::from_secs(1))
            .unwrap();
        a.flush();
        let (n, got) = recv_within(&mut b, &mut buf, Duration::from_secs(2)).expect("delivered");
        assert_eq!(&buf[..n], &f[..], "frame {i}");
        assert_eq!(got, via);
        vias.push(via);
    }
    let first_fc = vias.iter().position(|v| *v == Via::FastChannel);
    assert!(
        first_fc.is_some_and(|k| k >= master::TALK_FRAMES as usize
            && vias[k..].iter().all(|v| *v == Via::FastChannel)),
        "through the daemon first, then over the channel for good: {vias:?}"
    );
    assert!(shared.talkers.is_empty(), "asked once");
    stop_master(&shared, master);
}

#[test]
fn frames_keep_their_order_when_a_channel_comes_while_some_wait_for_the_daemon() {
    let (_d, mut r) = setup();
    let shared = Arc::new(MasterShared::new(r.snapshot()));
    let mut master = master::Master::new(shared.clone());
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    let mac_b = b.mac();
    let mut buf = vec![0u8; 2048];
    let mut got = Vec::new();
    let mut recv_all = |b: &mut Endpoint, got: &mut Vec<u8>| {
        while let Some((n, _)) = b.recv(&mut buf) {
            got.push(buf[n - 1]);
        }
    };
    let mut vias = Vec::new();
    let mut send = |a: &mut Endpoint, tag: u8| {
        let f = frame(a, B, mac_b, 64, tag);
        vias.push(a.send(&f).unwrap());
        a.flush();
    };
    // 0..20 wait in a's ring for the daemon; 20..40 wait in b's ring (delivered, not read)
    for t in 0..20 {
        send(&mut a, t);
    }
    r.connect_fc("a", "b", None).unwrap();
    a.refresh();
    b.refresh();
    for t in 20..40 {
        send(&mut a, t);
    }
    master.round();
    master.round();
    // the daemon took all of them: the channel opens, and what follows goes over it
    a.refresh();
    for t in 40..60 {
        send(&mut a, t);
    }
    recv_all(&mut b, &mut got);
    assert_eq!(got, (0..60).collect::<Vec<u8>>(), "in order");
    assert!(vias[..40].iter().all(|v| *v == Via::Daemon), "{vias:?}");
    assert!(
        vias[40..].iter().all(|v| *v == Via::FastChannel),
        "{vias:?}"
    );
}

#[test]
fn the_processes_of_one_container_take_ephemeral_ports_in_turn() {
    let (_d, mut r) = setup();
    // two processes of one container (two endpoints on pipe a), one after the other
    let first = attach(&mut r, "a", IdlePolicy::Spin);
    let second = attach(&mut r, "a", IdlePolicy::Spin);
    let mut ports: Vec<u16> = (0..10).map(|_| first.next_port(7)).collect();
    ports.extend((0..10).map(|_| second.next_port(12_345)));
    assert!(
        ports.iter().all(|p| (49152..=65000).contains(p)),
        "{ports:?}"
    );
    for w in ports.windows(2) {
        assert!(
            w[1] == w[0] + 1 || (w[0] == 65000 && w[1] == 49152),
            "one sequence for the container, whoever takes: {ports:?}"
        );
    }
    // another pipe starts a sequence of its own
    let other = attach(&mut r, "b", IdlePolicy::Spin);
    assert_eq!(other.next_port(3), 49152 + 3);
}

#[test]
fn a_sleeper_that_leaves_keeps_the_rings_armed_for_one_still_asleep() {
    // Two threads of one container sleep on the same ring words (say a call in accept and a
    // call in read). When the first to leave cleared the words, the daemon saw no sleeper and
    // sent no kick for the next frame: the other slept out its whole timeout.
    let (_d, mut r) = setup();
    let shared = Arc::new(MasterShared::new(r.snapshot()));
    let master = start_master(&shared, IdlePolicy::ADAPTIVE);
    let mut a = attach(&mut r, "a", IdlePolicy::Block);
    let mut b = attach(&mut r, "b", IdlePolicy::Block);
    let mac_b = a.resolve(B, Duration::from_secs(2)).expect("ARP");
    let staying = b.arm_sleep().expect("nothing pending for b");
    let leaving = b.arm_sleep().expect("nothing pending for b");
    let asleep = std::thread::spawn(move || {
        let t = Instant::now();
        staying.wait(&[], Duration::from_secs(5));
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(100));
    // the other sleeper wakes (say on its own timer) and leaves
    drop(leaving);
    b.disarm_sleep();
    let sent = Instant::now();
    a.send_blocking(
        &frame(&a, B, mac_b, 64, 1),
        Instant::now() + Duration::from_secs(1),
    )
    .unwrap();
    let slept = asleep.join().unwrap();
    b.disarm_sleep();
    assert!(
        sent.elapsed() < Duration::from_secs(2) && slept < Duration::from_secs(2),
        "the remaining sleeper got no kick: asleep {slept:?}"
    );
    let mut buf = vec![0u8; 2048];
    assert!(recv_within(&mut b, &mut buf, Duration::from_secs(1)).is_some());
    stop_master(&shared, master);
}

/// What a hostile partner holds: the channel region as the daemon handed it to pipe `me`, and
/// its producer ring towards the victim.
fn steal_channel(r: &mut Registry, me: &str) -> (docknet_pipe::Region, docknet_pipe::Producer) {
    use docknet_pipe::delivery::{Msg, Side};
    use docknet_pipe::layout::{plan, RingParams};
    use std::os::fd::AsFd;
    let conn = r.connect_local(me).unwrap();
    let mut buf = [0u8; docknet_pipe::delivery::MAX_MSG];
    loop {
        let (n, fd) = docknet_pipe::fdpass::recv(conn.as_fd(), &mut buf)
            .unwrap()
            .unwrap();
        if let Msg::Channel(c) = Msg::decode(&buf[..n]).unwrap() {
            let p = RingParams::for_mtu(c.mtu, Some(c.depth)).unwrap();
            let (rings, size) = plan([p, p]).unwrap();
            let region = docknet_pipe::Region::map_sealed(fd.unwrap().as_fd(), size).unwrap();
            let ring = if c.side == Side::A {
                rings[0]
            } else {
                rings[1]
            };
            let prod = docknet_pipe::Producer::adopt(&region, ring);
            return (region, prod);
        }
    }
}

#[test]
fn a_channel_partner_cannot_redirect_spoof_or_starve_its_partner() {
    let (_d, mut r) = setup();
    r.create_pipe("c", "10.3.0.3/24", None, None).unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    let (region, mut evil) = steal_channel(&mut r, "a");
    // redirect: rewrite the shared header's addresses so that "A" is pipe c's address
    for off in (0..4096).step_by(8) {
        region.store_u64(
            off,
            0x0a03_0003_0a03_0003,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    let to_c = frame(&b, Ipv4Addr::new(10, 3, 0, 3), [0xff; 6], 64, 1);
    assert_eq!(
        b.send(&to_c),
        Ok(Via::Daemon),
        "traffic for c still goes through the daemon"
    );
    // spoof: frames claiming to come from c, or from a's address with another MAC
    let mut buf = vec![0u8; 2048];
    let c_ep = attach(&mut r, "c", IdlePolicy::Spin);
    let forged_c = frame(&c_ep, B, b.mac(), 64, 2);
    let mut forged_mac = frame(&b, B, b.mac(), 64, 3);
    forged_mac[26..30].copy_from_slice(&A.octets());
    for f in [&forged_c, &forged_mac] {
        evil.push(&region, f, 0).unwrap();
    }
    evil.publish(&region);
    assert!(
        b.recv(&mut buf).is_none(),
        "forged frames are not delivered"
    );
    assert_eq!(b.stats().fc_spoofed, 2);
    // starve: a producer that keeps the ring full does not hold the victim's receive
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let flood = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            let _ = evil.push(&region, &forged_c, 0);
            evil.publish(&region);
        }
    });
    let t0 = Instant::now();
    while b.stats().fc_spoofed < 1000 {
        let t = Instant::now();
        assert!(b.recv(&mut buf).is_none(), "nothing forged is delivered");
        assert!(t.elapsed() < Duration::from_millis(200), "recv returned");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the flood never came"
        );
    }
    assert_eq!(b.drain(), 0, "drain is bounded and delivers nothing forged");
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    assert_eq!(b.stats().rx_fc, 0, "{:?}", b.stats());
}

/// More pipes than one futex wait holds: the idle ones go cold and watcher threads wait for
/// them, so a frame from any pipe, hot or cold, is forwarded at once, and an idle master sleeps
/// instead of polling every millisecond.
#[test]
fn three_hundred_pipes_on_one_master_wake_it_without_polling() {
    const N: usize = 300;
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    let ip = |i: usize| Ipv4Addr::new(10, 5, (i / 200) as u8, (i % 200) as u8 + 1);
    for i in 0..N {
        r.create_pipe(&format!("p{i}"), &format!("{}/16", ip(i)), None, Some(64))
            .unwrap();
    }
    let shared = Arc::new(MasterShared::new(r.snapshot()));
    let master = start_master(&shared, IdlePolicy::Block);
    let mut eps: Vec<Endpoint> = (0..N)
        .map(|i| attach(&mut r, &format!("p{i}"), IdlePolicy::Block))
        .collect();
    let wait_cold = |want: u64| {
        let t = Instant::now();
        while shared.cold.load(Ordering::Relaxed) < want {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "only {} pipes went cold",
                shared.cold.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_cold((N - master::ROOM) as u64);
    // idle: the master sleeps until its longest timeout instead of polling cold pipes
    let s0 = shared.sleeps.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let idle_sleeps = shared.sleeps.load(Ordering::Relaxed) - s0;
    assert!(idle_sleeps < 20, "{idle_sleeps} sleeps in 500 ms of idle");
    assert!(shared.watchers.load(Ordering::Relaxed) >= 1);
    let mut buf = vec![0u8; 2048];
    for round in 0..3u8 {
        // every pipe is cold now; each sends to its neighbour, which must get it
        wait_cold(N as u64 - 10);
        for i in (0..N).step_by(7) {
            let j = (i + 1) % N;
            let mac = eps[i]
                .resolve(ip(j), Duration::from_secs(2))
                .unwrap_or_else(|| panic!("ARP from cold pipe {i}"));
            let f = frame(&eps[i], ip(j), mac, 100 + i, round);
            eps[i]
                .send_blocking(&f, Instant::now() + Duration::from_secs(1))
                .unwrap();
            let (n, via) = recv_within(&mut eps[j], &mut buf, Duration::from_secs(2))
                .unwrap_or_else(|| panic!("frame from pipe {i} to {j} in round {round}"));
            assert_eq!(via, Via::Daemon);
            assert_eq!(&buf[..n], &f[..]);
        }
    }
    stop_master(&shared, master);
}

/// 128 pipes over two masters, every frame crossing from one master to the other (pipe `i`
/// sends to `i + 1`, owned by the other master): each arrives once, intact.
#[test]
fn one_hundred_twenty_eight_pipes_over_two_masters_cross_intact() {
    const N: usize = 128;
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    let ip = |i: usize| Ipv4Addr::new(10, 6, 0, i as u8 + 1);
    for i in 0..N {
        r.create_pipe(&format!("p{i}"), &format!("{}/24", ip(i)), None, Some(64))
            .unwrap();
    }
    let shared = Arc::new(MasterShared::with_masters(r.snapshot(), 2));
    let masters: Vec<_> = (0..2)
        .map(|k| {
            let m = shared.clone();
            std::thread::spawn(move || master::run_shard(m, k, IdlePolicy::ADAPTIVE, None))
        })
        .collect();
    let mut eps: Vec<Endpoint> = (0..N)
        .map(|i| attach(&mut r, &format!("p{i}"), IdlePolicy::Block))
        .collect();
    let macs: Vec<[u8; 6]> = (0..N)
        .map(|i| {
            let j = (i + 1) % N;
            eps[i]
                .resolve(ip(j), Duration::from_secs(2))
                .expect("ARP answered")
        })
        .collect();
    let mut buf = vec![0u8; 2048];
    for round in 0..20u8 {
        let sent: Vec<Vec<u8>> = (0..N)
            .map(|i| {
                let f = frame(
                    &eps[i],
                    ip((i + 1) % N),
                    macs[i],
                    64 + (i * 7 + round as usize) % 1400,
                    round,
                );
                eps[i]
                    .send_blocking(&f, Instant::now() + Duration::from_secs(1))
                    .unwrap();
                f
            })
            .collect();
        for (i, f) in sent.iter().enumerate() {
            let j = (i + 1) % N;
            let (n, via) = recv_within(&mut eps[j], &mut buf, Duration::from_secs(2))
                .unwrap_or_else(|| panic!("frame {i} -> {j} in round {round}"));
            assert_eq!(via, Via::Daemon);
            assert_eq!(&buf[..n], &f[..], "frame {i} -> {j} in round {round}");
        }
    }
    assert!(shared.cross.load(Ordering::Relaxed) >= (N * 20) as u64);
    assert_eq!(shared.cross_drops.load(Ordering::Relaxed), 0);
    shared.shutdown.store(true, Ordering::Release);
    shared.poke();
    for m in masters {
        m.join().unwrap();
    }
}

/// A frame given to the device while its ring is full waits in the device's backlog instead of
/// being dropped, goes out in order once the consumer makes room, and is dropped only beyond
/// the backlog's bounds (too many waiting, or waiting too long).
#[test]
fn a_full_ring_makes_frames_wait_in_order_not_vanish() {
    use docknet_lib::device::{PipeDevice, BACKLOG_FRAMES, BACKLOG_WAIT};
    use smoltcp::phy::{Device, TxToken};
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", Some(1500)).unwrap();
    let a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    let (b_mac, now) = (b.mac(), smoltcp::time::Instant::from_millis(0));
    let mut dev = PipeDevice::new(a, true);
    // frame `k` carries k in its payload (past the IPv4 header)
    let send = |dev: &mut PipeDevice, k: u32| {
        let f = frame(&dev.ep, B, b_mac, 200, 0);
        dev.transmit(now).unwrap().consume(f.len(), |buf| {
            buf.copy_from_slice(&f);
            buf[40..44].copy_from_slice(&k.to_be_bytes());
        });
    };
    // the channel's ring at MTU 1500 holds 1024 frames; 20 more wait
    let (ring, extra) = (1024u32, 20u32);
    for k in 0..ring + extra {
        send(&mut dev, k);
    }
    dev.ep.flush();
    assert_eq!(
        (dev.stats.tx, dev.stats.tx_waited),
        (ring as u64, extra as u64)
    );
    assert_eq!(dev.stats.tx_dropped, 0);
    assert!(dev.backlogged());
    // the partner reads some; the backlog goes out behind what was on the ring, in order
    let mut buf = vec![0u8; 2048];
    let tag = |buf: &[u8]| u32::from_be_bytes(buf[40..44].try_into().unwrap());
    for k in 0..100 {
        let (n, _) = b.recv(&mut buf).expect("a frame");
        assert_eq!((n, tag(&buf)), (200, k));
    }
    b.flush();
    dev.flush_backlog();
    dev.ep.flush();
    assert!(!dev.backlogged());
    for k in 100..ring + extra {
        let (_, _) = b.recv(&mut buf).expect("a frame");
        assert_eq!(tag(&buf), k, "in order");
    }
    b.flush();
    // bounded: a ring nobody drains takes BACKLOG_FRAMES more, then drops; and what waited
    // longer than BACKLOG_WAIT is dropped at the next flush
    for k in 0..ring + BACKLOG_FRAMES as u32 + 5 {
        send(&mut dev, k);
    }
    assert_eq!(dev.stats.tx_dropped, 5);
    std::thread::sleep(BACKLOG_WAIT + Duration::from_millis(5));
    dev.flush_backlog();
    assert_eq!(dev.stats.tx_dropped, 5 + BACKLOG_FRAMES as u64);
    assert!(!dev.backlogged());
}

#[test]
fn a_running_container_takes_every_change_of_the_services() {
    use docknet_daemon::proto::{ServiceAffinity, ServiceInfo, ServiceProto};
    let (_d, mut r) = setup();
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    assert!(a.services().is_empty());
    let svc = |backends: &[&str]| ServiceInfo {
        name: "web".into(),
        address: "10.96.0.10:80".into(),
        proto: ServiceProto::Tcp,
        backends: backends.iter().map(|b| b.to_string()).collect(),
        affinity: ServiceAffinity::None,
    };
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let backends = |a: &Endpoint| {
        a.services()
            .get(vip, 80, docknet_pipe::services::Proto::Tcp)
            .map(|s| s.backends.len())
    };
    for (k, set) in [&["10.3.0.2:80", "10.3.0.3:80"][..], &["10.3.0.2:80"], &[]]
        .into_iter()
        .enumerate()
    {
        r.set_service(&svc(set)).unwrap();
        a.refresh();
        assert_eq!(backends(&a), Some(set.len()), "change {k}");
    }
    r.remove_service("web").unwrap();
    a.refresh();
    assert_eq!(backends(&a), None);
    assert_eq!(a.stats().bad_services, 0);
}

#[test]
fn a_frame_built_in_the_pipes_ring_arrives_as_built_and_an_unbuilt_room_sends_nothing() {
    let mut p = DaemonPath::new();
    let (a, b, mac_b) = (&mut p.a, &mut p.b, p.mac_b);
    let mut buf = vec![0u8; 4096];
    assert!(matches!(
        a.reserve_on_pipe(0),
        Err(docknet_lib::SendError::BadLength(0))
    ));
    assert!(matches!(
        a.reserve_on_pipe(1 << 20),
        Err(docknet_lib::SendError::BadLength(_))
    ));
    // a room reserved and left unbuilt: the next reservation takes its place, nothing leaves
    let _abandoned = a.reserve_on_pipe(200).unwrap();
    let before = a.stats().tx_daemon;
    for i in 0..50u32 {
        let want = frame(a, B, mac_b, 64 + (i as usize * 37) % 1400, i as u8);
        let room = a.reserve_on_pipe(want.len()).unwrap();
        let built = a.build_on_pipe(room, |f| {
            assert_eq!(f.len(), want.len());
            f.copy_from_slice(&want);
            i
        });
        assert_eq!(built, i);
        a.flush();
        let (n, via) = recv_within(b, &mut buf, Duration::from_secs(2)).expect("forwarded");
        assert_eq!(via, Via::Daemon);
        assert_eq!(&buf[..n], &want[..], "frame {i}");
    }
    assert!(recv_within(b, &mut buf, Duration::from_millis(100)).is_none());
    assert_eq!(a.stats().tx_daemon - before, 50);
    // rooms are handed out only while the ring has some: unpublished frames fill it
    let f = frame(a, B, mac_b, 1500, 7);
    let mut built = 0;
    let full = loop {
        match a.reserve_on_pipe(f.len()) {
            Ok(room) => a.build_on_pipe(room, |s| s.copy_from_slice(&f)),
            Err(e) => break e,
        }
        built += 1;
        assert!(built < 100_000, "the ring never filled");
    };
    assert!(matches!(full, docknet_lib::SendError::Full), "{full:?}");
    p.stop();
}

/// The next frame of `b` by [`Endpoint::recv_lending`] (lending TCP segments over 512 bytes,
/// splitting a channel's over 512), within 2 s; it came by `via`.
fn take_lending(b: &mut Endpoint, buf: &mut [u8], via: Via) -> docknet_lib::raw::Got {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some((got, came)) = b.recv_lending(buf, 512, 512) {
            assert_eq!(came, via);
            return got;
        }
        assert!(Instant::now() < end, "nothing came");
        b.idle(Duration::from_millis(5));
    }
}

/// A frame of `len` bytes from `src` to `dst` carrying TCP with `flags`, its bytes after the
/// headers `tag`.
fn tcp_frame(
    src: &Endpoint,
    dst: Ipv4Addr,
    dst_mac: [u8; 6],
    len: usize,
    flags: u8,
    tag: u8,
) -> Vec<u8> {
    let mut f = frame(src, dst, dst_mac, len, tag);
    f[23] = 6; // TCP
    write_ipv4_headers(&mut f, src.mac(), dst_mac, src.ip(), dst, 6, len);
    f[34..54].fill(0);
    f[46] = 5 << 4; // 20 bytes of header
    f[47] = flags;
    f
}

#[test]
fn the_daemons_long_tcp_segments_are_read_in_place_and_their_slots_come_back() {
    use docknet_lib::raw::Got;
    let mut p = DaemonPath::new();
    let (a, b, mac_b) = (&mut p.a, &mut p.b, p.mac_b);
    let mut buf = vec![0u8; 4096];
    let take = |b: &mut Endpoint, buf: &mut [u8]| take_lending(b, buf, Via::Daemon);
    // a plain segment is lent (its headers copied); a SYN, a short segment and what is not
    // TCP are copied
    let ack = 0x10;
    let cases = [
        (tcp_frame(a, B, mac_b, 2000, ack, 1), true),
        (tcp_frame(a, B, mac_b, 2000, 0x02, 2), false),
        (tcp_frame(a, B, mac_b, 300, ack, 3), false),
        (frame(a, B, mac_b, 2000, 4), false),
    ];
    for (f, lent) in &cases {
        a.send_blocking(f, Instant::now() + Duration::from_secs(1))
            .unwrap();
        match take(b, &mut buf) {
            Got::Lent(l, head) => {
                assert!(lent, "lent: {:?}", &f[..60]);
                assert_eq!(&buf[..head], &f[..head]);
                assert!(head < f.len());
                assert_eq!(l.read(|got| got.to_vec()), *f);
            }
            Got::Copied(n) => {
                assert!(!lent, "copied: {:?}", &f[..60]);
                assert_eq!(&buf[..n], &f[..]);
            }
            Got::Split(..) => panic!("the daemon's frame split"),
        }
    }
    // many more frames than the ring holds, each lent and read: each slot is handed back to
    // the daemon (at the next take, or by a flush when the reader waits)
    for i in 0..3000u32 {
        let f = tcp_frame(a, B, mac_b, 1000 + (i as usize % 7) * 300, ack, i as u8);
        a.send_blocking(&f, Instant::now() + Duration::from_secs(1))
            .unwrap();
        let Got::Lent(l, _) = take(b, &mut buf) else {
            panic!("frame {i} copied");
        };
        assert!(l.read(|got| got == &f[..]), "frame {i}");
        if i % 3 == 0 {
            b.flush();
        }
    }
    p.stop();
}

#[test]
fn a_fast_channels_long_tcp_segments_are_split_copied_out_never_read_in_place() {
    use docknet_lib::raw::Got;
    let (_d, mut r) = setup();
    r.connect_fc("a", "b", None).unwrap();
    let mut a = attach(&mut r, "a", IdlePolicy::Spin);
    let mut b = attach(&mut r, "b", IdlePolicy::Spin);
    let mac_b = b.mac();
    let mut buf = vec![0u8; 8192];
    let take = |b: &mut Endpoint, buf: &mut [u8]| take_lending(b, buf, Via::FastChannel);
    let send = |a: &mut Endpoint, f: &[u8]| {
        a.send_blocking(f, Instant::now() + Duration::from_secs(1))
            .unwrap()
    };
    // a plain segment is split (its headers copied, the rest only through `copy_at`); a SYN, a
    // short segment, what is not TCP and a segment longer than the buffer are copied
    let ack = 0x10;
    let cases = [
        (tcp_frame(&a, B, mac_b, 2000, ack, 1), true),
        (tcp_frame(&a, B, mac_b, 2000, 0x02, 2), false),
        (tcp_frame(&a, B, mac_b, 300, ack, 3), false),
        (frame(&a, B, mac_b, 2000, 4), false),
        (tcp_frame(&a, B, mac_b, 8500, ack, 5), false),
    ];
    for (f, split) in &cases {
        assert_eq!(send(&mut a, f), Via::FastChannel);
        match take(&mut b, &mut buf) {
            Got::Split(l, head) => {
                assert!(split, "split: {:?}", &f[..60]);
                assert_eq!(head, 54, "the headers alone count as read");
                assert_eq!(&buf[..head], &f[..head]);
                assert!(head < f.len() && l.len() == f.len());
                assert!(!l.in_place());
                assert_eq!(
                    l.read(|got| got.len()),
                    0,
                    "a partner's frame is never lent"
                );
                let mut rest = vec![0u8; f.len() - head];
                assert!(l.copy_at(head, &mut rest));
                assert_eq!(rest, f[head..]);
                assert!(!l.copy_at(head + 1, &mut rest), "beyond the frame");
            }
            Got::Copied(n) => {
                assert!(!split, "copied: {:?}", &f[..60]);
                assert_eq!(&buf[..n], &f[..n.min(f.len())]);
                assert_eq!(n, f.len().min(buf.len()));
            }
            Got::Lent(..) => panic!("a partner's frame lent in place"),
        }
    }
    // a split segment whose source is not the partner is dropped, counted, and its slot
    // handed back like every other: many more frames than the ring holds
    let spoofed0 = b.stats().fc_spoofed;
    for i in 0..3000u32 {
        let f = tcp_frame(&a, B, mac_b, 1000 + (i as usize % 7) * 300, ack, i as u8);
        if i % 5 == 0 {
            let mut s = f.clone();
            s[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
            send(&mut a, &s);
        }
        send(&mut a, &f);
        let Got::Split(l, head) = take(&mut b, &mut buf) else {
            panic!("frame {i} copied");
        };
        let mut got = buf[..head].to_vec();
        got.resize(l.len(), 0);
        assert!(l.copy_at(head, &mut got[head..]));
        assert!(got == f, "frame {i}");
        if i % 3 == 0 {
            b.flush();
        }
    }
    assert_eq!(b.stats().fc_spoofed - spoofed0, 600);
}
