//! Single-producer single-consumer descriptor rings over a [`Region`].
//!
//! Each side keeps its own index locally and treats that copy as the truth; the shared word is
//! only a publication to the other side. A descriptor's last word is its sequence number
//! (`index + 1`), written last: the consumer polls that word, so a new frame costs it one cache
//! line transfer (the descriptor's) instead of two (the producer index, then the descriptor);
//! the slot's line is touched at the same time, so its transfer overlaps. The index written by the *other* side is read,
//! checked against what is possible (`prod - cons <= depth`), and ignored and counted when it
//! is not. Descriptors are copied out of shared memory once, then validated
//! ([`Descriptor::validate`]); only a validated [`Frame`] is ever used to touch frame bytes.
//!
//! Call order, producer: `reserve` → write the frame at the slot → `commit` (repeat) →
//! `publish` once per batch. Consumer: `pop` (repeat, using each frame before the next
//! `release`) → `release` once per batch.
//!
//! The producer lays frames end to end in the ring's area, each on a 64-byte line, and starts
//! again at the beginning when the next does not fit before the end; frames are released in
//! order, so the free bytes are one run (or two, around the end). Where each queued frame
//! starts is kept on the producer's side, never read back from shared memory, so a consumer
//! can only make room by releasing frames (its index is checked like any other).

use crate::layout::{RingLayout, DESC_FLAGS, DESC_LEN, DESC_OFFSET, DESC_SEQ, DESC_SIZE};
use crate::region::Region;
use crate::wake;
use std::sync::atomic::{fence, Ordering};

/// A descriptor as read from shared memory: not yet trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// Offset of the frame from the start of the ring's area.
    pub offset: u32,
    /// Frame length in bytes.
    pub len: u32,
    /// Producer-defined flags (opaque to the ring).
    pub flags: u32,
}

/// A frame whose descriptor passed validation: `off..off + len` lies inside the ring's area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Absolute offset of the first byte within the region.
    pub off: usize,
    /// Length in bytes, `1..=frame_size`.
    pub len: usize,
    /// Flags from the descriptor.
    pub flags: u32,
}

/// Why a descriptor was refused. Each variant has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadDescriptor {
    /// Offset or offset + length falls outside the ring's frame area.
    #[error("descriptor points outside the frame area")]
    OutOfBounds,
    /// Zero-length frame.
    #[error("zero-length descriptor")]
    ZeroLength,
    /// Longer than the ring's frame size.
    #[error("descriptor longer than the frame size")]
    Oversize,
    /// The producer's index announces the frame but the descriptor's sequence number does not
    /// (an honest producer writes the sequence number before publishing the index).
    #[error("descriptor sequence number does not match its index")]
    Sequence,
}

impl Descriptor {
    /// Checks the descriptor against the ring it was read from.
    pub fn validate(&self, ring: &RingLayout) -> Result<Frame, BadDescriptor> {
        if self.len == 0 {
            return Err(BadDescriptor::ZeroLength);
        }
        if self.len > ring.frame_size {
            return Err(BadDescriptor::Oversize);
        }
        let end = self.offset as usize + self.len as usize;
        if end > ring.area_len {
            return Err(BadDescriptor::OutOfBounds);
        }
        Ok(Frame {
            off: ring.area + self.offset as usize,
            len: self.len as usize,
            flags: self.flags,
        })
    }
}

/// Counters kept by one side of one ring. Plain integers: one owner, read by its owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Frames moved.
    pub frames: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors refused as out of bounds or zero length.
    pub bad_desc: u64,
    /// Descriptors refused as longer than the frame size.
    pub oversize: u64,
    /// Times the other side's index was impossible (a corrupted or hostile peer).
    pub ring_overrun: u64,
    /// Producer: frames refused because the ring was full. Consumer: unused.
    pub full: u64,
    /// Producer: futex wake-ups issued to a sleeping consumer.
    pub kicks: u64,
}

/// Free-running indices are compared modulo 2^32: a difference of at least this much means
/// "behind", not "ahead".
const BEHIND: u32 = 1 << 31;

