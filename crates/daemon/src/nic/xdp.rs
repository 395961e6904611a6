//! The AF_XDP port: the flow director (an XDP program, loaded and attached with aya) sends
//! frames for the pipes' addresses to one AF_XDP socket per receive queue (xdpilone); the rest
//! of the link's traffic passes to the host's kernel. Frames leave through the first queue's
//! socket.
//!
//! Memory: one UMEM of 4 KiB chunks, mapped by the daemon: each queue's fill ring gets its own
//! chunks, the rest form the transmit pool. A chunk belongs to the kernel from the moment it is
//! in a fill or tx ring until it comes back on the rx or completion ring; only then is it
//! read or written here.
//!
//! Binding asks for nothing (the kernel takes zero-copy where the driver has it, else copies:
//! veth copies) and sets `XDP_USE_NEED_WAKEUP`: the fill ring is kicked with `poll` and the tx
//! ring with `sendto` whenever the kernel asks (in copy mode, for every batch sent).
//!
//! A frame fits one chunk less the kernel's headroom where the link's MTU allows (up to about
//! 3.8 KiB). A larger MTU (jumbo frames) takes multi-buffer XDP: the director is loaded with the
//! kernel's frags flag and the sockets are bound with `XDP_USE_SG`, so a frame arrives as
//! several descriptors (all but the last marked `XDP_PKT_CONTD`), gathered here into one
//! buffer, and leaves the same way from a slot of consecutive chunks (written in place, cut
//! into descriptors of a chunk each). A frame's descriptors go into the tx ring in order (what
//! finds no room waits for the next kick: the kernel holds a frame until its last descriptor
//! comes), and its slot returns to the pool when the last of them is completed.

#![allow(unsafe_code)]

use super::link::LinkInfo;
use super::{NicError, Port, PortCounters, PortInfo, Rx};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpFlags};
use core::num::NonZeroU32;
use core::ptr::NonNull;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::os::fd::{BorrowedFd, RawFd};
use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig, User};

/// The flow director, compiled from `bpf/flow_director.c` by the build script.
/// (Aligned: the ELF parser reads it in place.)
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flow_director.o"));
const PROGRAM_NAME: &str = "docknet_flow_director";
/// The same director, loaded with the multi-buffer flag (section `xdp.frags`).
const PROGRAM_NAME_FRAGS: &str = "docknet_flow_director_frags";

/// Chunk size (one page).
pub const CHUNK: u32 = 4096;
/// Where the kernel puts a received frame within its chunk in copy mode (XDP_PACKET_HEADROOM).
const HEADROOM: u32 = 256;
/// Longest frame in one buffer (a larger one takes several, up to [`MAX_SG_FRAME`]).
pub const MAX_FRAME: usize = (CHUNK - HEADROOM) as usize;
/// Buffers of one multi-buffer frame at most (the kernel's copy path takes up to 17).
const MAX_BUFS: usize = 16;
/// Longest frame this port sends or receives (multi-buffer).
pub const MAX_SG_FRAME: usize = MAX_BUFS * MAX_FRAME;
/// Bind flag: multi-buffer frames (`XDP_USE_SG`, Linux 6.6).
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: more buffers of this frame follow (`XDP_PKT_CONTD`).
const XDP_PKT_CONTD: u32 = 1;
/// Ring sizes (fill, completion, rx, tx).
const RING: u32 = 2048;
/// Chunks each queue keeps in its fill ring.
const RX_CHUNKS: u32 = RING;
/// Chunks for transmission.
const TX_CHUNKS: u32 = RING;
/// Descriptors sent per kick at most.
const TX_BATCH: usize = 64;

/// An anonymous, populated, page-aligned mapping for the UMEM; unmapped on drop.
#[derive(Debug)]
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> std::io::Result<Area> {
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Area {
            ptr: NonNull::new(p.cast()).ok_or_else(std::io::Error::last_os_error)?,
            len,
        })
    }

    /// Bytes `[addr, addr + len)` of the area, or `None` if out of bounds.
    ///
    /// # Safety
    /// The caller owns the chunk holding these bytes (the kernel is not using it) and does not
    /// hold another reference to them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let start = usize::try_from(addr).ok()?;
        if start.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds of the mapping (checked above), which lives as long as `self`;
        // exclusivity is the caller's promise.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once (the UMEM's sockets are closed
        // first: fields drop in declaration order, and `XdpPort` declares the area last).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

