//! DockNet's fuzz targets, as functions of bytes: each feeds hostile input to one defence and
//! asserts what must hold whatever the input. A panic or an abort is a finding.
//!
//! | target | what the input is | what must hold |
//! |---|---|---|
//! | `header` | a region's header, any size it claims | `RegionInfo::parse` never panics; an accepted layout lies inside the mapping |
//! | `ring` | writes to every shared word of a ring pair, interleaved with the honest side's operations | frames handed out lie inside their area; a producer never believes in more room than there is |
//! | `switch` | a flow table and a frame's first bytes | `decide` never panics and names only existing ports |
//! | `master` | writes to one pipe's whole region between master rounds | the master never panics, and the other pipes change only in their rx rings |
//! | `control` | request lines against a registry | a refused request changes nothing; a reopened registry has the same state |
//! | `channel` | a channel partner's writes and frames | DockLib's receive never panics, never hangs, and delivers only frames from the partner |
//! | `delivery` | a delivery message, or a services table | decoding never panics; what decodes re-encodes to itself |
//! | `wire` | frames from the wire (and pipes' frames for it), ARP and VXLAN included | checking, readying, wrapping, unwrapping and parsing never panic; what is accepted keeps its length bounds; what is wrapped unwraps whole; the neighbour table stays bounded |
//! | `segment` | a received frame (DockLib clamps a SYN's MSS, and reads a plain TCP segment of the daemon's in place on its headers' word) and a frame to cut to a path's size | neither panics; a clamp changes only a SYN's MSS options and checksum and never raises the MSS; a frame whose headers say plain TCP parses as a TCP segment without SYN; every piece fits, and the pieces' payloads are the frame's |
//! | `dns` | a name server's answer (the server may be a container), and `resolv.conf` text | reading either never panics; an answer taken names addresses and a name; what is read from `resolv.conf` stays within its bounds |

use docknet_daemon::control::{handle, Ctx};
use docknet_daemon::holder::{Keeper, MemoryKeeper};
use docknet_daemon::master::{Master, MasterShared};
use docknet_daemon::proto::{parse_request, Request, Status};
use docknet_daemon::registry::Registry;
use docknet_daemon::switch::{decide, Decision, FlowTable, Port, ARP_FRAME_LEN, HEADER_PEEK};
use docknet_lib::{Endpoint, Via};
use docknet_pipe::delivery::{Msg, Side, MAX_MSG};
use docknet_pipe::layout::{plan, Kind, RegionInfo, RingParams, DESC_SIZE};
use docknet_pipe::{fdpass, Consumer, IdlePolicy, Producer, Region};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A fuzz target: a function of the input bytes.
pub type Target = fn(&[u8]);

/// Every target by name (the corpus has a directory per name).
pub const TARGETS: &[(&str, Target)] = &[
    ("header", header),
    ("ring", ring),
    ("switch", switch),
    ("master", master),
    ("control", control),
    ("channel", channel),
    ("delivery", delivery),
    ("wire", wire),
    ("segment", segment),
    ("dns", dns),
];

/// The input as a stream of numbers (zeros once it runs out).
struct In<'a>(&'a [u8]);

impl In<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// A scratch directory on tmpfs where there is one (state files are written per input).
fn scratch() -> tempfile::TempDir {
    if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").expect("a scratch directory")
    } else {
        tempfile::tempdir().expect("a scratch directory")
    }
}

/// Region header: any bytes, any claimed size.
pub fn header(data: &[u8]) {
    let mut i = In(data);
    let len = (4096 + usize::from(i.u16()) * 64).min(256 << 10);
    let r = Region::anonymous(len).expect("anonymous memory");
    r.write(0, &data[..data.len().min(len)]);
    for kind in [Kind::Pipe, Kind::FastChannel] {
        let Ok(info) = RegionInfo::parse(&r, kind) else {
            continue;
        };
        assert!(info.size <= r.len());
        for ring in info.rings {
            assert!(ring.area + ring.area_len <= info.size);
            assert!(ring.frame_size as usize <= ring.area_len);
            assert!(ring.descs + ring.depth as usize * DESC_SIZE <= info.size);
            for idx in [0, 1, ring.depth - 1, ring.depth, u32::MAX, i.u32()] {
                assert!(ring.desc_off(idx) + DESC_SIZE <= info.size);
            }
        }
    }
}