/// The consuming side of a ring.
#[derive(Debug, Clone)]
pub struct Consumer {
    ring: RingLayout,
    cons: u32,
    cached_prod: u32,
    /// The index [`Consumer::release_and_kick`] last published.
    released: u32,
    /// Where an honest producer puts the next frame (relative to the area): the end of the
    /// last one, on its line. Only a prefetch hint.
    next_hint: usize,
    /// This side's counters.
    pub stats: RingStats,
}

impl Consumer {
    /// A consumer of a freshly initialised ring (indices zero).
    pub fn new(ring: RingLayout) -> Consumer {
        Consumer {
            ring,
            cons: 0,
            cached_prod: 0,
            released: 0,
            next_hint: 0,
            stats: RingStats::default(),
        }
    }

    /// A consumer that resumes where the published consumer index stands (after a restart).
    /// If the producer's index claims more than a ring's worth beyond it (impossible), resumes
    /// at the producer's index, dropping what was queued, and counts an overrun.
    pub fn adopt(region: &Region, ring: RingLayout) -> Consumer {
        let mut c = Consumer::new(ring);
        let cons = region.load_u32(ring.cons_off(), Ordering::Acquire);
        let prod = region.load_u32(ring.prod_off(), Ordering::Acquire);
        let ahead = prod.wrapping_sub(cons);
        if ahead > ring.depth && ahead < BEHIND {
            c.cons = prod;
            c.stats.ring_overrun += 1;
        } else {
            c.cons = cons;
        }
        c.cached_prod = c.cons;
        c.released = c.cons;
        c
    }

    /// The ring this consumer reads.
    pub fn layout(&self) -> &RingLayout {
        &self.ring
    }

    /// Local consumer index.
    pub fn index(&self) -> u32 {
        self.cons
    }

    fn refresh(&mut self, region: &Region) -> u32 {
        // SYNC: Acquire pairs with the producer's Release store of `prod` in `publish`, so the
        // descriptors and frame bytes written before it are visible to us.
        let prod = region.load_u32(self.ring.prod_off(), Ordering::Acquire);
        let ahead = prod.wrapping_sub(self.cons);
        if ahead > self.ring.depth {
            // Frames taken by sequence number may run ahead of the published index (by any
            // amount, if the producer commits without publishing): an index behind ours means
            // nothing more is announced. One claiming more than a ring's worth ahead is
            // impossible.
            if ahead < BEHIND {
                self.stats.ring_overrun += 1;
            }
            return 0;
        }
        self.cached_prod = prod;
        ahead
    }

    /// Frames ready now (reads the shared producer index only when the cached view is empty).
    pub fn available(&mut self, region: &Region) -> u32 {
        let cached = self.cached_prod.wrapping_sub(self.cons);
        if cached != 0 {
            return cached;
        }
        self.refresh(region)
    }

    /// True when the descriptor at the consumer's index carries its sequence number, i.e. the
    /// next `pop` will return a frame without consulting the producer's index.
    pub fn ready(&self, region: &Region) -> bool {
        // SYNC: Acquire pairs with the Release store of the sequence number in `commit`.
        region.load_u32(self.ring.desc_off(self.cons) + DESC_SEQ, Ordering::Acquire)
            == self.cons.wrapping_add(1)
    }