struct Queue {
    /// Keeps the socket's rings configured.
    user: User,
    rx: RingRx,
    dev: DeviceQueue,
    /// Chunks received and handed back on the next refill.
    refill: Vec<u64>,
    /// A multi-buffer frame being gathered.
    gather: Gather,
}

/// The AF_XDP port.
pub struct XdpPort {
    info: PortInfo,
    queues: Vec<Queue>,
    tx: RingTx,
    /// Transmit slots not in the kernel's hands, by address.
    free_tx: Vec<u64>,
    /// Where the transmit slots are (one chunk each unless frames take several buffers).
    slots: Slots,
    /// Descriptors of each slot's frame still with the kernel.
    tx_out: Vec<u8>,
    tx_pending: Vec<XdpDesc>,
    pipes: BpfHashMap<MapData, u32, u8>,
    in_map: HashSet<u32>,
    vteps: BpfHashMap<MapData, u32, u8>,
    vtep: Option<Ipv4Addr>,
    stats: PerCpuArray<MapData, u64>,
    c: PortCounters,
    /// The program and its link: detached when dropped (and by the kernel if the daemon dies).
    _bpf: aya::Ebpf,
    _umem: Umem,
    area: Area,
}

impl std::fmt::Debug for XdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpPort")
            .field("info", &self.info)
            .field("queues", &self.queues.len())
            .field("free_tx", &self.free_tx.len())
            .field("pipes", &self.in_map.len())
            .field("counters", &self.c)
            .field("area", &self.area)
            .finish_non_exhaustive()
    }
}

// SAFETY: the port owns its mapping and rings outright (raw pointers into memory only it and
// the kernel touch); it is moved once into the master thread and used only there.
unsafe impl Send for XdpPort {}

/// How long a bind waits for a queue that an ended process's socket still holds.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds through `bind`, waiting while the queue is busy. The AF_XDP socket of a process that
/// has just ended (a daemon killed and started again) leaves its queue only when the kernel
/// frees its buffer pool, from a work queue a moment after the process: until then a bind
/// fails with EBUSY. Another live socket on the queue keeps it busy for good, and the error
/// comes after `BUSY_WAIT`.
fn bind_when_free(
    mut bind: impl FnMut() -> Result<(), xdpilone::Errno>,
) -> Result<(), xdpilone::Errno> {
    let start = std::time::Instant::now();
    loop {
        match bind() {
            Err(e) if e.get_raw() == libc::EBUSY && start.elapsed() < BUSY_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => {
                if r.is_ok() && start.elapsed() >= std::time::Duration::from_millis(20) {
                    tracing::info!(waited = ?start.elapsed(), "the queue was busy, then free");
                }
                return r;
            }
        }
    }
}

fn errno(what: &str, e: xdpilone::Errno) -> NicError {
    NicError::Setup(format!(
        "{what}: {}",
        std::io::Error::from_raw_os_error(e.get_raw())
    ))
}

