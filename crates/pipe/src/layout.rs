//! Region layout: the header, the ring table, and the check a region must pass before use.
//!
//! ```text
//!  offset 0                                                      one region = one file (dp.map / fc)
//!  ┌──────────────────────────── header (4 KiB) ─────────────────────────────┐
//!  │ 0   magic "DOCKPIPE" u64   8  version u32    12 kind u32 (1 pipe, 2 fc) │
//!  │ 16  region_size u64        24 nrings u32     28 flags u32 (bit0 closed) │
//!  │ 32  generation u32 (bumped when the pipe's fast channels change)        │
//!  │ 36  mtu u32   40 ip / ip_a u32   44 prefix / ip_b u32                   │
//!  │ 48  mac / mac_a u64           56 mac_b u64                              │
//!  │ 64  heartbeat u64: the daemon's CLOCK_MONOTONIC in ms, every 200 ms     │
//!  │ 128 ring table: nrings × {ctrl u64, descs u64, area u64, depth u32,     │
//!  │                            frame_size u32, area_len u64}      (40 B)    │
//!  │ 1024 counters: 64 × u64, mirrored by the daemon, never read back        │
//!  ├──────────────────────────── ring 0 control (384 B) ─────────────────────┤
//!  │ +0   prod  u32   written by the producer only      (own 128 B line)     │
//!  │ +128 cons  u32   written by the consumer only      (own 128 B line)     │
//!  │ +256 sleep u32   consumer's futex word: 1 = asleep, kick me             │
//!  ├──────────────────────────── ring 0 descriptors ─────────────────────────┤
//!  │ depth × {offset u32 (into the ring's area), len u32, flags u32, _ u32}  │
//!  ├──────────────────────────── ring 1 control + descriptors ───────────────┤
//!  ├──────────────────────────── ring 0 area: area_len bytes ───────────────┤
//!  ├──────────────────────────── ring 1 area: area_len bytes ───────────────┤
//!  └─────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! A pipe region has ring 0 = `tx` (container → daemon) and ring 1 = `rx` (daemon → container).
//! A fast-channel region has ring 0 = A → B and ring 1 = B → A, where A is the pipe with the
//! lower IP address. Indices run freely over `u32` and are masked with `depth - 1`; 128-byte
//! spacing keeps the producer's and the consumer's words off each other's (prefetched) lines.
//!
//! A ring's area is not cut into fixed slots: the producer lays frames end to end (each
//! starting on a 64-byte line), and a descriptor says where its frame is. `frame_size` is the
//! largest frame the ring carries and `area_len` the bytes of frames it holds at once, chosen
//! apart: a pipe carries TCP segments of up to 64 KiB within the host (as veth carries GSO
//! segments) in the area its MTU's frames need.

use crate::region::Region;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;

/// `b"DOCKPIPE"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"DOCKPIPE");
/// Layout version; bumped on any incompatible change.
pub const VERSION: u32 = 2;
/// Size of the header block.
pub const HEADER_SIZE: usize = 4096;

const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_KIND: usize = 12;
const H_SIZE: usize = 16;
const H_NRINGS: usize = 24;
const H_FLAGS: usize = 28;
/// Offset of the fast-channel generation word (a futex word containers may sleep on).
pub const GENERATION_OFF: usize = 32;
const H_GEN: usize = GENERATION_OFF;
const H_MTU: usize = 36;
const H_IP_A: usize = 40;
const H_IP_B: usize = 44;
const H_MAC_A: usize = 48;
const H_MAC_B: usize = 56;
/// Offset of the daemon's heartbeat: CLOCK_MONOTONIC in ms, rewritten every 200 ms.
pub const HEARTBEAT_OFF: usize = 64;
const H_RINGS: usize = 128;
const RING_ENTRY: usize = 40;
// Fields of one ring-table entry.
const RE_CTRL: usize = 0;
const RE_DESCS: usize = 8;
const RE_AREA: usize = 16;
const RE_DEPTH: usize = 24;
const RE_FRAME: usize = 28;
const RE_AREA_LEN: usize = 32;
/// Offset of the counter block (64 × u64).
pub const COUNTERS_OFF: usize = 1024;
/// Offset of a pipe's ephemeral-port word: the container's processes take their TCP and UDP
/// ports from it in turn (so a new process does not reuse a port a peer still holds in
/// TIME-WAIT). Written by the container only; the daemon never reads it.
pub const PORTS_OFF: usize = 2048;
/// Number of u64 counter slots in the header.
pub const MAX_COUNTERS: usize = 64;