    /// Takes the next frame, if any. `Some(Err(_))` is a refused descriptor (already counted and
    /// skipped). The returned frame's bytes stay in place until [`Consumer::release`].
    pub fn pop(&mut self, region: &Region) -> Option<Result<Frame, BadDescriptor>> {
        let d = self.ring.desc_off(self.cons);
        // Touch where an honest producer put this frame together with the descriptor: the two
        // cache misses overlap. Only a hint; what is used below is what the validated
        // descriptor says.
        let _ = region
            .u64_at(self.ring.area + self.next_hint)
            .map(|w| w.load(Ordering::Relaxed));
        let want = self.cons.wrapping_add(1);
        // SYNC: Acquire pairs with the Release store of the sequence number in `commit`.
        let mut seq = region.load_u32(d + DESC_SEQ, Ordering::Acquire);
        if seq != want {
            if self.cached_prod.wrapping_sub(self.cons) == 0 && self.refresh(region) == 0 {
                return None;
            }
            // The producer's index says a frame is there. Its sequence number was stored before
            // that index, so after the Acquire load of the index it must be visible now.
            seq = region.load_u32(d + DESC_SEQ, Ordering::Acquire);
            if seq != want {
                self.cons = want;
                self.stats.bad_desc += 1;
                return Some(Err(BadDescriptor::Sequence));
            }
        }
        let desc = Descriptor {
            offset: region.load_u32(d + DESC_OFFSET, Ordering::Relaxed),
            len: region.load_u32(d + DESC_LEN, Ordering::Relaxed),
            flags: region.load_u32(d + DESC_FLAGS, Ordering::Relaxed),
        };
        self.cons = want;
        if self.cached_prod.wrapping_sub(self.cons) > self.ring.depth {
            // ran ahead of the cached producer index (frames seen by sequence number)
            self.cached_prod = self.cons;
        }
        let r = desc.validate(&self.ring);
        match r {
            Ok(f) => {
                let end = (f.off - self.ring.area + f.len).next_multiple_of(ALIGN);
                self.next_hint = if end + ALIGN > self.ring.area_len {
                    0
                } else {
                    end
                };
                self.stats.frames += 1;
                self.stats.bytes += f.len as u64;
            }
            Err(BadDescriptor::Oversize) => self.stats.oversize += 1,
            Err(_) => self.stats.bad_desc += 1,
        }
        Some(r)
    }

    /// Puts back `frame`, which the last [`Consumer::pop`] returned and which the caller cannot
    /// take yet (a rate limit): the next `pop` returns its descriptor again, checked again.
    /// Call before [`Consumer::release`], which would hand its slot back to the producer.
    pub fn unpop(&mut self, frame: &Frame) {
        self.cons = self.cons.wrapping_sub(1);
        self.stats.frames = self.stats.frames.saturating_sub(1);
        self.stats.bytes = self.stats.bytes.saturating_sub(frame.len as u64);
    }

    /// Publishes the local index: frames taken so far may now be overwritten by the producer.
    pub fn release(&self, region: &Region) {
        // SYNC: Release pairs with the producer's Acquire load of `cons` in `Producer::space`:
        // our reads of the released slots happen before the producer reuses them.
        region.store_u32(self.ring.cons_off(), self.cons, Ordering::Release);
    }

    /// [`Consumer::release`], then kicks a producer asleep on a full ring if this release
    /// handed slots back (so a producer that sets its space word for nothing costs no more
    /// than its own frames do). Returns whether it kicked.
    pub fn release_and_kick(&mut self, region: &Region) -> bool {
        self.release(region);
        if self.released == self.cons {
            return false;
        }
        self.released = self.cons;
        // SYNC: SeqCst fence between our store of `cons` and our load of `space`; pairs with
        // the fence in `Producer::arm_space`.
        fence(Ordering::SeqCst);
        region
            .u32_at(self.ring.space_off())
            .is_some_and(wake::kick_if_armed)
    }

    /// Declares this consumer about to sleep: sets the ring's sleep word, then (after a full
    /// fence) reports whether work arrived meanwhile. If it returns true, do not sleep.
    /// Pairs with the fence in [`Producer::publish`] (Dekker: one side sees the other).
    pub fn arm(&mut self, region: &Region) -> bool {
        region.store_u32(self.ring.sleep_off(), 1, Ordering::Relaxed);
        // SYNC: SeqCst fence between our store of `sleep` and our load of `prod`; the producer
        // has the mirror-image fence between its store of `prod` and its load of `sleep`.
        fence(Ordering::SeqCst);
        self.cached_prod = self.cons;
        self.ready(region) || self.refresh(region) != 0
    }

    /// Clears the sleep word after waking (or after deciding not to sleep).
    pub fn disarm(&self, region: &Region) {
        region.store_u32(self.ring.sleep_off(), 0, Ordering::Relaxed);
    }

    /// The sleep word, for [`wake::wait_any`].
    pub fn sleep_word<'r>(&self, region: &'r Region) -> Option<&'r std::sync::atomic::AtomicU32> {
        region.u32_at(self.ring.sleep_off())
    }
}

