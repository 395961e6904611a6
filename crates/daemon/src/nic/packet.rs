//! The AF_PACKET port: the fallback that works on any link. Frames arrive through a
//! memory-mapped TPACKET_V2 receive ring and leave with `sendmmsg`, batched per round.
//!
//! Why V2 and not V3: a V3 ring hands frames over a block at a time, when the block fills or its
//! retire timer (whole milliseconds) fires, and wakes the reader only then; a request/response
//! exchange on a quiet link would wait for the timer on every hop. V2 hands over each frame as
//! it lands and wakes the reader per frame.
//!
//! A packet socket sees every frame on the link, also the host's own traffic (it is a tap, not
//! a diversion): frames for the pipes are taken, the rest ignored here, and the host's kernel
//! still receives its copy of everything. Its copy of a frame addressed to a pipe is dropped at
//! the link's ingress hook by the daemon's guard ([`super::guard`]); without it a host with
//! forwarding on routed that copy on. Transmission goes through the link's queueing discipline
//! like any socket's.
//!
//! Segment offload: the socket asks for `PACKET_VNET_HDR`, so every frame it sends starts with a
//! virtio-net header ([`super::offload`]) and a TCP segment of up to 64 KiB leaves whole, cut by
//! the NIC (TSO) or by the kernel at the last moment (GSO); and frames the kernel coalesced
//! (GRO), or a TSO sender's whole segments on a virtual link, arrive whole. Every frame of the
//! receive ring then holds 64 KiB, so the ring has fewer of them (480, in 32 MiB). A kernel that
//! refuses the option gets a port without offload, frames of the link's MTU.

#![allow(unsafe_code)]