impl XdpPort {
    /// Loads and attaches the flow director to `link` and binds `queues` AF_XDP sockets (all
    /// of the link's receive queues when `None`).
    pub fn open(link: &LinkInfo, queues: Option<u32>) -> Result<XdpPort, NicError> {
        let nq = queues.unwrap_or(link.rx_queues).max(1);
        if nq > 64 {
            return Err(NicError::Setup("at most 64 queues".into()));
        }
        let frame = link.mtu as usize + super::wire::ETH;
        if frame > MAX_SG_FRAME {
            return Err(NicError::Setup(format!(
                "link {} has MTU {}: AF_XDP here takes frames up to {MAX_SG_FRAME} bytes \
                 ({MAX_BUFS} buffers); lower the MTU to {} or use --nic-mode packet",
                link.name,
                link.mtu,
                MAX_SG_FRAME - super::wire::ETH
            )));
        }
        // a frame larger than one buffer: multi-buffer XDP
        let multi = frame > MAX_FRAME;
        let (frame, slot_chunks) = if multi {
            (frame, frame.div_ceil(CHUNK as usize) as u32)
        } else {
            (MAX_FRAME, 1)
        };
        let mut bpf = aya::Ebpf::load(PROGRAM)
            .map_err(|e| NicError::Setup(format!("loading the flow director: {e}")))?;
        let name = if multi {
            PROGRAM_NAME_FRAGS
        } else {
            PROGRAM_NAME
        };
        let prog: &mut Xdp = bpf
            .program_mut(name)
            .ok_or_else(|| NicError::Setup("the flow director has no program".into()))?
            .try_into()
            .map_err(|e| NicError::Setup(format!("the flow director: {e}")))?;
        prog.load()
            .map_err(|e| NicError::Setup(format!("loading the flow director: {e}")))?;
        let attach = match prog.attach(&link.name, XdpFlags::DRV_MODE) {
            Ok(_) => "native",
            Err(native) => match prog.attach(&link.name, XdpFlags::SKB_MODE) {
                Ok(_) => {
                    tracing::warn!(
                        "native XDP failed on {} ({native}); using generic XDP (slower)",
                        link.name
                    );
                    "generic"
                }
                Err(e) => {
                    return Err(NicError::Setup(format!(
                        "XDP cannot attach to {}: {e} (native: {native}). Is another XDP \
                         program attached (`ip link set dev {} xdp off`)? Or use --nic-mode packet",
                        link.name, link.name
                    )))
                }
            },
        };
        let take = |bpf: &mut aya::Ebpf, name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| NicError::Setup(format!("the flow director has no map {name}")))
        };
        let pipes = BpfHashMap::try_from(take(&mut bpf, "pipes")?)
            .map_err(|e| NicError::Setup(format!("map pipes: {e}")))?;
        let vteps = BpfHashMap::try_from(take(&mut bpf, "vteps")?)
            .map_err(|e| NicError::Setup(format!("map vteps: {e}")))?;
        let stats = PerCpuArray::try_from(take(&mut bpf, "stats")?)
            .map_err(|e| NicError::Setup(format!("map stats: {e}")))?;
        let mut xsks = XskMap::try_from(take(&mut bpf, "xsks")?)
            .map_err(|e| NicError::Setup(format!("map xsks: {e}")))?;

        let chunks = nq * RX_CHUNKS + TX_CHUNKS;
        let area = Area::new(chunks as usize * CHUNK as usize)
            .map_err(|e| NicError::Setup(format!("mapping the UMEM: {e}")))?;
        let cfg = UmemConfig {
            fill_size: RING,
            complete_size: RING,
            frame_size: CHUNK,
            headroom: 0,
            flags: 0,
        };
        let slice = NonNull::slice_from_raw_parts(area.ptr, area.len);
        // SAFETY: the area is page-aligned (mmap), `chunks * CHUNK` bytes long and outlives
        // the UMEM (`area` is the port's last field, so it is unmapped after the sockets close).
        let umem =
            unsafe { Umem::new(cfg, slice) }.map_err(|e| errno("registering the UMEM", e))?;
        let mut ifinfo = IfInfo::invalid();
        let cname = std::ffi::CString::new(link.name.as_str())
            .map_err(|_| NicError::Setup("bad link name".into()))?;
        ifinfo
            .from_name(&cname)
            .map_err(|e| errno("finding the link", e))?;
        let mut queue_list = Vec::new();
        let mut tx = None;
        for q in 0..nq {
            ifinfo.set_queue(q);
            let sock = Socket::with_shared(&ifinfo, &umem)
                .map_err(|e| errno(&format!("opening the AF_XDP socket of queue {q}"), e))?;
            let mut dev = umem
                .fq_cq(&sock)
                .map_err(|e| errno(&format!("fill/completion rings of queue {q}"), e))?;
            let sc = SocketConfig {
                rx_size: NonZeroU32::new(RING),
                tx_size: if q == 0 { NonZeroU32::new(RING) } else { None },
                bind_flags: SocketConfig::XDP_BIND_NEED_WAKEUP | if multi { XDP_USE_SG } else { 0 },
            };
            let user = umem
                .rx_tx(&sock, &sc)
                .map_err(|e| errno(&format!("rx/tx rings of queue {q}"), e))?;
            let rx = user
                .map_rx()
                .map_err(|e| errno(&format!("mapping rx ring of queue {q}"), e))?;
            if q == 0 {
                tx = Some(user.map_tx().map_err(|e| errno("mapping the tx ring", e))?);
            }
            bind_when_free(|| umem.bind(&user)).map_err(|e| {
                errno(
                    &format!(
                        "binding queue {q} of {}{} ({})",
                        link.name,
                        if multi {
                            " for multi-buffer frames (Linux 6.6 or later)"
                        } else {
                            ""
                        },
                        if e.get_raw() == libc::EBUSY {
                            "another AF_XDP socket still holds it".to_string()
                        } else {
                            format!("does the link have {nq} queues?")
                        }
                    ),
                    e,
                )
            })?;
            xsks.set(q, rx.as_raw_fd(), 0)
                .map_err(|e| NicError::Setup(format!("map xsks: {e}")))?;
            let first = u64::from(q * RX_CHUNKS);
            let chunks: Vec<u64> = (first..first + u64::from(RX_CHUNKS))
                .map(|c| c * u64::from(CHUNK))
                .collect();
            if fill(&mut dev, &chunks) != chunks.len() {
                return Err(NicError::Setup(format!(
                    "queue {q}: the fill ring took too few"
                )));
            }
            if dev.needs_wakeup() {
                dev.wake();
            }
            queue_list.push(Queue {
                user,
                rx,
                dev,
                refill: Vec::with_capacity(RING as usize),
                gather: Gather::new(frame),
            });
        }
        let tx = tx.ok_or_else(|| NicError::Setup("no tx ring".into()))?;
        let slots = Slots {
            base: u64::from(nq * RX_CHUNKS) * u64::from(CHUNK),
            chunks: slot_chunks,
            count: (TX_CHUNKS / slot_chunks) as usize,
        };
        let free_tx = (0..slots.count).map(|s| slots.addr(s)).collect();
        let zero_copy = xdp_zero_copy(queue_list[0].rx.as_raw_fd());
        Ok(XdpPort {
            info: PortInfo {
                mode: "xdp",
                queues: nq,
                attach: attach.into(),
                copy: if zero_copy { "zero-copy" } else { "copy" }.into(),
                max_frame: frame,
                offload: false,
            },
            queues: queue_list,
            tx,
            free_tx,
            slots,
            tx_out: vec![0; slots.count],
            tx_pending: Vec::with_capacity(TX_BATCH + MAX_BUFS),
            pipes,
            in_map: HashSet::new(),
            vteps,
            vtep: None,
            stats,
            c: PortCounters::default(),
            _bpf: bpf,
            _umem: umem,
            area,
        })
    }

    /// Takes completed transmissions back into the pool: a slot when the last descriptor of
    /// its frame is completed.
    fn complete(&mut self) {
        let slots = self.slots;
        let mut r = self.queues[0].dev.complete(RING);
        while let Some(addr) = r.read() {
            match slots.of(addr).map(|s| (s, &mut self.tx_out[s])) {
                Some((s, out)) if *out > 0 => {
                    *out -= 1;
                    if *out == 0 {
                        self.free_tx.push(slots.addr(s));
                        self.c.tx_completed += 1;
                    }
                }
                // (the kernel hands back only what it was given)
                _ => self.c.tx_bad_completion += 1,
            }
        }
        r.release();
    }

    fn kick_tx(&mut self) {
        if self.tx_pending.is_empty() {
            return;
        }
        // the ring reserves from a cached view of the kernel's consumer index and refreshes it
        // only when that view shows no room at all: ask again until all went in or none did.
        // What found no room waits for the next kick, in order (its frame's first descriptors
        // may be in the ring already: the kernel holds a frame until its last one comes). The
        // pool bounds what can wait.
        let mut done = 0;
        while done < self.tx_pending.len() {
            let mut w = self.tx.transmit((self.tx_pending.len() - done) as u32);
            let n = w.insert(self.tx_pending[done..].iter().copied()) as usize;
            w.commit();
            drop(w);
            if n == 0 {
                break;
            }
            done += n;
        }
        self.tx_pending.drain(..done);
        self.wake_tx();
    }

    /// Kicks the tx ring until the kernel took everything or stopped making progress (in copy
    /// mode one `sendto` takes at most 32 descriptors). True when nothing is left.
    fn wake_tx(&mut self) -> bool {
        for _ in 0..64 {
            let left = self.tx.pending();
            if left == 0 {
                return true;
            }
            if !self.tx.needs_wakeup() {
                // the driver works the ring by itself
                return false;
            }
            self.tx.wake();
            self.c.tx_kicks += 1;
            if self.tx.pending() == left {
                // the device is busy: try again next round
                return false;
            }
        }
        self.tx.pending() == 0
    }
}