/// Ring pair: the honest side consumes ring 0 and produces on ring 1, the hostile side writes
/// any word of the region at any time.
pub fn ring(data: &[u8]) {
    let mut i = In(data);
    let depth = 2u32 << (i.u8() % 6);
    // frames up to 256 bytes in an area that may run out before the descriptors do
    let p = RingParams {
        depth,
        frame_size: 256,
        area_len: (depth as usize * 128).max(256),
    };
    let (rings, size) = plan([p, p]).expect("a valid plan");
    let r = Region::anonymous(size).expect("anonymous memory");
    let (mut c, mut pr) = (Consumer::new(rings[0]), Producer::new(rings[1]));
    let (area, end) = (rings[0].area, rings[0].area + rings[0].area_len);
    let (parea, pend) = (rings[1].area, rings[1].area + rings[1].area_len);
    while !i.done() {
        match i.u8() % 8 {
            0 => {
                let off = (usize::from(i.u16()) * 4) % size;
                r.store_u32(off, i.u32(), Ordering::Release);
            }
            1 => {
                if let Some(Ok(f)) = c.pop(&r) {
                    assert!(f.off >= area && f.off + f.len <= end && f.len >= 1);
                }
            }
            2 => c.release(&r),
            3 => {
                let n = 1 + usize::from(i.u16()) % 256;
                if let Some(s) = pr.reserve_len(&r, n) {
                    assert!(s.off >= parea && s.off + n <= pend && s.cap >= n);
                    r.fill(s.off, n, 0x5a);
                    assert!(pr.commit(&r, n, 0).is_ok());
                }
            }
            4 => {
                pr.publish(&r);
            }
            5 => {
                // the producer restarts over whatever the hostile side wrote
                pr = Producer::adopt(&r, rings[1]);
            }
            6 => {
                let n = 1 + usize::from(i.u8());
                let _ = pr.push(&r, &vec![0xa5; n], 0);
            }
            _ => {
                c.arm(&r);
                c.disarm(&r);
            }
        }
        assert!(pr.space(&r) <= depth);
    }
}

/// Forwarding decision: a table and a frame's first bytes.
pub fn switch(data: &[u8]) {
    let mut i = In(data);
    let ports: Vec<Port> = (0..i.u8() % 5)
        .map(|_| Port {
            ip: Ipv4Addr::from(i.u32()),
            prefix: i.u8(),
            mac: [i.u8(), i.u8(), i.u8(), i.u8(), i.u8(), i.u8()],
            ip6: (i.u8() % 2 == 1)
                .then(|| std::net::Ipv6Addr::from(u128::from(i.u32()) << 96 | u128::from(i.u32()))),
        })
        .collect();
    let n = ports.len();
    let src = usize::from(i.u8());
    let len = usize::from(i.u8()) * 64;
    let hdr = i.bytes(HEADER_PEEK).to_vec();
    match decide(&hdr, len, src, &FlowTable::new(ports)) {
        Decision::Unicast(d) => assert!(d < n && src < n),
        Decision::Reply(f) => assert_eq!(f.len(), ARP_FRAME_LEN),
        Decision::NdpReply(f) => assert_eq!(f.len(), docknet_daemon::switch::NA_FRAME_LEN),
        Decision::Wire(_) | Decision::Flood | Decision::Drop(_) => {}
    }
}