/// Header flag: the region has been retired by the daemon (pipe or channel removed).
pub const FLAG_CLOSED: u32 = 1;

/// Bytes of a ring's control block.
pub const CTRL_SIZE: usize = 384;
/// Producer index word, from the start of a control block (written by the producer only).
pub const CTRL_PROD: usize = 0;
/// Consumer index word (written by the consumer only), 128 bytes from the producer's: the
/// adjacent-line prefetcher pairs 64-byte lines, so 128 keeps the two sides off each other's.
pub const CTRL_CONS: usize = 128;
/// Consumer's sleep (futex) word: 1 = asleep, kick me.
pub const CTRL_SLEEP: usize = 256;
/// Producer's space (futex) word: 1 = asleep on a full ring, kick me when a slot frees.
pub const CTRL_SPACE: usize = 260;
/// Bytes of one descriptor.
pub const DESC_SIZE: usize = 16;
/// Descriptor field: offset of the frame from the start of the ring's area (u32).
pub const DESC_OFFSET: usize = 0;
/// Descriptor field: frame length (u32).
pub const DESC_LEN: usize = 4;
/// Descriptor field: producer-defined flags (u32).
pub const DESC_FLAGS: usize = 8;
/// Descriptor field: sequence number, `index + 1`, written last with Release (u32).
pub const DESC_SEQ: usize = 12;
/// Ethernet header bytes (no VLAN tag), added to the MTU to get a frame's maximum length. The
/// one definition of the workspace: the daemon, DockLib and the benchmarks use it.
pub const ETH_HDR: usize = 14;
/// Smallest and largest accepted ring depth (powers of two).
pub const MIN_DEPTH: u32 = 2;
/// See [`MIN_DEPTH`].
pub const MAX_DEPTH: u32 = 65536;
/// Smallest and largest accepted frame slot size (multiples of 64).
pub const MIN_FRAME: u32 = 128;
/// See [`MIN_FRAME`]. Fits a 65535-byte IP packet plus its Ethernet header.
pub const MAX_FRAME: u32 = 65600;
/// Largest region accepted (1 GiB).
pub const MAX_REGION: usize = 1 << 30;

/// What a region is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A container's pipe: ring 0 tx, ring 1 rx.
    Pipe = 1,
    /// A fast channel between two pipes: ring 0 A→B, ring 1 B→A.
    FastChannel = 2,
}

/// Why a region was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The mapping is shorter than a header, or than the size the header claims.
    #[error("region too small: {len} bytes, need {need}")]
    TooSmall {
        /// Mapped bytes.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The magic number is wrong: not a DockPipe region.
    #[error("not a DockPipe region (bad magic)")]
    BadMagic,
    /// Made by an incompatible version.
    #[error("region layout version {found}, this build reads {VERSION}")]
    BadVersion {
        /// Version found in the header.
        found: u32,
    },
    /// Unknown region kind, or not the kind that was expected.
    #[error("region kind {found} is not the expected kind")]
    BadKind {
        /// Kind found in the header.
        found: u32,
    },
    /// A ring's parameters are out of range or its blocks fall outside the region.
    #[error("ring {ring} is malformed: {what}")]
    BadRing {
        /// Ring index in the table.
        ring: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// Requested parameters are out of range.
    #[error("invalid parameters: {0}")]
    BadParams(&'static str),
}

/// Where one ring lives inside its region. Offsets are absolute within the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Control block (prod, cons, sleep words).
    pub ctrl: usize,
    /// First descriptor.
    pub descs: usize,
    /// Start of the frame area.
    pub area: usize,
    /// Number of descriptors (a power of two): the most frames queued at once.
    pub depth: u32,
    /// The largest frame the ring carries.
    pub frame_size: u32,
    /// Bytes of the frame area (a multiple of 64, at least `frame_size`).
    pub area_len: usize,
}

impl RingLayout {
    /// Producer index word.
    pub fn prod_off(&self) -> usize {
        self.ctrl + CTRL_PROD
    }
    /// Consumer index word.
    pub fn cons_off(&self) -> usize {
        self.ctrl + CTRL_CONS
    }
    /// Consumer-sleeping futex word.
    pub fn sleep_off(&self) -> usize {
        self.ctrl + CTRL_SLEEP
    }
    /// Producer-waiting-for-space futex word.
    pub fn space_off(&self) -> usize {
        self.ctrl + CTRL_SPACE
    }
    /// Descriptor for free-running index `idx`.
    pub fn desc_off(&self, idx: u32) -> usize {
        self.descs + (idx & self.depth.wrapping_sub(1)) as usize * DESC_SIZE
    }
}

/// Parameters of one ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingParams {
    /// Number of descriptors, a power of two in `MIN_DEPTH..=MAX_DEPTH`.
    pub depth: u32,
    /// Largest frame, a multiple of 64 in `MIN_FRAME..=MAX_FRAME`.
    pub frame_size: u32,
    /// Bytes of the frame area, a multiple of 64, at least `frame_size`.
    pub area_len: usize,
}