/// Why a push failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// No free slot.
    #[error("ring full")]
    Full,
    /// Frame longer than the slot size (or empty).
    #[error("frame length not within 1..=frame size")]
    BadLength,
}

/// Frames start on this boundary (a cache line).
const ALIGN: usize = 64;

/// Room handed out by [`Producer::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Absolute offset of the room in the region.
    pub off: usize,
    /// Capacity in bytes (at least what was asked for, at most the ring's frame size).
    pub cap: usize,
}

/// The front of a ring's area a producer keeps to while its consumer keeps up: crossing it, the
/// producer re-reads the consumer's index once, and starts from the front again when nothing is
/// queued. A flow that never backs up then touches 32 KiB of the area instead of all of it,
/// which stays in cache while many pipes take turns on a core.
const WARM_AREA: usize = 32 * 1024;

/// The producing side of a ring.
#[derive(Debug, Clone)]
pub struct Producer {
    ring: RingLayout,
    prod: u32,
    published: u32,
    cached_cons: u32,
    /// Where the next frame goes, relative to the area.
    head: usize,
    /// Where each queued frame starts (relative), by index: the producer's own record.
    starts: Box<[u32]>,
    /// What the last `reserve` handed out: (relative offset, capacity).
    reserved: Option<(usize, usize)>,
    /// This side's counters.
    pub stats: RingStats,
}

impl Producer {
    /// A producer of a freshly initialised ring.
    pub fn new(ring: RingLayout) -> Producer {
        Producer {
            ring,
            prod: 0,
            published: 0,
            cached_cons: 0,
            head: 0,
            starts: vec![0; ring.depth as usize].into_boxed_slice(),
            reserved: None,
            stats: RingStats::default(),
        }
    }

    /// A producer that resumes after a restart: at the published producer index, or at the
    /// consumer's if that is ahead (it took frames by sequence number that were committed but
    /// not yet published), then past any further frames committed before the restart, so no
    /// index is ever reused within a lap. Where the queued frames lie is read back from their
    /// descriptors (the consumer can write them, but a wrong one only misplaces its own frames).
    pub fn adopt(region: &Region, ring: RingLayout) -> Producer {
        let mut p = Producer::new(ring);
        let mut prod = region.load_u32(ring.prod_off(), Ordering::Acquire);
        let cons = region.load_u32(ring.cons_off(), Ordering::Acquire);
        if cons.wrapping_sub(prod) < BEHIND {
            // The consumer is ahead (or level): it took frames by sequence number that were
            // never published. Start there. (A consumer lying about this only skips frames
            // of its own.)
            prod = cons;
        }
        for _ in 0..ring.depth {
            let seq = region.load_u32(ring.desc_off(prod) + DESC_SEQ, Ordering::Acquire);
            if seq != prod.wrapping_add(1) || prod.wrapping_sub(cons) >= ring.depth {
                break;
            }
            prod = prod.wrapping_add(1);
        }
        p.prod = prod;
        p.published = prod;
        p.cached_cons = if prod.wrapping_sub(cons) <= ring.depth {
            cons
        } else {
            p.stats.ring_overrun += 1;
            prod.wrapping_sub(ring.depth)
        };
        let mut i = p.cached_cons;
        while i != prod {
            let d = ring.desc_off(i);
            let off = region.load_u32(d + DESC_OFFSET, Ordering::Relaxed) as usize;
            let len = region.load_u32(d + DESC_LEN, Ordering::Relaxed) as usize;
            let start = (off - off % ALIGN).min(ring.area_len);
            p.starts[(i & ring.depth.wrapping_sub(1)) as usize] = start as u32;
            p.head = (start + len.min(ring.frame_size as usize))
                .next_multiple_of(ALIGN)
                .min(ring.area_len);
            i = i.wrapping_add(1);
        }
        p
    }

    /// The ring this producer writes.
    pub fn layout(&self) -> &RingLayout {
        &self.ring
    }

    /// Free descriptors, re-reading the consumer's index only when the cached view says full.
    fn free_descs(&mut self, region: &Region) -> u32 {
        let used = self.prod.wrapping_sub(self.cached_cons);
        if used < self.ring.depth {
            return self.ring.depth - used;
        }
        self.refresh(region);
        self.ring.depth - self.prod.wrapping_sub(self.cached_cons)
    }