/// A frame received in several buffers, gathered into one (at most `max` bytes).
#[derive(Debug)]
struct Gather {
    buf: Vec<u8>,
    max: usize,
    /// A buffer came that said more follow, and the frame's last has not.
    open: bool,
    /// The frame is refused (a buffer missing or past `max`): its bytes are not kept.
    bad: bool,
}

/// What a buffer given to [`Gather::push`] made.
#[derive(Debug, PartialEq)]
enum Gathered<'a> {
    /// The frame goes on.
    More,
    /// The frame is whole.
    Frame(&'a mut [u8]),
    /// The frame ended refused (it was too long, or one of its buffers could not be read).
    Refused,
}

impl Gather {
    fn new(max: usize) -> Gather {
        Gather {
            buf: Vec::new(),
            max,
            open: false,
            bad: false,
        }
    }

    /// Whether a frame is being gathered.
    fn open(&self) -> bool {
        self.open
    }

    /// Takes one buffer of a frame (`None`: one that could not be read); `more`: others
    /// follow. The frame returned lives until the next push.
    fn push(&mut self, bytes: Option<&[u8]>, more: bool) -> Gathered<'_> {
        if !self.open {
            self.buf.clear();
            self.bad = false;
        }
        match bytes {
            Some(b) if !self.bad && self.buf.len() + b.len() <= self.max => {
                self.buf.extend_from_slice(b)
            }
            _ => self.bad = true,
        }
        self.open = more;
        match (more, self.bad) {
            (true, _) => Gathered::More,
            (false, true) => Gathered::Refused,
            (false, false) => Gathered::Frame(&mut self.buf),
        }
    }
}

