//! The raw-frame endpoint: a container's view of its DockPipe and fast channels.
//!
//! Call order: [`Endpoint::attach`] once; then any mix of [`Endpoint::send`] (queues, returns
//! which path it took) and [`Endpoint::flush`] (publishes queued frames, kicks sleepers), and
//! [`Endpoint::recv`] (fast channels first, then the rx ring). [`Endpoint::idle`] applies the
//! idle policy between empty polls; with `adaptive` or `block` it ends in a futex sleep on every
//! ring this endpoint reads plus the pipe's channel generation, so a new fast channel or any
//! frame wakes it.

use crate::frame;
use docknet_pipe::layout::{self, Kind, RegionInfo};
use docknet_pipe::ring::RingStats;
use docknet_pipe::wake;
use docknet_pipe::{Consumer, IdlePolicy, Idler, Producer, PushError, Region};
use std::fs::{self, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a pipe is mounted inside a container started by `docknet run`.
pub const DEFAULT_PIPE_DIR: &str = "/run/docknet/pipe";
/// Environment variable that overrides [`DEFAULT_PIPE_DIR`].
pub const PIPE_ENV: &str = "DOCKNET_PIPE";
/// Release the rx ring to the producer at least every this many frames.
const RELEASE_EVERY: u32 = 32;

/// Why attaching failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No pipe at the path: not started by `docknet run`, or the pipe was removed.
    #[error("no DockPipe attached at {path} (run the program with `docknet run --pipe NAME`, or set {PIPE_ENV}): {source}")]
    NotAttached {
        /// Where we looked.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file is there but is not a usable region.
    #[error("{path} is not a usable DockPipe: {source}")]
    BadRegion {
        /// Region file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: layout::LayoutError,
    },
}

/// Why a send failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The ring (pipe tx or fast channel) is full; try again after the peer drains it.
    #[error("ring full")]
    Full,
    /// Frame empty or longer than every path's frame size.
    #[error("frame length {0} not accepted")]
    BadLength(usize),
    /// The daemon removed this pipe.
    #[error("pipe closed by the daemon")]
    Closed,
}

/// The path a frame took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Through the daemon (pipe tx/rx rings).
    Daemon,
    /// Through a fast channel.
    FastChannel,
}

#[derive(Debug)]
struct FcLink {
    path: PathBuf,
    peer_ip: Ipv4Addr,
    peer_mac: [u8; 6],
    region: Arc<Region>,
    tx: Producer,
    rx: Consumer,
    rx_unreleased: u32,
}

/// Counters of an endpoint (local to the container).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Frames received through the daemon.
    pub rx_daemon: u64,
    /// Frames received through fast channels.
    pub rx_fc: u64,
    /// Frames sent through the daemon.
    pub tx_daemon: u64,
    /// Frames sent through fast channels.
    pub tx_fc: u64,
    /// Refused descriptors and impossible indices seen on the rings this endpoint reads.
    pub bad_desc: u64,
    /// Fast-channel files that could not be used.
    pub bad_fc: u64,
    /// Futex sleeps.
    pub sleeps: u64,
}

/// A container's attachment to its DockPipe.
#[derive(Debug)]
pub struct Endpoint {
    dir: PathBuf,
    region: Arc<Region>,
    info: RegionInfo,
    tx: Producer,
    rx: Consumer,
    rx_unreleased: u32,
    fcs: Vec<FcLink>,
    generation: u32,
    idler: Idler,
    stats: EndpointStats,
}