    /// Re-reads the consumer's index (checked: it may only move forward, never past what was
    /// produced).
    fn refresh(&mut self, region: &Region) {
        // SYNC: Acquire pairs with the consumer's Release store in `Consumer::release`.
        let cons = region.load_u32(self.ring.cons_off(), Ordering::Acquire);
        let advanced = cons.wrapping_sub(self.cached_cons);
        if advanced > self.prod.wrapping_sub(self.cached_cons) {
            self.stats.ring_overrun += 1;
            return;
        }
        self.cached_cons = cons;
    }

    /// Where a frame of `need` bytes (a multiple of [`ALIGN`]) can start now, relative to the
    /// area, by the cached view of what the consumer released.
    fn place(&self, need: usize) -> Option<usize> {
        let area = self.ring.area_len;
        if self.prod == self.cached_cons {
            // nothing queued: from the start, where the lines are warm
            return (need <= area).then_some(0);
        }
        let tail =
            self.starts[(self.cached_cons & self.ring.depth.wrapping_sub(1)) as usize] as usize;
        // queued frames lie in [tail, head), around the end if head < tail; a frame may not
        // end exactly at tail (head == tail would read as empty)
        if self.head >= tail {
            if self.head + need <= area {
                Some(self.head)
            } else {
                (need < tail).then_some(0)
            }
        } else {
            (self.head + need < tail).then_some(self.head)
        }
    }

    /// Where a frame of `len` bytes (within `1..=frame size`) can start now: a free descriptor
    /// and room in the area, re-reading the consumer's index once when the cached view has
    /// none.
    fn room(&mut self, region: &Region, len: usize) -> Option<usize> {
        if len == 0 || len > self.ring.frame_size as usize || self.free_descs(region) == 0 {
            return None;
        }
        let need = len.next_multiple_of(ALIGN);
        if self.head <= WARM_AREA && self.head + need > WARM_AREA && self.prod != self.cached_cons {
            // about to leave the warm front of the area: if the consumer has taken everything
            // (a request-response flow), `place` starts again from the front instead
            self.refresh(region);
        }
        self.place(need).or_else(|| {
            self.refresh(region);
            self.place(need)
        })
    }

    /// Frames that can be queued now, 0 when the ring is full: free descriptors, or 0 when
    /// the area has no room for a frame of the ring's largest size.
    pub fn space(&mut self, region: &Region) -> u32 {
        match self.room(region, self.ring.frame_size as usize) {
            Some(_) => self.free_descs(region),
            None => 0,
        }
    }

    /// Whether a frame of `len` bytes can be queued now (a descriptor and room for it).
    pub fn fits(&mut self, region: &Region, len: usize) -> bool {
        self.room(region, len).is_some()
    }

    /// Room for a frame of the ring's largest size, or `None` (counted as `full`).
    pub fn reserve(&mut self, region: &Region) -> Option<Slot> {
        self.reserve_len(region, self.ring.frame_size as usize)
    }

    /// Room for a frame of `len` bytes, or `None`: counted as `full` when the ring has no room,
    /// not counted when `len` is not within `1..=frame size`.
    pub fn reserve_len(&mut self, region: &Region, len: usize) -> Option<Slot> {
        self.reserved = None;
        if len == 0 || len > self.ring.frame_size as usize {
            return None;
        }
        let Some(at) = self.room(region, len) else {
            self.stats.full += 1;
            return None;
        };
        let cap = len
            .next_multiple_of(ALIGN)
            .min(self.ring.frame_size as usize);
        self.reserved = Some((at, cap));
        Some(Slot {
            off: self.ring.area + at,
            cap,
        })
    }