impl RingParams {
    /// Defaults for an MTU: 1024 frames up to a 9000-byte MTU, 256 above (64 KiB frames); an
    /// area of `depth` frames of the MTU.
    pub fn for_mtu(mtu: u32, depth: Option<u32>) -> Result<RingParams, LayoutError> {
        if !(68..=65535).contains(&mtu) {
            return Err(LayoutError::BadParams("mtu must be within 68..=65535"));
        }
        let frame_size = ((mtu + ETH_HDR as u32).div_ceil(64) * 64).max(MIN_FRAME);
        let depth = depth.unwrap_or(if mtu <= 9000 { 1024 } else { 256 });
        let p = RingParams {
            depth,
            frame_size,
            area_len: depth as usize * frame_size as usize,
        };
        p.check()?;
        Ok(p)
    }

    /// A pipe's or a fast channel's rings: frames of up to 64 KiB ([`MAX_FRAME`]: TCP segments within the host,
    /// cut to the MTU where they leave it), in the area [`RingParams::for_mtu`] gives (at
    /// least three of the largest frames: a frame never ends exactly where the oldest queued
    /// one starts, so with two a second could not follow the first once the ring wrapped).
    pub fn offload(mtu: u32, depth: Option<u32>) -> Result<RingParams, LayoutError> {
        let base = RingParams::for_mtu(mtu, depth)?;
        let p = RingParams {
            frame_size: MAX_FRAME,
            area_len: base.area_len.max(3 * MAX_FRAME as usize),
            ..base
        };
        p.check()?;
        Ok(p)
    }

    /// Checks the parameters (depth, frame size, and that the ring fits a region).
    pub fn check(&self) -> Result<(), LayoutError> {
        if !self.depth.is_power_of_two() || !(MIN_DEPTH..=MAX_DEPTH).contains(&self.depth) {
            return Err(LayoutError::BadParams(
                "ring depth must be a power of two within 2..=65536",
            ));
        }
        if !self.frame_size.is_multiple_of(64)
            || !(MIN_FRAME..=MAX_FRAME).contains(&self.frame_size)
        {
            return Err(LayoutError::BadParams(
                "frame size must be a multiple of 64 within 128..=65600",
            ));
        }
        if !self.area_len.is_multiple_of(64) || self.area_len < self.frame_size as usize {
            return Err(LayoutError::BadParams(
                "frame area must be a multiple of 64 and hold the largest frame",
            ));
        }
        // A ring's area fits a region, so every offset in it fits a descriptor's u32.
        if self.area_len > MAX_REGION {
            return Err(LayoutError::BadParams("ring larger than a region"));
        }
        Ok(())
    }
}

/// Computes where two rings go and the total region size.
pub fn plan(rings: [RingParams; 2]) -> Result<([RingLayout; 2], usize), LayoutError> {
    let mut off = HEADER_SIZE;
    let mut out = [RingLayout {
        ctrl: 0,
        descs: 0,
        area: 0,
        depth: 0,
        frame_size: 0,
        area_len: 0,
    }; 2];
    for (o, p) in out.iter_mut().zip(rings.iter()) {
        p.check()?;
        o.ctrl = off;
        o.descs = off + CTRL_SIZE;
        o.depth = p.depth;
        o.frame_size = p.frame_size;
        o.area_len = p.area_len;
        off = o.descs + p.depth as usize * DESC_SIZE;
    }
    for o in out.iter_mut() {
        off = off.next_multiple_of(4096);
        o.area = off;
        off += o.area_len;
    }
    let size = off.next_multiple_of(4096);
    if size > MAX_REGION {
        return Err(LayoutError::BadParams("region would exceed 1 GiB"));
    }
    Ok((out, size))
}