fn map(path: &Path, kind: Kind) -> Result<(Arc<Region>, RegionInfo), AttachError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| AttachError::NotAttached {
            path: path.to_path_buf(),
            source,
        })?;
    let region = Region::map_file(&f).map_err(|source| AttachError::NotAttached {
        path: path.to_path_buf(),
        source,
    })?;
    let info = RegionInfo::parse(&region, kind).map_err(|source| AttachError::BadRegion {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((Arc::new(region), info))
}

/// The futex words an endpoint sleeps on, armed by [`Endpoint::arm_sleep`]. Holds its regions
/// alive, so a thread can wait on it without holding the endpoint (e.g. outside a lock).
#[derive(Debug)]
pub struct SleepSet {
    words: Vec<(Arc<Region>, usize, u32)>,
}

impl SleepSet {
    /// Sleeps until a producer kicks one of the rings, the fast channels change, any of `extra`
    /// (word, expected value) changes, or `timeout` passes.
    pub fn wait(&self, extra: &[(&AtomicU32, u32)], timeout: Duration) {
        let mut words: Vec<(&AtomicU32, u32)> = self
            .words
            .iter()
            .filter_map(|(r, off, v)| r.u32_at(*off).map(|w| (w, *v)))
            .collect();
        words.extend_from_slice(extra);
        if wake::wait_any(&words, Some(timeout)).is_err() {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Endpoint {
    /// Attaches to the pipe at `$DOCKNET_PIPE`, or `/run/docknet/pipe`.
    pub fn attach_default(policy: IdlePolicy) -> Result<Endpoint, AttachError> {
        let dir = std::env::var_os(PIPE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PIPE_DIR));
        Endpoint::attach(&dir, policy)
    }

    /// Attaches to the pipe whose directory is `dir` (holding `dp.map` and `fc/`).
    pub fn attach(dir: &Path, policy: IdlePolicy) -> Result<Endpoint, AttachError> {
        let (region, info) = map(&dir.join("dp.map"), Kind::Pipe)?;
        let tx = Producer::adopt(&region, info.rings[0]);
        let rx = Consumer::adopt(&region, info.rings[1]);
        let mut ep = Endpoint {
            dir: dir.to_path_buf(),
            generation: layout::generation(&region),
            region,
            info,
            tx,
            rx,
            rx_unreleased: 0,
            fcs: Vec::new(),
            idler: Idler::new(policy),
            stats: EndpointStats::default(),
        };
        ep.rescan_fcs();
        Ok(ep)
    }

    /// This pipe's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.info.id.ip_a
    }
    /// Prefix length of its subnet.
    pub fn prefix(&self) -> u32 {
        self.info.id.ip_b_or_prefix
    }
    /// This pipe's MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.info.id.mac_a
    }
    /// The pipe's MTU.
    pub fn mtu(&self) -> u32 {
        self.info.id.mtu
    }
    /// Largest frame the pipe carries.
    pub fn frame_size(&self) -> usize {
        self.info.rings[0].frame_size as usize
    }
    /// Addresses of current fast-channel partners, with their MTU.
    pub fn fc_peers(&self) -> Vec<(Ipv4Addr, usize)> {
        self.fcs
            .iter()
            .map(|f| (f.peer_ip, f.tx.layout().frame_size as usize))
            .collect()
    }
    /// MAC of a fast-channel partner, known without ARP.
    pub fn fc_peer_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.fcs
            .iter()
            .find(|f| f.peer_ip == ip)
            .map(|f| f.peer_mac)
    }
    /// Counters.
    pub fn stats(&self) -> EndpointStats {
        let mut s = self.stats;
        let ring = |r: &RingStats| r.bad_desc + r.oversize + r.ring_overrun;
        s.bad_desc = ring(&self.rx.stats)
            + self.tx.stats.ring_overrun
            + self
                .fcs
                .iter()
                .map(|f| ring(&f.rx.stats) + f.tx.stats.ring_overrun)
                .sum::<u64>();
        s
    }
    /// How long ago the daemon last wrote its heartbeat (every 200 ms while it runs), or
    /// `None` if it never did. All namespaces share CLOCK_MONOTONIC, so this is comparable.
    pub fn daemon_silence(&self) -> Option<Duration> {
        let hb = layout::heartbeat(&self.region);
        if hb == 0 {
            return None;
        }
        let now_ms = wake::monotonic_ns() / 1_000_000;
        Some(Duration::from_millis(now_ms.saturating_sub(hb)))
    }

    /// True once the daemon has removed the pipe.
    pub fn is_closed(&self) -> bool {
        layout::flags(&self.region) & layout::FLAG_CLOSED != 0
    }

    /// Re-reads the fast-channel directory if the daemon changed it. Cheap: one load of the
    /// generation word when nothing changed. Called by `recv` and `idle`.
    pub fn refresh(&mut self) {
        let g = layout::generation(&self.region);
        if g != self.generation {
            self.generation = g;
            self.rescan_fcs();
        }
    }

    fn rescan_fcs(&mut self) {
        let fc_dir = self.dir.join("fc");
        let mut present: Vec<PathBuf> = fs::read_dir(&fc_dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "map"))
                    .collect()
            })
            .unwrap_or_default();
        present.sort();
        self.fcs.retain(|f| {
            present.contains(&f.path) && layout::flags(&f.region) & layout::FLAG_CLOSED == 0
        });
        for p in present {
            if self.fcs.iter().any(|f| f.path == p) {
                continue;
            }
            match self.open_fc(&p) {
                Some(l) => self.fcs.push(l),
                None => self.stats.bad_fc += 1,
            }
        }
    }

    fn open_fc(&self, path: &Path) -> Option<FcLink> {
        let (region, info) = map(path, Kind::FastChannel).ok()?;
        if layout::flags(&region) & layout::FLAG_CLOSED != 0 {
            return None;
        }
        let me = self.ip();
        let (a, b) = (info.id.ip_a, Ipv4Addr::from(info.id.ip_b_or_prefix));
        // ring 0 carries A -> B
        let (tx, rx, peer_ip, peer_mac) = if a == me {
            (info.rings[0], info.rings[1], b, info.id.mac_b)
        } else if b == me {
            (info.rings[1], info.rings[0], a, info.id.mac_a)
        } else {
            return None;
        };
        Some(FcLink {
            path: path.to_path_buf(),
            peer_ip,
            peer_mac,
            tx: Producer::adopt(&region, tx),
            rx: Consumer::adopt(&region, rx),
            region,
            rx_unreleased: 0,
        })
    }

    /// Queues one Ethernet frame: through the fast channel to its destination IP if there is
    /// one and the frame fits, else through the daemon. Not visible until [`Endpoint::flush`].
    pub fn send(&mut self, frame: &[u8]) -> Result<Via, SendError> {
        if frame.is_empty() {
            return Err(SendError::BadLength(0));
        }
        if let Some(dst) = frame::ipv4_dst(frame) {
            if let Some(l) = self.fcs.iter_mut().find(|l| l.peer_ip == dst) {
                if frame.len() <= l.tx.layout().frame_size as usize {
                    return match l.tx.push(&l.region, frame, 0) {
                        Ok(()) => {
                            self.stats.tx_fc += 1;
                            Ok(Via::FastChannel)
                        }
                        Err(PushError::Full) => Err(SendError::Full),
                        Err(PushError::BadLength) => Err(SendError::BadLength(frame.len())),
                    };
                }
            }
        }
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        match self.tx.push(&self.region, frame, 0) {
            Ok(()) => {
                self.stats.tx_daemon += 1;
                Ok(Via::Daemon)
            }
            Err(PushError::Full) => Err(SendError::Full),
            Err(PushError::BadLength) => Err(SendError::BadLength(frame.len())),
        }
    }

    /// Publishes queued frames on every path and kicks sleeping consumers.
    pub fn flush(&mut self) {
        self.tx.publish(&self.region);
        for l in &mut self.fcs {
            l.tx.publish(&l.region);
        }
    }

    /// Sends and flushes, retrying (with the idle policy) while the ring is full, until
    /// `deadline`.
    pub fn send_blocking(&mut self, frame: &[u8], deadline: Instant) -> Result<Via, SendError> {
        // fast path: no clock read, no idler, when there is room
        if let Ok(v) = self.send(frame) {
            self.flush();
            return Ok(v);
        }
        let mut idler = Idler::new(self.idler.policy());
        loop {
            match self.send(frame) {
                Ok(v) => {
                    self.flush();
                    return Ok(v);
                }
                Err(SendError::Full) if Instant::now() < deadline => {
                    self.flush();
                    if idler.step() {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Copies the next received frame into `buf` (fast channels first, then the rx ring) and
    /// returns its length and path, or `None` when nothing is waiting. Frames longer than
    /// `buf` are truncated to it.
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<(usize, Via)> {
        self.refresh();
        for l in &mut self.fcs {
            if let Some(n) = take(&l.region, &mut l.rx, &mut l.rx_unreleased, buf) {
                self.stats.rx_fc += 1;
                return Some((n, Via::FastChannel));
            }
        }
        let n = take(&self.region, &mut self.rx, &mut self.rx_unreleased, buf)?;
        self.stats.rx_daemon += 1;
        Some((n, Via::Daemon))
    }

    /// Discards every frame queued for this endpoint and returns how many there were. A server
    /// calls it once on start so that frames left by an earlier run are not taken as new.
    pub fn drain(&mut self) -> u64 {
        let mut buf = vec![0u8; 64];
        let mut n = 0;
        while self.recv(&mut buf).is_some() {
            n += 1;
        }
        n
    }

    /// Resolves `ip` to a MAC: a fast-channel partner's is known; otherwise asks the daemon
    /// with ARP. Frames other than the answer that arrive meanwhile are discarded, so call
    /// this before traffic starts.
    pub fn resolve(&mut self, ip: Ipv4Addr, timeout: Duration) -> Option<[u8; 6]> {
        if let Some(m) = self.fc_peer_mac(ip) {
            return Some(m);
        }
        let deadline = Instant::now() + timeout;
        let req = frame::arp_request(self.mac(), self.ip(), ip);
        let mut buf = vec![0u8; self.frame_size()];
        let mut next_ask = Instant::now();
        while Instant::now() < deadline {
            if Instant::now() >= next_ask {
                if self.send(&req).is_ok() {
                    self.flush();
                }
                next_ask = Instant::now() + Duration::from_millis(200);
            }
            match self.recv(&mut buf) {
                Some((n, _)) => {
                    if let Some((from, mac)) = frame::arp_reply_sender(&buf[..n]) {
                        if from == ip {
                            return Some(mac);
                        }
                    }
                }
                None => self.idle(Duration::from_millis(20)),
            }
        }
        None
    }

    /// Call after a poll that found nothing: spins, yields or sleeps per the idle policy.
    /// A sleep ends on a kick from any producer, a fast-channel change, or `max_sleep`.
    pub fn idle(&mut self, max_sleep: Duration) {
        if self.idler.step() {
            self.sleep(max_sleep);
        }
    }

    /// Resets the idle policy after useful work.
    pub fn busy(&mut self) {
        self.idler.busy();
    }

    fn sleep(&mut self, max_sleep: Duration) {
        if let Some(set) = self.arm_sleep() {
            self.stats.sleeps += 1;
            set.wait(&[], max_sleep);
        }
        self.disarm_sleep();
    }

    /// Arms the sleep words of every ring this endpoint reads and returns them, or `None`
    /// (disarmed again) when work arrived meanwhile. After waiting, call
    /// [`Endpoint::disarm_sleep`].
    pub fn arm_sleep(&mut self) -> Option<SleepSet> {
        let mut pending = self.rx.arm(&self.region);
        for l in &mut self.fcs {
            pending |= l.rx.arm(&l.region);
        }
        if pending {
            self.disarm_sleep();
            return None;
        }
        let mut words = Vec::with_capacity(2 + self.fcs.len());
        words.push((self.region.clone(), self.info.rings[1].sleep_off(), 1));
        for l in &self.fcs {
            words.push((l.region.clone(), l.rx.layout().sleep_off(), 1));
        }
        words.push((self.region.clone(), layout::GENERATION_OFF, self.generation));
        Some(SleepSet { words })
    }

    /// Clears the sleep words after a sleep and picks up fast-channel changes.
    pub fn disarm_sleep(&mut self) {
        self.rx.disarm(&self.region);
        for l in &self.fcs {
            l.rx.disarm(&l.region);
        }
        self.refresh();
    }
}

impl Drop for Endpoint {
    /// Publishes how far this endpoint has read (so a later attachment does not see the same
    /// frames again) and what it has queued.
    fn drop(&mut self) {
        self.rx.release(&self.region);
        self.tx.publish(&self.region);
        for l in &mut self.fcs {
            l.rx.release(&l.region);
            l.tx.publish(&l.region);
        }
    }
}

fn take(region: &Region, c: &mut Consumer, unreleased: &mut u32, buf: &mut [u8]) -> Option<usize> {
    loop {
        let r = c.pop(region)?;
        *unreleased += 1;
        let out = r.ok().map(|f| {
            let n = f.len.min(buf.len());
            region.read(f.off, &mut buf[..n]);
            n
        });
        if *unreleased >= RELEASE_EVERY || !c.ready(region) {
            c.release(region);
            *unreleased = 0;
        }
        if out.is_some() {
            return out;
        }
        // a refused descriptor (counted by the ring): try the next one
    }
}