/// The host's edge: frames arriving from the wire for a pipe, frames a pipe sends to it, ARP
/// messages, and the neighbour table they feed, all from the input.
pub fn wire(data: &[u8]) {
    use docknet_daemon::nic::neigh::{Neighbours, MAX_ENTRIES, MAX_HELD};
    use docknet_daemon::nic::offload;
    use docknet_daemon::nic::vxlan;
    use docknet_daemon::nic::wire::{
        arp, arp_frame, fill_checksums, from_wire, from_wire_with, to_wire, Inbound, ETH,
    };
    let mut i = In(data);
    let mut n = Neighbours::new();
    let t0 = std::time::Instant::now();
    while !i.done() {
        let op = i.u8();
        let len = usize::from(i.u16() % 2048);
        let mtu = 68 + u32::from(i.u16());
        let mut f = i.bytes(len).to_vec();
        let now = t0 + std::time::Duration::from_millis(u64::from(i.u16()));
        match op % 8 {
            0 => {
                if let Ok((_, l)) = from_wire(&mut f, [2; 6], [4; 6], mtu) {
                    assert!(l <= f.len() && l >= ETH + 20 && (l - ETH) as u32 <= mtu);
                }
            }
            6 => {
                // through a port that offloads: large TCP may enter, within the frame
                let how = Inbound {
                    pipe_mtu: mtu,
                    checked: op & 0x80 != 0,
                    large_tcp_from: Some(68 + u32::from(i.u16())),
                };
                if let Ok((_, l)) = from_wire_with(&mut f, [2; 6], [4; 6], how) {
                    assert!(l <= f.len() && l >= ETH + 20);
                }
            }
            7 => {
                // leaving through a port that offloads: what the header asks stays inside the
                // frame, and a cut leaves each segment within the MTU
                if let Ok((l, o)) = offload::to_wire(&mut f, [2; 6], [4; 6], mtu) {
                    assert!(l <= f.len() && l >= ETH + 20);
                    if let Some((start, at)) = o.csum {
                        assert!(usize::from(start) + usize::from(at) + 2 <= l);
                    }
                    if o.gso_size > 0 {
                        assert!(usize::from(o.hdr_len) <= l);
                        let seg = usize::from(o.hdr_len) - ETH + usize::from(o.gso_size);
                        assert!(seg as u32 <= mtu);
                    } else {
                        assert!((l - ETH) as u32 <= mtu);
                    }
                }
            }
            4 => {
                // a datagram to a tunnel end: what unwraps lies inside the frame
                let here = Ipv4Addr::new(10, 0, 0, 1);
                if let vxlan::Arrived::Inner { start, len, .. } = vxlan::decap(&f, here, &[0, 1]) {
                    assert!(start + len <= f.len() && len >= ETH);
                    let _ = from_wire(&mut f[start..start + len], [2; 6], [4; 6], mtu);
                }
            }
            5 => {
                // a pipe's frame wrapped for a tunnel unwraps whole at the far end
                let t = vxlan::Tunnel {
                    local: Ipv4Addr::new(10, 0, 0, 2),
                    remote: Ipv4Addr::new(10, 0, 0, 1),
                    vni: 1,
                };
                let mut buf = vec![0u8; vxlan::OVERHEAD + f.len()];
                buf[vxlan::OVERHEAD..].copy_from_slice(&f);
                if let Ok(n) = vxlan::encap(&mut buf, f.len(), &t, [2; 6], [4; 6], mtu) {
                    assert!(n <= buf.len() && (n - ETH) as u32 <= mtu);
                    match vxlan::decap(&buf[..n], t.remote, &[1]) {
                        vxlan::Arrived::Inner { start, len, .. } => {
                            assert_eq!((start, start + len), (vxlan::OVERHEAD, n))
                        }
                        other => panic!("wrapped but not unwrapped: {other:?}"),
                    }
                }
            }
            1 => {
                if let Ok(l) = to_wire(&mut f, [2; 6], [4; 6], mtu) {
                    assert!(l <= f.len() && (l - ETH) as u32 <= mtu);
                }
                let _ = fill_checksums(&mut f, mtu);
            }
            2 => {
                if let Some(a) = arp(&f) {
                    // what parses re-emits to the same message (a request's target MAC is zero)
                    let mut want = a;
                    if a.request {
                        want.tha = [0; 6];
                    }
                    assert_eq!(arp(&arp_frame(&a)), Some(want));
                    let _ = n.learn(a.spa, a.sha, now);
                }
            }
            _ => {
                let ip = Ipv4Addr::from(u32::from(i.u8()) << 24 | u32::from(i.u16()));
                let _ = n.route(ip, Ipv4Addr::new(10, 0, 0, 1), now, || f.clone());
                let (_, dropped) = n.tick(now);
                assert!(dropped <= MAX_HELD * MAX_ENTRIES);
            }
        }
        assert!(n.len() <= MAX_ENTRIES);
    }
}

/// Three small pipes on a registry; the master runs rounds while the input writes anywhere in
/// pipe 0's region. Pipes 1 and 2 may change only in their rx rings.
pub fn master(data: &[u8]) {
    let d = scratch();
    let (mut r, _) = Registry::open(d.path(), None).expect("a registry");
    for k in 0..3u8 {
        r.create_pipe(
            &format!("p{k}"),
            &format!("10.0.0.{}/24", k + 1),
            Some(576),
            Some(8),
        )
        .expect("a pipe");
    }
    let snap = r.snapshot();
    let pipes = snap.pipes.clone();
    let shared = Arc::new(MasterShared::new(snap));
    // the master also looks for pipes that talk (automatic fast channels)
    shared.auto_channels.store(true, Ordering::Relaxed);
    r.set_auto_channels(true);
    let mut m = Master::new(shared.clone());
    let copy = |reg: &Region| {
        let mut b = vec![0u8; reg.len()];
        reg.read(0, &mut b);
        b
    };
    let before: Vec<Vec<u8>> = pipes[1..].iter().map(|p| copy(&p.region)).collect();
    let victim = &pipes[0].region;
    let mut i = In(data);
    let mut writes = 0;
    while !i.done() {
        let off = (usize::from(i.u16()) * 4) % victim.len();
        victim.store_u32(off, i.u32(), Ordering::Release);
        writes += 1;
        if writes % 8 == 0 {
            m.round();
        }
    }
    for _ in 0..3 {
        m.round();
    }
    // asks name pipe 0 (the only one that sends) and a pipe that exists; serving them builds
    // nothing (no pipe has a reader)
    while let Some((from, to)) = shared.talkers.pop() {
        assert_eq!(from, pipes[0].id);
        assert!(pipes.iter().any(|p| p.id == to), "{to}");
        let out = r.auto_connect(from, to, &[]);
        assert!(
            matches!(out, docknet_daemon::registry::AutoOutcome::Skipped(_)),
            "{out:?}"
        );
    }
    for (p, b) in pipes[1..].iter().zip(before) {
        let after = copy(&p.region);
        let rx = p.info.rings[1];
        // the rx ring's control, descriptors and area may change; every other byte is compared
        // as slices (memcmp: the byte loop, instrumented, was most of an execution's time)
        let mut mine = [
            (rx.ctrl, rx.descs + rx.depth as usize * DESC_SIZE),
            (rx.area, rx.area + rx.area_len),
        ];
        mine.sort_unstable();
        let mut from = 0;
        for (start, end) in mine.into_iter().chain([(b.len(), b.len())]) {
            let to = start.clamp(from, b.len());
            if b[from..to] != after[from..to] {
                let o = from + (from..to).position(|o| b[o] != after[o]).unwrap_or(0);
                panic!("pipe {} changed at {o} outside its rx ring", p.name);
            }
            from = end.clamp(from, b.len());
        }
    }
}