/// The transmit slots: `count` runs of `chunks` consecutive chunks from `base`.
#[derive(Debug, Clone, Copy)]
struct Slots {
    base: u64,
    chunks: u32,
    count: usize,
}

impl Slots {
    /// The slot holding the byte at `addr`, if it is in one.
    fn of(self, addr: u64) -> Option<usize> {
        let off = addr.checked_sub(self.base)?;
        let s = usize::try_from(off / u64::from(self.chunks * CHUNK)).ok()?;
        (s < self.count).then_some(s)
    }

    /// Where slot `s` starts.
    fn addr(self, s: usize) -> u64 {
        self.base + s as u64 * u64::from(self.chunks * CHUNK)
    }
}

/// Puts `chunks` in the fill ring; returns how many went in. (The ring reserves from a cached
/// view of the kernel's index, refreshed only when it shows no room: ask until done or full.)
fn fill(dev: &mut DeviceQueue, chunks: &[u64]) -> usize {
    let mut done = 0;
    while done < chunks.len() {
        let mut w = dev.fill((chunks.len() - done) as u32);
        let n = w.insert(chunks[done..].iter().copied()) as usize;
        w.commit();
        drop(w);
        if n == 0 {
            break;
        }
        done += n;
    }
    done
}

/// Whether the socket was bound zero-copy (XDP_OPTIONS).
fn xdp_zero_copy(fd: RawFd) -> bool {
    const SOL_XDP: libc::c_int = 283;
    const XDP_OPTIONS: libc::c_int = 8;
    const XDP_OPTIONS_ZEROCOPY: u32 = 1;
    let mut flags = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `flags`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            SOL_XDP,
            XDP_OPTIONS,
            (&mut flags as *mut u32).cast(),
            &mut len,
        )
    };
    rc == 0 && flags & XDP_OPTIONS_ZEROCOPY != 0
}

impl Port for XdpPort {
    fn info(&self) -> &PortInfo {
        &self.info
    }