use super::link::LinkInfo;
use super::offload::{Offload, VNET_HDR_LEN};
use super::{Fill, NicError, Port, PortCounters, PortInfo, Rx};
use docknet_pipe::region::KernelSrc;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Frames in the receive ring (without offload: frames of the link's MTU).
const RX_FRAMES: u32 = 2048;
/// With offload, the receive ring's bytes and its blocks (frames of 64 KiB, 15 a block).
const RX_LARGE_BYTES: usize = 32 << 20;
const RX_LARGE_BLOCK: usize = 1 << 20;
/// Frames sent per `sendmmsg` at most.
const TX_BATCH: usize = 64;
/// Large frames a send batch holds at least.
const TX_LARGE: usize = 4;
/// `PACKET_VNET_HDR` (linux/if_packet.h).
const PACKET_VNET_HDR: libc::c_int = 15;

/// The AF_PACKET port.
#[derive(Debug)]
pub struct PacketPort {
    info: PortInfo,
    fd: OwnedFd,
    ring: NonNull<u8>,
    ring_len: usize,
    frame_size: usize,
    /// Bytes of a block of the ring and frames in each (frames do not cross blocks, and a
    /// block may end in a gap no frame fills).
    block_size: usize,
    per_block: usize,
    blocks: usize,
    next: u32,
    /// Frames queued for the next `sendmmsg`, each with its virtio-net header when the port
    /// offloads, laid end to end (64-byte aligned).
    tx_buf: Vec<u8>,
    /// (offset, length) of each queued frame in `tx_buf`.
    tx_lens: Vec<(usize, usize)>,
    /// Bytes of `tx_buf` in use.
    tx_used: usize,
    /// Bytes of header before each frame sent: [`VNET_HDR_LEN`] with offload, else 0.
    vnet: usize,
    c: PortCounters,
}

// SAFETY: the port owns its socket and ring mapping; it is moved once into the master thread
// and used only there.
unsafe impl Send for PacketPort {}

fn last(what: &str) -> NicError {
    NicError::Setup(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, v: &T) -> libc::c_int {
    // SAFETY: `v` is a valid T for the call; the kernel reads size_of::<T>() bytes of it.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    }
}

impl PacketPort {
    /// Opens a packet socket on `link` with a receive ring for frames up to the link's MTU.
    pub fn open(link: &LinkInfo) -> Result<PacketPort, NicError> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // protocol 0: nothing is received until the bind below names the link and ETH_P_ALL
        // SAFETY: plain socket(2); the result is checked before it is owned.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(last("opening a packet socket"));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        if setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &version) < 0 {
            return Err(last("PACKET_VERSION"));
        }
        let one: libc::c_int = 1;
        // our own transmissions are not to be received again
        if setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one) < 0 {
            return Err(last("PACKET_IGNORE_OUTGOING"));
        }
        // (before the ring: the kernel refuses it after)
        let offload = setsockopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, &one) == 0;
        if !offload {
            tracing::warn!(
                "{}: the kernel refused PACKET_VNET_HDR ({}): no segment offload, every frame \
                 within the MTU",
                link.name,
                std::io::Error::last_os_error()
            );
        }
        let vnet = if offload { VNET_HDR_LEN } else { 0 };
        let max_frame = if offload {
            usize::from(u16::MAX) + super::wire::ETH
        } else {
            link.mtu as usize + super::wire::ETH
        };
        // header, address, alignment, the virtio-net header, then the frame
        let (frame_size, block_size, blocks) = if offload {
            let frame_size = (libc::TPACKET2_HDRLEN + 64 + vnet + max_frame).next_multiple_of(16);
            (frame_size, RX_LARGE_BLOCK, RX_LARGE_BYTES / RX_LARGE_BLOCK)
        } else {
            let frame_size = (libc::TPACKET2_HDRLEN + 64 + max_frame)
                .next_power_of_two()
                .max(2048);
            let block_size = frame_size.max(1 << 16);
            let blocks = (RX_FRAMES as usize).div_ceil(block_size / frame_size);
            (frame_size, block_size, blocks)
        };
        let per_block = block_size / frame_size;
        let req = libc::tpacket_req {
            tp_block_size: block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: (blocks * per_block) as u32,
        };
        if setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req) < 0 {
            return Err(last("PACKET_RX_RING"));
        }
        let ring_len = block_size * blocks;
        // SAFETY: maps the ring the kernel just set up for this socket.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last("mapping the packet ring"));
        }
        let ring = NonNull::new(p.cast::<u8>()).ok_or_else(|| last("mapping the packet ring"))?;
        // SAFETY: sockaddr_ll is plain old data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = link.index as i32;
        // SAFETY: binds with a valid sockaddr_ll of the stated size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        let port = PacketPort {
            info: PortInfo {
                mode: "packet",
                queues: 1,
                attach: "-".into(),
                copy: "copy".into(),
                max_frame,
                offload,
            },
            fd,
            ring,
            ring_len,
            frame_size,
            block_size,
            per_block,
            blocks,
            next: 0,
            tx_buf: vec![
                0;
                (TX_BATCH
                    * (vnet + link.mtu as usize + super::wire::ETH).next_multiple_of(64))
                .max(TX_LARGE * (vnet + max_frame).next_multiple_of(64))
            ],
            tx_lens: Vec::with_capacity(TX_BATCH),
            tx_used: 0,
            vnet,
            c: PortCounters::default(),
        };
        if rc < 0 {
            return Err(last(&format!("binding to {}", link.name)));
        }
        Ok(port)
    }

    fn frames(&self) -> u32 {
        (self.per_block * self.blocks) as u32
    }

    /// Where frame `i` (< `frames()`) starts in the mapping.
    fn frame_at(&self, i: u32) -> usize {
        let i = i as usize;
        i / self.per_block * self.block_size + i % self.per_block * self.frame_size
    }

    /// The status word of frame `i`.
    fn status(&self, i: u32) -> &AtomicU32 {
        // SAFETY: frame `i` < frames() starts inside the mapping, 16-byte aligned, with
        // tp_status as its first u32; the kernel and we access it atomically.
        unsafe { &*self.ring.as_ptr().add(self.frame_at(i)).cast::<AtomicU32>() }
    }

    /// Sends `msgs` (`sendmmsg`, again after an interruption) and returns how many left; the
    /// rest are dropped and counted (the queue is full, or the link went away).
    ///
    /// # Safety
    ///
    /// Every message's iovecs name memory alive and readable for the call.
    unsafe fn send_msgs(&mut self, msgs: &mut [libc::mmsghdr]) -> usize {
        let (n, mut done) = (msgs.len(), 0);
        while done < n {
            // SAFETY: msgs[done..] are valid messages whose iovecs the caller vouches for.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr().add(done),
                    (n - done) as u32,
                    0,
                )
            };
            if rc <= 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                self.c.tx_ring_full += (n - done) as u64;
                break;
            }
            done += rc as usize;
        }
        done
    }

    fn send_batch(&mut self) {
        if self.tx_lens.is_empty() {
            return;
        }
        let n = self.tx_lens.len();
        let base = self.tx_buf.as_mut_ptr();
        let mut iov: Vec<libc::iovec> = self
            .tx_lens
            .iter()
            .map(|&(off, len)| libc::iovec {
                // SAFETY: `send` placed every frame inside tx_buf (off + len <= its length).
                iov_base: unsafe { base.add(off) }.cast(),
                iov_len: len,
            })
            .collect();
        // SAFETY: mmsghdr is plain old data.
        let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every message names one iovec into tx_buf, alive for the call.
        unsafe { self.send_msgs(&mut msgs) };
        self.tx_lens.clear();
        self.tx_used = 0;
    }
}