/// A control context over `reg`, as the daemon builds one.
fn ctx_of(reg: Registry) -> Ctx {
    Ctx {
        master: Arc::new(MasterShared::new(reg.snapshot())),
        registry: Mutex::new(reg),
        info: Status {
            protocol: 1,
            masters: 1,
            fast_channels: "auto".into(),
            ..Default::default()
        },
        attach: std::sync::OnceLock::new(),
        ops: Default::default(),
        captures: Mutex::new(Vec::new()),
        host_link: Mutex::new(None),
        link_guard: Mutex::new(None),
    }
}

/// Request lines against a registry (kept by an in-process keeper, with a link so routes are
/// taken): a refused request changes nothing, and a registry reopened from the same directory
/// and keeper has the same state (pipes and routes).
pub fn control(data: &[u8]) {
    let d = scratch();
    let keeper = MemoryKeeper::default();
    let (mut reg, _) =
        Registry::open(d.path(), Some(Box::new(keeper.clone()))).expect("a registry");
    // as with a link to the wire, so that routes are taken
    reg.set_gateway(Some([2, 0, 0, 0, 0, 1]));
    let ctx = ctx_of(reg);
    let state = || std::fs::read(d.path().join("state.json")).unwrap_or_default();
    let listing = |ctx: &Ctx| {
        [Request::PipeLs {}, Request::RouteLs {}]
            .map(|r| handle(ctx, r).map(|v| v.to_string()).unwrap_or_default())
            .join("\n")
    };
    for line in data.split(|b| *b == b'\n').take(32) {
        let Ok(mut req) = parse_request(&String::from_utf8_lossy(line)) else {
            continue;
        };
        if let Request::PipeAttach { netns, socket, .. } = &mut req {
            // only this process's own namespace, under a name of its own
            *netns = "/proc/self/ns/net".into();
            *socket = Some(format!("docknet-fuzz/{}", std::process::id()));
        }
        let (st, ls) = (state(), listing(&ctx));
        if handle(&ctx, req).is_err() {
            assert_eq!(st, state(), "a refused request changed state.json");
            assert_eq!(ls, listing(&ctx), "a refused request changed the pipes");
        }
    }
    let (st, ls) = (state(), listing(&ctx));
    drop(ctx);
    let (reg, warnings) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).expect("reopen");
    assert!(warnings.is_empty(), "reopening: {warnings:?}");
    assert_eq!(st, state(), "reopening changed state.json");
    let ctx = ctx_of(reg);
    assert_eq!(ls, listing(&ctx), "reopening changed the pipes");
    if let Ok(mut r) = ctx.registry.lock() {
        r.remove_all();
    }
    assert!(
        keeper.list().map(|k| k.is_empty()).unwrap_or(false),
        "everything dropped"
    );
}