/// Identity written into a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Pipe region: the pipe's IP and prefix length. Fast channel: endpoint A's IP (prefix unused).
    pub ip_a: Ipv4Addr,
    /// Pipe: prefix length. Fast channel: endpoint B's IP as u32.
    pub ip_b_or_prefix: u32,
    /// Pipe: its MAC. Fast channel: A's MAC.
    pub mac_a: [u8; 6],
    /// Fast channel: B's MAC (zero for a pipe).
    pub mac_b: [u8; 6],
    /// MTU of the link.
    pub mtu: u32,
}

/// A region's header, parsed and checked. After [`RegionInfo::parse`] succeeds, every ring
/// offset lies inside the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// What the region is.
    pub kind: Kind,
    /// Size the header claims (checked against the mapping).
    pub size: usize,
    /// Identity fields.
    pub id: Identity,
    /// The two rings.
    pub rings: [RingLayout; 2],
}

fn mac_to_u64(m: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&m);
    u64::from_le_bytes(b)
}

fn u64_to_mac(v: u64) -> [u8; 6] {
    let b = v.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

// Header words are published with Release and read with Acquire (the magic, written last,
// orders the rest).
fn ld32(r: &Region, off: usize) -> u32 {
    r.load_u32(off, Ordering::Acquire)
}
fn ld64(r: &Region, off: usize) -> u64 {
    r.load_u64(off, Ordering::Acquire)
}
fn st32(r: &Region, off: usize, v: u32) {
    r.store_u32(off, v, Ordering::Release)
}
fn st64(r: &Region, off: usize, v: u64) {
    r.store_u64(off, v, Ordering::Release)
}

/// Writes a fresh header and ring table into `region` (which must be zeroed and at least the
/// planned size). The magic is written last, so a reader never accepts a half-written header.
pub fn init(
    region: &Region,
    kind: Kind,
    id: Identity,
    rings: [RingLayout; 2],
    size: usize,
) -> Result<(), LayoutError> {
    if region.len() < size {
        return Err(LayoutError::TooSmall {
            len: region.len(),
            need: size,
        });
    }
    st32(region, H_VERSION, VERSION);
    st32(region, H_KIND, kind as u32);
    st64(region, H_SIZE, size as u64);
    st32(region, H_NRINGS, 2);
    st32(region, H_FLAGS, 0);
    st32(region, H_GEN, 0);
    st32(region, H_MTU, id.mtu);
    st32(region, H_IP_A, u32::from(id.ip_a));
    st32(region, H_IP_B, id.ip_b_or_prefix);
    st64(region, H_MAC_A, mac_to_u64(id.mac_a));
    st64(region, H_MAC_B, mac_to_u64(id.mac_b));
    for (i, r) in rings.iter().enumerate() {
        let e = H_RINGS + i * RING_ENTRY;
        st64(region, e + RE_CTRL, r.ctrl as u64);
        st64(region, e + RE_DESCS, r.descs as u64);
        st64(region, e + RE_AREA, r.area as u64);
        st32(region, e + RE_DEPTH, r.depth);
        st32(region, e + RE_FRAME, r.frame_size);
        st64(region, e + RE_AREA_LEN, r.area_len as u64);
    }
    // SYNC: Release pairs with the Acquire load of the magic in `parse`.
    st64(region, H_MAGIC, MAGIC);
    Ok(())
}

impl RegionInfo {
    /// The layout a region of `kind` with this identity and ring depth has: computed, never
    /// read from a region (whose header the other side can write). Returns it with the
    /// region's size. The rings carry 64 KiB frames ([`RingParams::offload`]).
    pub fn planned(kind: Kind, id: Identity, depth: u32) -> Result<RegionInfo, LayoutError> {
        let p = RingParams::offload(id.mtu, Some(depth))?;
        let (rings, size) = plan([p, p])?;
        Ok(RegionInfo {
            kind,
            size,
            id,
            rings,
        })
    }

    /// Reads and checks the header of `region`, expecting `kind`.
    pub fn parse(region: &Region, kind: Kind) -> Result<RegionInfo, LayoutError> {
        let len = region.len();
        if len < HEADER_SIZE {
            return Err(LayoutError::TooSmall {
                len,
                need: HEADER_SIZE,
            });
        }
        if ld64(region, H_MAGIC) != MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let version = ld32(region, H_VERSION);
        if version != VERSION {
            return Err(LayoutError::BadVersion { found: version });
        }
        let k = ld32(region, H_KIND);
        if k != kind as u32 {
            return Err(LayoutError::BadKind { found: k });
        }
        let size = usize::try_from(ld64(region, H_SIZE)).unwrap_or(usize::MAX);
        if size > len || size < HEADER_SIZE {
            return Err(LayoutError::TooSmall { len, need: size });
        }
        if ld32(region, H_NRINGS) != 2 {
            return Err(LayoutError::BadRing {
                ring: 0,
                what: "ring count is not 2",
            });
        }
        let mut rings = [RingLayout {
            ctrl: 0,
            descs: 0,
            area: 0,
            depth: 0,
            frame_size: 0,
            area_len: 0,
        }; 2];
        for (i, r) in rings.iter_mut().enumerate() {
            let e = H_RINGS + i * RING_ENTRY;
            let as_off = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
            *r = RingLayout {
                ctrl: as_off(ld64(region, e + RE_CTRL)),
                descs: as_off(ld64(region, e + RE_DESCS)),
                area: as_off(ld64(region, e + RE_AREA)),
                depth: ld32(region, e + RE_DEPTH),
                frame_size: ld32(region, e + RE_FRAME),
                area_len: as_off(ld64(region, e + RE_AREA_LEN)),
            };
            let bad = |what| LayoutError::BadRing { ring: i, what };
            RingParams {
                depth: r.depth,
                frame_size: r.frame_size,
                area_len: r.area_len,
            }
            .check()
            .map_err(|_| bad("depth, frame size or area out of range"))?;
            let inside = |off: usize, n: usize| {
                off >= HEADER_SIZE && off.checked_add(n).is_some_and(|end| end <= size)
            };
            if r.ctrl % 128 != 0 || !inside(r.ctrl, CTRL_SIZE) {
                return Err(bad("control block outside the region"));
            }
            if r.descs % DESC_SIZE != 0 || !inside(r.descs, r.depth as usize * DESC_SIZE) {
                return Err(bad("descriptors outside the region"));
            }
            if r.area % 64 != 0 || !inside(r.area, r.area_len) {
                return Err(bad("frame area outside the region"));
            }
        }
        Ok(RegionInfo {
            kind,
            size,
            id: Identity {
                ip_a: Ipv4Addr::from(ld32(region, H_IP_A)),
                ip_b_or_prefix: ld32(region, H_IP_B),
                mac_a: u64_to_mac(ld64(region, H_MAC_A)),
                mac_b: u64_to_mac(ld64(region, H_MAC_B)),
                mtu: ld32(region, H_MTU),
            },
            rings,
        })
    }
}

/// Header flags (see [`FLAG_CLOSED`]).
pub fn flags(region: &Region) -> u32 {
    ld32(region, H_FLAGS)
}

/// Sets header flag bits.
pub fn set_flags(region: &Region, bits: u32) {
    if let Some(a) = region.u32_at(H_FLAGS) {
        a.fetch_or(bits, Ordering::AcqRel);
    }
}

/// The fast-channel generation of a pipe region: changes whenever its channels change.
pub fn generation(region: &Region) -> u32 {
    ld32(region, H_GEN)
}

/// Bumps the fast-channel generation (daemon side), and kicks the pipe's endpoint if it sleeps
/// on its receive ring (`rx`: the ring the daemon produces into), as a frame would: a new fast
/// channel's ring is not among the words it armed, so its partner's kicks would not reach it.
/// An endpoint checks the generation after arming its receive ring, so one of the two sides
/// sees the other's change (a fence on each side), and it sleeps on one word less.
pub fn bump_generation(region: &Region, rx: &RingLayout) {
    if let Some(a) = region.u32_at(H_GEN) {
        a.fetch_add(1, Ordering::SeqCst);
        // (threads asleep on the generation word itself are woken too)
        crate::wake::wake(a);
    }
    // SYNC: SeqCst fence between the store of the generation and the load of the sleep word;
    // pairs with the fence in `Consumer::arm` before the endpoint's load of the generation.
    std::sync::atomic::fence(Ordering::SeqCst);
    if let Some(sleep) = region.u32_at(rx.sleep_off()) {
        crate::wake::kick_if_armed(sleep);
    }
}

/// Writes the daemon's heartbeat (CLOCK_MONOTONIC, ms).
pub fn set_heartbeat(region: &Region, ms: u64) {
    st64(region, HEARTBEAT_OFF, ms);
}

/// The last heartbeat written by the daemon (0: never).
pub fn heartbeat(region: &Region) -> u64 {
    ld64(region, HEARTBEAT_OFF)
}

/// Mirrors counter `idx` into the header's counter block (daemon side; informational only).
pub fn mirror_counter(region: &Region, idx: usize, value: u64) {
    if idx < MAX_COUNTERS {
        region.store_u64(COUNTERS_OFF + idx * 8, value, Ordering::Relaxed);
    }
}

/// Reads mirrored counter `idx` (container side).
pub fn mirrored_counter(region: &Region, idx: usize) -> u64 {
    if idx < MAX_COUNTERS {
        ld64(region, COUNTERS_OFF + idx * 8)
    } else {
        0
    }
}

/// The ephemeral-port word of a pipe region ([`PORTS_OFF`]).
pub fn port_word(region: &Region) -> Option<&std::sync::atomic::AtomicU32> {
    region.u32_at(PORTS_OFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The identity of the test pipe (10.0.0.1/24) at `mtu`.
    fn pipe_id(mtu: u32) -> Identity {
        Identity {
            ip_a: Ipv4Addr::new(10, 0, 0, 1),
            ip_b_or_prefix: 24,
            mac_a: [2, 0xdc, 10, 0, 0, 1],
            mac_b: [0; 6],
            mtu,
        }
    }

    pub(super) fn pipe_region(mtu: u32) -> (Region, RegionInfo) {
        let p = RingParams::for_mtu(mtu, None).unwrap();
        let (rings, size) = plan([p, p]).unwrap();
        let r = Region::anonymous(size).unwrap();
        init(&r, Kind::Pipe, pipe_id(mtu), rings, size).unwrap();
        let info = RegionInfo::parse(&r, Kind::Pipe).unwrap();
        (r, info)
    }

    #[test]
    fn roundtrip_and_defaults() {
        let (_r, info) = pipe_region(1500);
        assert_eq!(info.rings[0].frame_size, 1536);
        assert_eq!(info.rings[0].depth, 1024);
        assert_eq!(info.id.ip_a, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(info.id.mac_a, [2, 0xdc, 10, 0, 0, 1]);
        let (_r, big) = pipe_region(65535);
        assert_eq!(big.rings[0].frame_size, 65600);
        assert_eq!(big.rings[0].depth, 256);
    }

    #[test]
    fn a_pipe_carries_64_kib_frames_in_the_area_of_its_mtu() {
        let p = RingParams::offload(1500, None).unwrap();
        assert_eq!(p.frame_size, MAX_FRAME);
        assert_eq!(p.area_len, 1024 * 1536);
        // a shallow ring of a small MTU still holds three of the largest frames
        let small = RingParams::offload(1500, Some(4)).unwrap();
        assert_eq!(small.area_len, 3 * MAX_FRAME as usize);
        let pipe = RegionInfo::planned(Kind::Pipe, pipe_id(1500), 1024).unwrap();
        assert_eq!(pipe.rings[1].frame_size, MAX_FRAME);
        let fixed = RingParams::for_mtu(1500, Some(1024)).unwrap();
        assert_eq!(fixed.frame_size, 1536);
        assert_eq!(
            pipe.size,
            plan([fixed, fixed]).unwrap().1,
            "the memory of 1500-byte frames"
        );
    }

    #[test]
    fn the_largest_legal_geometry_stays_in_range() {
        // the deepest ring of the largest frames that fits a region
        let big = RingParams {
            depth: 1 << 13,
            frame_size: MAX_FRAME,
            area_len: (1 << 13) * MAX_FRAME as usize,
        };
        assert!(big.check().is_ok());
        assert!(u32::try_from(big.area_len).is_ok());
        let too_big = RingParams {
            depth: MAX_DEPTH,
            frame_size: MAX_FRAME,
            area_len: MAX_DEPTH as usize * MAX_FRAME as usize,
        };
        assert!(too_big.check().is_err(), "65536 x 65600 overflows u32");
        let too_small = RingParams {
            area_len: MAX_FRAME as usize - 64,
            ..big
        };
        assert!(
            too_small.check().is_err(),
            "an area that cannot hold a frame"
        );
        let unaligned = RingParams {
            area_len: MAX_FRAME as usize + 1,
            ..big
        };
        assert!(unaligned.check().is_err());
    }

    #[test]
    fn rejects_bad_params() {
        assert!(RingParams::for_mtu(67, None).is_err());
        assert!(RingParams::for_mtu(65536, None).is_err());
        assert!(RingParams::for_mtu(1500, Some(1000)).is_err());
        assert!(RingParams::for_mtu(1500, Some(1 << 17)).is_err());
    }

    #[test]
    fn rejects_corrupt_headers() {
        let (r, _) = pipe_region(1500);
        assert_eq!(
            RegionInfo::parse(&r, Kind::FastChannel),
            Err(LayoutError::BadKind { found: 1 })
        );
        // ring 1's area pointed past the end
        st64(&r, H_RINGS + RING_ENTRY + RE_AREA, r.len() as u64);
        assert!(matches!(
            RegionInfo::parse(&r, Kind::Pipe),
            Err(LayoutError::BadRing { ring: 1, .. })
        ));
        // a size larger than the mapping
        st64(&r, H_SIZE, u64::MAX);
        assert!(matches!(
            RegionInfo::parse(&r, Kind::Pipe),
            Err(LayoutError::TooSmall { .. })
        ));
        st64(&r, H_MAGIC, 0);
        assert_eq!(
            RegionInfo::parse(&r, Kind::Pipe),
            Err(LayoutError::BadMagic)
        );
    }

    #[test]
    fn header_scribbled_with_random_bytes_never_panics() {
        let (r, _) = pipe_region(1500);
        let mut x = 0x9e3779b97f4a7c15u64;
        for round in 0..2000 {
            for off in (0..HEADER_SIZE).step_by(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // keep the magic/version/kind sometimes so deeper checks get exercised
                if round % 2 == 0 && off < 16 {
                    continue;
                }
                st64(&r, off, x);
            }
            if let Ok(info) = RegionInfo::parse(&r, Kind::Pipe) {
                for ring in info.rings {
                    assert!(ring.area + ring.area_len <= r.len());
                }
            }
        }
    }
}

#[cfg(test)]
mod generation_tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_bump_wakes_a_thread_asleep_on_the_generation_or_on_the_receive_ring() {
        let (r, info) = super::tests::pipe_region(1500);
        let r = std::sync::Arc::new(r);
        // one asleep on the generation word
        let before = generation(&r);
        let r2 = r.clone();
        let sleeper = std::thread::spawn(move || {
            let t = Instant::now();
            let w = r2.u32_at(GENERATION_OFF).unwrap();
            let _ = crate::wake::wait_any(&[(w, before)], Some(Duration::from_secs(5)));
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        bump_generation(&r, &info.rings[1]);
        let slept = sleeper.join().unwrap();
        assert_eq!(generation(&r), before.wrapping_add(1));
        assert!(slept < Duration::from_secs(2), "slept {slept:?}: not woken");
        // one asleep on its receive ring alone, as DockLib's endpoints sleep
        let before = generation(&r);
        let (r2, rx) = (r.clone(), info.rings[1]);
        let sleeper = std::thread::spawn(move || {
            let mut c = crate::ring::Consumer::adopt(&r2, rx);
            assert!(!c.arm(&r2), "nothing was queued");
            let t = Instant::now();
            if generation(&r2) == before {
                let w = c.sleep_word(&r2).unwrap();
                let _ = crate::wake::wait_any(&[(w, 1)], Some(Duration::from_secs(5)));
            }
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        bump_generation(&r, &info.rings[1]);
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_secs(2), "slept {slept:?}: not woken");
    }
}