    /// Queues the frame written into the room the last `reserve` returned (not yet visible).
    /// `len` must be within `1..=` that room's capacity.
    pub fn commit(&mut self, region: &Region, len: usize, flags: u32) -> Result<(), PushError> {
        let Some((at, cap)) = self.reserved else {
            return Err(PushError::BadLength);
        };
        if len == 0 || len > cap {
            return Err(PushError::BadLength);
        }
        self.reserved = None;
        let d = self.ring.desc_off(self.prod);
        region.store_u32(d + DESC_OFFSET, at as u32, Ordering::Relaxed);
        region.store_u32(d + DESC_LEN, len as u32, Ordering::Relaxed);
        region.store_u32(d + DESC_FLAGS, flags, Ordering::Relaxed);
        debug_assert_eq!(DESC_SIZE, 16);
        // SYNC: Release pairs with the consumer's Acquire load of the sequence number in `pop`
        // and `ready`: the frame bytes and descriptor fields above are visible before it.
        region.store_u32(d + DESC_SEQ, self.prod.wrapping_add(1), Ordering::Release);
        self.starts[(self.prod & self.ring.depth.wrapping_sub(1)) as usize] = at as u32;
        self.head = at + len.next_multiple_of(ALIGN);
        self.prod = self.prod.wrapping_add(1);
        self.stats.frames += 1;
        self.stats.bytes += len as u64;
        Ok(())
    }

    /// Copies `data` into the ring and queues it.
    pub fn push(&mut self, region: &Region, data: &[u8], flags: u32) -> Result<(), PushError> {
        self.push_parts(region, &[data], flags)
    }

    /// Copies the concatenation of `parts` into the ring and queues it as one frame (a header
    /// built apart from its payload goes in without being joined first).
    pub fn push_parts(
        &mut self,
        region: &Region,
        parts: &[&[u8]],
        flags: u32,
    ) -> Result<(), PushError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len == 0 || len > self.ring.frame_size as usize {
            return Err(PushError::BadLength);
        }
        let slot = self.reserve_len(region, len).ok_or(PushError::Full)?;
        let mut at = slot.off;
        for p in parts {
            region.write(at, p);
            at += p.len();
        }
        self.commit(region, len, flags)
    }

    /// Frames queued but not yet published.
    pub fn pending(&self) -> u32 {
        self.prod.wrapping_sub(self.published)
    }

    /// The index the next frame gets: frames queued so far, modulo 2^32.
    pub fn position(&self) -> u32 {
        self.prod
    }

    /// Whether the consumer has taken every frame queued before `position` (a value of
    /// [`Producer::position`]). Re-reads the consumer's index.
    pub fn consumed(&mut self, region: &Region, position: u32) -> bool {
        self.refresh(region);
        self.cached_cons.wrapping_sub(position) < BEHIND
    }

    /// Declares this producer about to sleep on a full ring: sets the ring's space word, then
    /// (after a full fence) reports whether a slot freed meanwhile. If it returns true, do not
    /// sleep. Pairs with the fence in [`Consumer::release_and_kick`].
    pub fn arm_space(&mut self, region: &Region) -> bool {
        region.store_u32(self.ring.space_off(), 1, Ordering::Relaxed);
        // SYNC: SeqCst fence between our store of `space` and our load of `cons`.
        fence(Ordering::SeqCst);
        self.space(region) != 0
    }

    /// Clears the space word after waking (or after deciding not to sleep).
    pub fn disarm_space(&self, region: &Region) {
        region.store_u32(self.ring.space_off(), 0, Ordering::Relaxed);
    }

    /// Makes queued frames visible and kicks the consumer if it sleeps. Returns whether a
    /// kick (futex wake) was issued. Cheap when nothing is pending.
    pub fn publish(&mut self, region: &Region) -> bool {
        if self.prod == self.published {
            return false;
        }
        self.published = self.prod;
        // SYNC: Release pairs with the consumer's Acquire load of `prod`: descriptor and frame
        // writes above become visible before the index that announces them.
        region.store_u32(self.ring.prod_off(), self.prod, Ordering::Release);
        // SYNC: SeqCst fence between our store of `prod` and our load of `sleep`; pairs with
        // the fence in `Consumer::arm`.
        fence(Ordering::SeqCst);
        let kicked = region
            .u32_at(self.ring.sleep_off())
            .is_some_and(wake::kick_if_armed);
        self.stats.kicks += u64::from(kicked);
        kicked
    }
}

#[cfg(test)]
mod tests;