/// A fast channel whose partner is the input: its writes to the shared region and its frames.
pub fn channel(data: &[u8]) {
    let d = scratch();
    let (mut r, _) = Registry::open(d.path(), None).expect("a registry");
    r.create_pipe("a", "10.3.0.1/24", Some(576), Some(8))
        .expect("pipe a");
    r.create_pipe("b", "10.3.0.2/24", Some(576), Some(8))
        .expect("pipe b");
    r.connect_fc("a", "b", Some(1500)).expect("a channel");
    let conn = r.connect_local("b").expect("b's connection");
    let mut b = Endpoint::from_connection(conn, IdlePolicy::Spin, None).expect("b attaches");
    // the partner's view: the channel as the daemon hands it to a
    let evil = r.connect_local("a").expect("a's connection");
    let mut buf = [0u8; MAX_MSG];
    let (region, ring) = loop {
        let (n, fd) = fdpass::recv(evil.as_fd(), &mut buf)
            .expect("a message")
            .expect("not hung up");
        if let Ok(Msg::Channel(c)) = Msg::decode(&buf[..n]) {
            let p = RingParams::for_mtu(c.mtu, Some(c.depth)).expect("params");
            let (rings, size) = plan([p, p]).expect("plan");
            let region = Region::map_sealed(fd.expect("an fd").as_fd(), size).expect("map");
            break (
                region,
                if c.side == Side::A {
                    rings[0]
                } else {
                    rings[1]
                },
            );
        }
    };
    let mut prod = Producer::adopt(&region, ring);
    let mut i = In(data);
    let mut frame = vec![0u8; 1600];
    while !i.done() {
        match i.u8() % 4 {
            0 => {
                let off = (usize::from(i.u16()) * 4) % region.len();
                region.store_u32(off, i.u32(), Ordering::Release);
            }
            1 => {
                let n = 1 + usize::from(i.u16()) % 1514;
                let src = i.bytes(n);
                frame[..src.len()].copy_from_slice(src);
                let _ = prod.push(&region, &frame[..n], 0);
                prod.publish(&region);
            }
            2 => {
                if let Some((n, via)) = b.recv(&mut frame) {
                    if via == Via::FastChannel {
                        let f = &frame[..n];
                        assert_eq!(&f[6..12], &[2, 0xdc, 10, 3, 0, 1], "MAC of the partner");
                        // (a record carries the address right after its Ethernet header)
                        let at = if docknet_lib::frame::Record::is_one(f) {
                            14
                        } else {
                            26
                        };
                        assert_eq!(&f[at..at + 4], &[10, 3, 0, 1], "address of the partner");
                        record(f);
                    }
                }
            }
            _ => {
                b.drain();
            }
        }
    }
}

/// Delivery messages and services tables: decode, and re-encode what decodes.
pub fn delivery(data: &[u8]) {
    use docknet_pipe::services::Table;
    if let Ok(m) = Msg::decode(data) {
        let b = m.encode();
        assert_eq!(Msg::decode(&b).as_ref(), Ok(&m));
        assert!(b.len() <= MAX_MSG);
    }
    if let Ok(t) = Table::decode(data) {
        let all: Vec<_> = t.services().cloned().collect();
        let b = Table::encode(&all);
        assert_eq!(b.len(), data.len());
        let again = Table::decode(&b).expect("a table re-encoded decodes");
        assert_eq!(again.len(), t.len());
        for s in &all {
            assert_eq!(again.get(s.vip, s.port, s.proto), Some(s));
            assert!(s
                .pick(Ipv4Addr::new(10, 0, 0, 1), 7)
                .is_none_or(|b| s.backends.contains(&b)));
        }
    }
}

/// DockLib's TCP segment handling on a frame: the MSS clamp applied to received SYNs (the
/// frame comes from a partner or the daemon) and the cut of a segment too large for its path.
/// The first two bytes choose the path's size.
/// What a frame from a channel is as a record (`docknet_lib::frame::Record`): parsing never
/// panics, and a record parsed is one whose headers, written again, are the frame's.
fn record(f: &[u8]) {
    use docknet_lib::frame::{Record, RecordKind, RECORD_HEAD};
    if let Some(r) = Record::parse(f) {
        assert_eq!(
            f.len() > RECORD_HEAD,
            r.kind == RecordKind::Data,
            "bytes in data only, and in every data record"
        );
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&f[..6]);
        src.copy_from_slice(&f[6..12]);
        assert_eq!(&r.head(dst, src)[..], &f[..RECORD_HEAD], "{r:?}");
    }
}

pub fn segment(data: &[u8]) {
    // every frame is also looked at as a record
    record(data);
    use docknet_lib::segment::{
        clamp_mss, is_syn, offered_mss, plain_tcp_head, segment as cut, tcp_syn,
    };
    let mut i = In(data);
    let max = 64 + usize::from(i.u16()) % 66000;
    let frame = i.0;
    // a frame DockLib reads in place when its headers alone say it is a plain TCP segment: what
    // the headers say, the whole frame says (no SYN gets past admission and the clamp)
    let head = frame.len().min(max % 200);
    if plain_tcp_head(&frame[..head], frame.len()) {
        assert_eq!(
            tcp_syn(frame),
            Some(false),
            "lent on its first {head} bytes"
        );
    }
    for checksums in [false, true] {
        let mut f = frame.to_vec();
        let syn = is_syn(&f);
        if clamp_mss(&mut f, max, checksums) {
            assert!(syn, "only a SYN is clamped");
            // MSS options (at most ten fit) and the checksum
            let changed = (0..f.len()).filter(|k| f[*k] != frame[*k]).count();
            assert!(changed <= 22, "{changed} bytes changed by a clamp");
            let (before, after) = (offered_mss(frame), offered_mss(&f));
            assert!(
                after.is_some() && after <= before,
                "{before:?} -> {after:?}"
            );
            assert!(
                usize::from(after.unwrap_or(0)) < max,
                "{after:?} for a path of {max}"
            );
        } else {
            assert_eq!(f, frame, "an unclamped frame is untouched");
        }
        let mut payload = Vec::new();
        let mut first_hdr: Option<usize> = None;
        if let Some(n) = cut(frame, max, checksums, |h, p| {
            assert!(h.len() + p.len() <= max, "a piece larger than the path");
            assert_eq!(*first_hdr.get_or_insert(h.len()), h.len());
            payload.extend_from_slice(p);
        }) {
            assert!(n >= 1);
            let h = first_hdr.expect("a piece");
            assert_eq!(&frame[h..h + payload.len()], &payload[..], "the payload");
        }
    }
}