    fn rx_ready(&self) -> bool {
        self.queues.iter().any(|q| q.rx.available() > 0)
    }

    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Rx<'_>)) -> usize {
        let mut n = 0;
        for q in &mut self.queues {
            if n >= max {
                break;
            }
            {
                let mut r = q.rx.receive((max - n) as u32);
                while let Some(d) = r.read() {
                    let chunk = d.addr & !u64::from(CHUNK - 1);
                    q.refill.push(chunk);
                    // the kernel keeps a buffer within its chunk; check anyway
                    let end = d.addr + u64::from(d.len);
                    // SAFETY: the chunk came back on the rx ring, so it is ours until it is
                    // put in the fill ring below; nothing else refers to it.
                    let bytes = (end <= chunk + u64::from(CHUNK))
                        .then(|| unsafe { self.area.bytes(d.addr, d.len as usize) })
                        .flatten();
                    let more = d.options & XDP_PKT_CONTD != 0;
                    let frame = if !more && !q.gather.open() {
                        // a frame in one buffer, read in place
                        bytes
                    } else {
                        // a buffer of a multi-buffer frame
                        match q.gather.push(bytes.as_deref(), more) {
                            Gathered::More => continue,
                            Gathered::Frame(frame) => Some(frame),
                            Gathered::Refused => None,
                        }
                    };
                    n += 1;
                    match frame {
                        Some(frame) => f(Rx {
                            frame,
                            csum_partial: false,
                            csum_valid: false,
                        }),
                        None => self.c.rx_bad_desc += 1,
                    }
                }
                r.release();
            }
            if !q.refill.is_empty() {
                // the fill ring holds every rx chunk, so there is always room; keep any rest
                let put = fill(&mut q.dev, &q.refill);
                q.refill.drain(..put);
            }
            if q.dev.needs_wakeup() {
                q.dev.wake();
            }
        }
        self.c.rx_frames += n as u64;
        n
    }

    fn send(&mut self, max_len: usize, fill: &mut super::Fill<'_>) -> bool {
        if self.free_tx.is_empty() {
            self.complete();
        }
        let Some(addr) = self.free_tx.pop() else {
            self.c.tx_ring_full += 1;
            return false;
        };
        // a slot's chunks are consecutive: the frame is written in place across them
        let cap = max_len.min(self.info.max_frame);
        // SAFETY: the chunk is in the free pool: not in any ring, so the kernel does not use
        // it, and no other reference to it exists.
        let Some(buf) = (unsafe { self.area.bytes(addr, cap) }) else {
            self.free_tx.push(addr);
            return false;
        };
        // (no offload: the edge asks for none from a port without it)
        let Some(len) = fill(buf)
            .filter(|(l, o)| *l <= cap && *l > 0 && *o == super::Offload::NONE)
            .map(|(l, _)| l)
        else {
            self.free_tx.push(addr);
            return false;
        };
        // one descriptor per chunk, all but the last saying more follow
        let bufs = len.div_ceil(CHUNK as usize);
        for i in 0..bufs {
            let at = i * CHUNK as usize;
            self.tx_pending.push(XdpDesc {
                addr: addr + at as u64,
                len: (len - at).min(CHUNK as usize) as u32,
                options: if i + 1 < bufs { XDP_PKT_CONTD } else { 0 },
            });
        }
        if let Some(s) = self.slots.of(addr) {
            self.tx_out[s] = bufs as u8;
        }
        self.c.tx_frames += 1;
        self.c.tx_bytes += len as u64;
        if self.tx_pending.len() >= TX_BATCH {
            self.kick_tx();
        }
        true
    }

    fn flush(&mut self) -> bool {
        self.kick_tx();
        let done = self.wake_tx();
        self.complete();
        done && self.tx_pending.is_empty()
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.queues
            .iter()
            // SAFETY: the socket's descriptor stays open while the queue (owned by `self`)
            // lives, which the borrow ties the result to.
            .map(|q| unsafe { BorrowedFd::borrow_raw(q.rx.as_raw_fd()) })
            .collect()
    }

    fn set_pipes(&mut self, ips: &[Ipv4Addr]) {
        let want: HashSet<u32> = ips
            .iter()
            .map(|ip| u32::from_ne_bytes(ip.octets()))
            .collect();
        for gone in self.in_map.difference(&want).copied().collect::<Vec<_>>() {
            let _ = self.pipes.remove(&gone);
            self.in_map.remove(&gone);
        }
        for new in want.difference(&self.in_map).copied().collect::<Vec<_>>() {
            match self.pipes.insert(new, 1, 0) {
                Ok(()) => {
                    self.in_map.insert(new);
                }
                Err(e) => tracing::warn!(
                    "flow director: cannot add {}: {e}",
                    Ipv4Addr::from(new.to_ne_bytes())
                ),
            }
        }
    }

    fn set_vtep(&mut self, addr: Option<Ipv4Addr>) {
        if addr == self.vtep {
            return;
        }
        if let Some(old) = self.vtep.take() {
            let _ = self.vteps.remove(&u32::from_ne_bytes(old.octets()));
        }
        if let Some(new) = addr {
            match self.vteps.insert(u32::from_ne_bytes(new.octets()), 1, 0) {
                Ok(()) => self.vtep = Some(new),
                Err(e) => tracing::warn!("flow director: cannot take VXLAN to {new}: {e}"),
            }
        }
    }

    fn counters(&mut self) -> PortCounters {
        let mut c = self.c;
        let sum = |k: u32| {
            self.stats
                .get(&k, 0)
                .map(|v| v.iter().sum::<u64>())
                .unwrap_or(0)
        };
        c.director_redirected = sum(0);
        c.director_passed = sum(1);
        c.director_no_socket = sum(2);
        for q in &self.queues {
            if let Ok(st) = q.user.statistics_v2() {
                c.xsk_rx_dropped += st.rx_dropped;
                c.xsk_rx_ring_full += st.rx_ring_full;
                c.xsk_fill_ring_empty += st.rx_fill_ring_empty_descs;
                c.xsk_tx_invalid += st.tx_invalid_descs;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_in_several_buffers_is_gathered_whole_and_the_next_starts_afresh() {
        let mut g = Gather::new(10);
        assert_eq!(g.push(Some(&[1, 2, 3]), true), Gathered::More);
        assert!(g.open());
        // (a later receive call goes on where the last left off)
        assert_eq!(g.push(Some(&[4]), true), Gathered::More);
        assert_eq!(
            g.push(Some(&[5, 6]), false),
            Gathered::Frame(&mut [1, 2, 3, 4, 5, 6])
        );
        assert!(!g.open());
        assert_eq!(g.push(Some(&[7]), true), Gathered::More);
        assert_eq!(g.push(Some(&[8]), false), Gathered::Frame(&mut [7, 8]));
    }

    #[test]
    fn a_frame_past_the_limit_or_with_an_unreadable_buffer_is_refused_whole() {
        let mut g = Gather::new(4);
        assert_eq!(g.push(Some(&[1, 2, 3]), true), Gathered::More);
        // past the limit: refused, and the rest of it with it
        assert_eq!(g.push(Some(&[4, 5]), true), Gathered::More);
        assert_eq!(g.push(Some(&[6]), false), Gathered::Refused);
        // the next frame is whole again
        assert_eq!(g.push(Some(&[1, 2]), true), Gathered::More);
        assert_eq!(
            g.push(Some(&[3, 4]), false),
            Gathered::Frame(&mut [1, 2, 3, 4])
        );
        // a buffer that could not be read refuses its frame, even a later good one
        assert_eq!(g.push(None, true), Gathered::More);
        assert_eq!(g.push(Some(&[1]), false), Gathered::Refused);
        // a frame's last buffer alone, unreadable
        assert_eq!(g.push(None, false), Gathered::Refused);
        assert_eq!(g.push(Some(&[9]), false), Gathered::Frame(&mut [9]));
    }

    #[test]
    fn a_slot_is_found_from_any_of_its_chunks_and_nothing_outside_the_pool_is() {
        let s = Slots {
            base: 8 * u64::from(CHUNK),
            chunks: 3,
            count: 4,
        };
        assert_eq!(s.addr(0), 8 * u64::from(CHUNK));
        assert_eq!(s.addr(1), 11 * u64::from(CHUNK));
        for s_ in 0..4 {
            for at in [0, 1, u64::from(CHUNK), 3 * u64::from(CHUNK) - 1] {
                assert_eq!(s.of(s.addr(s_) + at), Some(s_));
            }
        }
        // before the pool, and past its last slot
        assert_eq!(s.of(8 * u64::from(CHUNK) - 1), None);
        assert_eq!(s.of(s.addr(3) + 3 * u64::from(CHUNK)), None);
        assert_eq!(s.of(u64::MAX), None);
    }
}