impl Drop for PacketPort {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.ring.as_ptr().cast(), self.ring_len) };
    }
}

impl Port for PacketPort {
    fn info(&self) -> &PortInfo {
        &self.info
    }

    fn rx_ready(&self) -> bool {
        self.status(self.next).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Rx<'_>)) -> usize {
        let mut n = 0;
        let frames = self.frames();
        while n < max {
            let st = self.status(self.next).load(Ordering::Acquire);
            if st & libc::TP_STATUS_USER == 0 {
                break;
            }
            let base = self.frame_at(self.next);
            // SAFETY: the frame's header lies at its start, inside the mapping; the kernel
            // handed the frame to us (TP_STATUS_USER) and does not write it until we hand it back.
            let hdr = unsafe { &*self.ring.as_ptr().add(base).cast::<libc::tpacket2_hdr>() };
            let (mac, len) = (hdr.tp_mac as usize, hdr.tp_snaplen as usize);
            if mac + len <= self.frame_size && len <= hdr.tp_len as usize {
                // SAFETY: bounds checked just above against the frame, which is ours.
                let frame = unsafe {
                    std::slice::from_raw_parts_mut(self.ring.as_ptr().add(base + mac), len)
                };
                f(Rx {
                    frame,
                    csum_partial: st & libc::TP_STATUS_CSUMNOTREADY != 0,
                    csum_valid: st & libc::TP_STATUS_CSUM_VALID != 0,
                });
            } else {
                self.c.rx_bad_desc += 1;
            }
            if st & libc::TP_STATUS_LOSING != 0 {
                self.c.rx_ring_losing += 1;
            }
            self.status(self.next)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % frames;
            n += 1;
        }
        self.c.rx_frames += n as u64;
        n
    }

    fn send(&mut self, max_len: usize, fill: &mut Fill<'_>) -> bool {
        let cap = max_len.min(self.info.max_frame);
        if self.tx_lens.len() >= TX_BATCH || self.tx_used + self.vnet + cap > self.tx_buf.len() {
            self.send_batch();
        }
        let at = self.tx_used;
        let Some(buf) = self.tx_buf.get_mut(at + self.vnet..at + self.vnet + cap) else {
            return false;
        };
        let offload = self.vnet > 0;
        let Some((len, o)) =
            fill(buf).filter(|&(l, o)| l <= cap && l > 0 && (offload || o == Offload::NONE))
        else {
            return false;
        };
        if offload {
            self.tx_buf[at..at + VNET_HDR_LEN].copy_from_slice(&o.vnet_hdr());
        }
        self.tx_lens.push((at, self.vnet + len));
        self.tx_used = (at + self.vnet + len).next_multiple_of(64);
        self.c.tx_frames += 1;
        self.c.tx_bytes += len as u64;
        true
    }

    fn send_split(&mut self, head: &[u8], tail: KernelSrc<'_>, o: Offload) -> bool {
        if self.vnet == 0 || head.is_empty() || head.len() + tail.len() > self.info.max_frame {
            return false;
        }
        // what was queued before leaves first
        self.send_batch();
        let vnet = o.vnet_hdr();
        let mut iov = [
            libc::iovec {
                iov_base: vnet.as_ptr().cast_mut().cast(),
                iov_len: vnet.len(),
            },
            libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head.len(),
            },
            tail.iovec(),
        ];
        // SAFETY: mmsghdr is plain old data.
        let mut msg: libc::mmsghdr = unsafe { std::mem::zeroed() };
        msg.msg_hdr.msg_iov = iov.as_mut_ptr();
        msg.msg_hdr.msg_iovlen = iov.len();
        // SAFETY: the iovecs name `vnet` and `head` (alive for the call) and the bytes of a
        // mapped region `tail` borrows; the kernel only reads them.
        self.c.tx_split += unsafe { self.send_msgs(std::slice::from_mut(&mut msg)) } as u64;
        // (counted as queued, as the batch counts its frames)
        self.c.tx_frames += 1;
        self.c.tx_bytes += (head.len() + tail.len()) as u64;
        true
    }

    fn flush(&mut self) -> bool {
        self.send_batch();
        true
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.fd.as_fd()]
    }

    fn set_pipes(&mut self, _ips: &[Ipv4Addr]) {}

    fn set_vtep(&mut self, _addr: Option<Ipv4Addr>) {}

    fn counters(&mut self) -> PortCounters {
        self.c
    }
}