/// A name server's answer read as the answer to a question (the first byte picks the name asked,
/// the answer's own first two bytes are taken as the question's id, so that reading goes past
/// the id check), and the same bytes as `resolv.conf` text.
pub fn dns(data: &[u8]) {
    use docknet_lib::dns::{answer, candidates, parse_conf, Answer, MAX_SEARCH, MAX_SERVERS};
    const NAMES: [&str; 3] = ["web.x", "a.x", "web.ns.svc.cluster.local"];
    let Some((k, rest)) = data.split_first() else {
        return;
    };
    let name = NAMES[usize::from(*k) % NAMES.len()];
    let id = match rest {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    };
    if let Some(Answer::Found(addrs, canon)) = answer(rest, id, name) {
        assert!(!addrs.is_empty() && !canon.is_empty());
    }
    let c = parse_conf(&String::from_utf8_lossy(rest));
    assert!(c.servers.len() <= MAX_SERVERS && c.search.len() <= MAX_SEARCH && c.ndots <= 15);
    assert!(candidates("web", &c).len() <= MAX_SEARCH + 1);
}

/// Seed inputs for each target: honest traffic of each kind, so the fuzzer starts inside the
/// interesting states. `replay --write-seeds DIR` writes them.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use docknet_pipe::delivery::{ChannelDesc, PipeDesc};
    use docknet_pipe::layout::{init, Identity};
    let mut out = Vec::new();
    // a real header of each kind
    for (k, kind) in [("pipe", Kind::Pipe), ("fc", Kind::FastChannel)] {
        let p = RingParams::for_mtu(1500, Some(8)).expect("params");
        let (rings, size) = plan([p, p]).expect("plan");
        let r = Region::anonymous(size).expect("memory");
        let id = Identity {
            ip_a: Ipv4Addr::new(10, 0, 0, 1),
            ip_b_or_prefix: 24,
            mac_a: [2, 0xdc, 10, 0, 0, 1],
            mac_b: [0; 6],
            mtu: 1500,
        };
        init(&r, kind, id, rings, size).expect("init");
        let mut b = vec![0u8; 4096];
        r.read(0, &mut b);
        out.push(("header", format!("{k}-1500"), b));
    }
    // honest ring traffic: push, publish, pop, release
    out.push((
        "ring",
        "honest".into(),
        [3u8, 0, 40, 4, 1, 2, 3, 10, 4, 1, 1, 2, 5].to_vec(),
    ));
    // an IPv4 frame, an ARP request, an IPv6 frame and a neighbour solicitation between two
    // dual-stack ports (fd00::1 and fd00::2)
    let port = |last: u8| {
        let mut v = vec![10, 0, 0, last];
        v.reverse();
        v.extend([24, 2, 0xdc, 10, 0, 0, last]);
        v.extend([1, 0, 0, 0, 0xfd, last, 0, 0, 0]);
        v
    };
    let mut sw = vec![2];
    sw.extend(port(1));
    sw.extend(port(2));
    sw.extend([0, 0]);
    let v6 = |last: u8| {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = last;
        a
    };
    let mut ip6 = vec![0u8; 14 + 40 + 8];
    ip6[12..14].copy_from_slice(&[0x86, 0xdd]);
    ip6[14] = 0x60;
    ip6[18..20].copy_from_slice(&8u16.to_be_bytes());
    ip6[20] = 17;
    ip6[21] = 64;
    ip6[22..38].copy_from_slice(&v6(1));
    ip6[38..54].copy_from_slice(&v6(2));
    out.push(("switch", "ipv6".into(), [sw.clone(), ip6.clone()].concat()));
    let mut ns = vec![0u8; 14 + 40 + 32];
    ns[..54].copy_from_slice(&ip6[..54]);
    ns[18..20].copy_from_slice(&32u16.to_be_bytes());
    ns[20] = 58;
    ns[21] = 255;
    let mut sn = [0u8; 16];
    sn[..2].copy_from_slice(&[0xff, 0x02]);
    sn[11..13].copy_from_slice(&[1, 0xff]);
    sn[15] = 2;
    ns[38..54].copy_from_slice(&sn);
    ns[54] = 135;
    ns[62..78].copy_from_slice(&v6(2));
    ns[78..80].copy_from_slice(&[1, 1]);
    ns[80..86].copy_from_slice(&[2, 0xdc, 10, 0, 0, 1]);
    out.push(("switch", "ndp".into(), [sw.clone(), ns].concat()));
    let mut ip = vec![0u8; 34];
    ip[12..14].copy_from_slice(&[8, 0]);
    ip[14] = 0x45;
    ip[26..30].copy_from_slice(&[10, 0, 0, 1]);
    ip[30..34].copy_from_slice(&[10, 0, 0, 2]);
    out.push(("switch", "ipv4".into(), [sw.clone(), ip].concat()));
    let arp = docknet_daemon::switch::arp_frame(
        1,
        [2, 0xdc, 10, 0, 0, 1],
        Ipv4Addr::new(10, 0, 0, 1),
        [0; 6],
        Ipv4Addr::new(10, 0, 0, 2),
        [0xff; 6],
    );
    out.push(("switch", "arp".into(), [sw, arp.to_vec()].concat()));
    // the wire: an ARP request for a pipe, then a frame for it
    let req = docknet_daemon::nic::wire::arp_frame(&docknet_daemon::nic::wire::Arp {
        request: true,
        sha: [2, 0, 0, 0, 0, 9],
        spa: Ipv4Addr::new(10, 0, 0, 9),
        tha: [0; 6],
        tpa: Ipv4Addr::new(10, 0, 0, 1),
    });
    let mut w = vec![2u8, ARP_FRAME_LEN as u8, 0, 0xdc, 5, 0, 0];
    w.extend(req);
    let mut ipf = vec![0u8; 54];
    ipf[12..14].copy_from_slice(&[8, 0]);
    ipf[14] = 0x45;
    ipf[16..18].copy_from_slice(&40u16.to_be_bytes());
    ipf[22] = 64;
    ipf[23] = 6;
    ipf[26..30].copy_from_slice(&[10, 0, 0, 9]);
    ipf[30..34].copy_from_slice(&[10, 0, 0, 1]);
    ipf[46] = 0x50;
    for op in [1u8, 0] {
        w.extend([op, 54, 0, 0xdc, 5, 0, 0]);
        w.extend(&ipf);
    }
    out.push(("wire", "arp-then-frames".into(), w));
    // the same frame wrapped for a tunnel, then a wrapped frame arriving at its end
    let mut v = vec![5u8, 54, 0, 0xdc, 5, 0, 0];
    v.extend(&ipf);
    let t = docknet_daemon::nic::vxlan::Tunnel {
        local: Ipv4Addr::new(10, 0, 0, 2),
        remote: Ipv4Addr::new(10, 0, 0, 1),
        vni: 1,
    };
    let o = docknet_daemon::nic::vxlan::OVERHEAD;
    let mut buf = vec![0u8; o + ipf.len()];
    buf[o..].copy_from_slice(&ipf);
    let n = docknet_daemon::nic::vxlan::encap(&mut buf, ipf.len(), &t, [2; 6], [4; 6], 1500)
        .expect("a small frame wraps");
    v.extend([4u8, n as u8, 0, 0xdc, 5, 0, 0]);
    v.extend(&buf[..n]);
    out.push(("wire", "vxlan".into(), v));
    // a descriptor and a sequence number written into pipe 0's tx ring
    out.push(("master", "one-frame".into(), [0u8; 48].to_vec()));
    // a day in the life of the control socket
    let lines = [
        r#"{"v":1,"op":"pipe_create","name":"a","ip":"10.1.0.1/24","mtu":576,"ring_depth":8}"#,
        r#"{"v":1,"op":"pipe_create","name":"b","ip":"10.1.0.2/24","mtu":576,"ring_depth":8}"#,
        r#"{"v":1,"op":"pipe_create","name":"a","ip":"10.1.0.3/24"}"#,
        r#"{"v":1,"op":"fc_connect","a":"a","b":"b","mtu":1500}"#,
        r#"{"v":1,"op":"pipe_attach","name":"a","netns":"x"}"#,
        r#"{"v":1,"op":"fc_rm","a":"b","b":"a"}"#,
        r#"{"v":1,"op":"pipe_rm","name":"zz"}"#,
        r#"{"v":1,"op":"pipe_show","name":"a"}"#,
    ];
    out.push(("control", "session".into(), lines.join("\n").into_bytes()));
    // a partner sending one honest frame, and one forged
    let mut fr = vec![1u8, 60, 0];
    let mut f = vec![0u8; 60];
    f[6..12].copy_from_slice(&[2, 0xdc, 10, 3, 0, 1]);
    f[12..14].copy_from_slice(&[8, 0]);
    f[14] = 0x45;
    f[26..30].copy_from_slice(&[10, 3, 0, 1]);
    f[30..34].copy_from_slice(&[10, 3, 0, 2]);
    fr.extend(&f);
    fr.push(2);
    out.push(("channel", "honest".into(), fr));
    for (n, m) in [
        (
            "hello",
            Msg::Hello(PipeDesc {
                name: "web".into(),
                ip: Ipv4Addr::new(10, 0, 0, 2),
                prefix: 24,
                mac: [2, 0xdc, 10, 0, 0, 2],
                mtu: 1500,
                depth: 1024,
                ip6: None,
            }),
        ),
        (
            "channel",
            Msg::Channel(ChannelDesc {
                id: 3,
                side: Side::A,
                mtu: 65535,
                depth: 256,
                peer: "db".into(),
                peer_ip: Ipv4Addr::new(10, 0, 0, 3),
                peer_mac: [2, 0xdc, 10, 0, 0, 3],
                peer_ip6: None,
            }),
        ),
        ("closed", Msg::Closed { id: 3 }),
        ("synced", Msg::Synced),
        ("services", Msg::Services { len: 36 }),
    ] {
        out.push(("delivery", n.into(), m.encode()));
    }
    {
        use docknet_pipe::services::{Affinity, Proto, Service, Table};
        let svc = Service {
            vip: Ipv4Addr::new(10, 96, 0, 10),
            port: 80,
            proto: Proto::Tcp,
            affinity: Affinity::ClientIp,
            backends: vec![std::net::SocketAddrV4::new(
                Ipv4Addr::new(10, 0, 0, 2),
                8080,
            )],
        };
        out.push(("delivery", "table".into(), Table::encode(&[svc])));
    }
    // a TCP SYN offering a 64 KiB MSS and a data segment, each behind a path size of 1514
    let tcp = |flags: u8, opts: &[u8], payload: usize| {
        let mut f = vec![0u8; 14 + 20 + 20 + opts.len() + payload];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        let total = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[23] = 6;
        f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f[46] = (((20 + opts.len()) / 4) << 4) as u8;
        f[47] = flags;
        f[54..54 + opts.len()].copy_from_slice(opts);
        let mut input = 1450u16.to_le_bytes().to_vec();
        input.extend(f);
        input
    };
    out.push((
        "segment",
        "syn".into(),
        tcp(0x02, &[2, 4, 0xff, 0xd7, 1, 3, 3, 7], 0),
    ));
    out.push(("segment", "data".into(), tcp(0x18, &[], 5000)));
    // an answer for web.x (A 10.0.0.9) and one for a.x through a CNAME to b.x, as a server sends
    let name = |n: &str| {
        let mut b = Vec::new();
        for l in n.split('.') {
            b.push(l.len() as u8);
            b.extend_from_slice(l.as_bytes());
        }
        b.push(0);
        b
    };
    let reply = |pick: u8, q: &str, records: &[(u16, Vec<u8>)]| {
        let mut b = vec![
            pick,
            0x12,
            0x34,
            0x81,
            0x80,
            0,
            1,
            0,
            records.len() as u8,
            0,
            0,
            0,
            0,
        ];
        b.extend(name(q));
        b.extend_from_slice(&[0, 1, 0, 1]);
        for (ty, rdata) in records {
            b.extend_from_slice(&[0xc0, 0x0c]);
            b.extend_from_slice(&ty.to_be_bytes());
            b.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
            b.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            b.extend_from_slice(rdata);
        }
        b
    };
    out.push((
        "dns",
        "a".into(),
        reply(0, "web.x", &[(1, vec![10, 0, 0, 9])]),
    ));
    out.push(("dns", "cname".into(), reply(1, "a.x", &[(5, name("b.x"))])));
    out.push((
        "dns",
        "resolv-conf".into(),
        b"\x00nameserver 10.96.0.10\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n"
            .to_vec(),
    ));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_dns_seeds_are_answers_the_resolver_takes() {
        use docknet_lib::dns::{answer, Answer};
        let seed = |n: &str| {
            super::seeds()
                .into_iter()
                .find(|(t, name, _)| *t == "dns" && name == n)
                .unwrap()
                .2
        };
        let a = seed("a");
        assert!(matches!(
            answer(&a[1..], 0x1234, "web.x"),
            Some(Answer::Found(..))
        ));
        let c = seed("cname");
        assert_eq!(answer(&c[1..], 0x1234, "a.x"), Some(Answer::NoData));
    }

    #[test]
    fn every_seed_passes_its_target() {
        for (t, _, data) in super::seeds() {
            let f = super::TARGETS.iter().find(|(n, _)| *n == t).unwrap().1;
            f(&data);
        }
    }
}
