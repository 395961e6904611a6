//! Forwarding frames from a pipe's tx ring to other pipes, the wire or another master's inbox.

use super::local::{Admit, Local};
use super::{shard_of, MasterShared, Parcel, BATCH};
use crate::capture::Dir;
use crate::nic::{Edge, Sent};
use crate::registry::{Counter, Pipe, Snapshot};
use crate::switch::{decide, Decision, DropReason, HEADER_PEEK};
use docknet_pipe::region::copy_between;
use docknet_pipe::wake;
use docknet_pipe::Frame;
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

/// The way to the other masters, for one round.
pub(super) struct Cross<'a> {
    pub(super) shared: &'a MasterShared,
    pub(super) me: usize,
    /// Masters that got frames this round (to wake if they sleep).
    pub(super) notify: &'a mut [bool],
}

impl Cross<'_> {
    /// Queues a copy of `frame` (from `src`, with `hdr` over its start) for pipe `dst`'s master.
    fn send(&mut self, snap: &Snapshot, src: usize, dst: usize, frame: Frame, hdr: &[u8]) -> bool {
        let masters = self.shared.shards.len();
        let dp = &snap.pipes[dst];
        let j = shard_of(dp.id, masters);
        let mut bytes = vec![0u8; frame.len];
        if !snap.pipes[src].region.read(frame.off, &mut bytes) {
            return false;
        }
        bytes[..hdr.len()].copy_from_slice(hdr);
        let parcel = Parcel { pipe: dp.id, bytes };
        if self.shared.shards[j].inbox[self.me].push(parcel).is_err() {
            self.shared.cross_drops.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.shared.cross.fetch_add(1, Ordering::Relaxed);
        self.notify[j] = true;
        true
    }

    /// Wakes the masters that got frames and sleep.
    pub(super) fn ring(&mut self) {
        // SYNC: SeqCst fence between our pushes and our load of `asleep`; the sleeper has the
        // mirror-image fence between its store of `asleep` and its check of the inboxes.
        fence(Ordering::SeqCst);
        for (j, n) in self.notify.iter_mut().enumerate() {
            if std::mem::take(n) {
                let sh = &self.shared.shards[j];
                if sh.asleep.load(Ordering::Relaxed) != 0 {
                    sh.bell.fetch_add(1, Ordering::Release);
                    wake::wake(&sh.bell);
                }
            }
        }
    }
}

/// Copies `frame` from pipe `src` into pipe `dst`'s rx ring, with `hdr` (the bytes the decision
/// was made on) written over the start, so what arrives is what was checked. A flood copy that
/// finds the receiver full is charged to the sender (`flood_rx_full`), not the receiver. A pipe
/// of another master gets a copy through that master's inbox.
#[allow(clippy::too_many_arguments)]
fn deliver(
    snap: &Snapshot,
    local: &mut [Local],
    src: usize,
    dst: usize,
    frame: Frame,
    hdr: &[u8],
    dirty: &mut Vec<usize>,
    flood: bool,
    now_ns: u64,
    cross: &mut Cross<'_>,
) -> bool {
    let dp = &snap.pipes[dst];
    if !local[dst].owned {
        return cross.send(snap, src, dst, frame, hdr);
    }
    let dl = &mut local[dst];
    if frame.len > dl.rx.layout().frame_size as usize {
        dl.count(Counter::DropTooBig, 1);
        return false;
    }
    if dl.ingress.is_some() && dl.inq.is_empty() && !dl.rx.fits(&dp.region, frame.len) {
        // no room: dropped as below, but before the limit takes tokens for it (a 64 KiB
        // segment would leave the receiver owing what it never got)
        count_rx_full(local, src, dst, flood);
        return false;
    }
    match dl.admit(frame.len, now_ns) {
        Admit::Now => {}
        Admit::Drop => return false,
        Admit::Queue => {
            // over the receiver's ingress limit: a copy waits in the daemon's queue
            let mut v = vec![0u8; frame.len];
            if snap.pipes[src].region.read(frame.off, &mut v) {
                v[..hdr.len()].copy_from_slice(hdr);
                local[dst].enqueue(v);
            }
            return false;
        }
    }
    let dl = &mut local[dst];
    let Some(slot) = dl.rx.reserve_len(&dp.region, frame.len) else {
        count_rx_full(local, src, dst, flood);
        return false;
    };
    let sp = &snap.pipes[src];
    if !copy_between(&sp.region, frame.off, &dp.region, slot.off, frame.len)
        || !dp.region.write(slot.off, hdr)
        || dl.rx.commit(&dp.region, frame.len, 0).is_err()
    {
        return false;
    }
    if let Some(t) = &dl.tap {
        t.offer_region(&dp.region, slot.off, frame.len, hdr, Dir::In);
    }
    dl.count(Counter::RxPackets, 1);
    dl.count(Counter::RxBytes, frame.len as u64);
    mark(dl, dst, dirty);
    true
}

/// Counts a frame from `src` that found `dst`'s rx ring full: a flooded copy is charged to the
/// sender, never to the receiver.
fn count_rx_full(local: &mut [Local], src: usize, dst: usize, flood: bool) {
    if flood {
        local[src].count(Counter::FloodRxFull, 1);
    } else {
        local[dst].count(Counter::DropRxFull, 1);
    }
}

/// Notes that pipe `idx`'s rx ring has frames to publish (once per batch).
pub(super) fn mark(l: &mut Local, idx: usize, dirty: &mut Vec<usize>) {
    if !l.rx_dirty {
        l.rx_dirty = true;
        dirty.push(idx);
    }
}

/// Copies `bytes` into pipe `idx`'s rx ring (subject to its ingress limit). True when it was
/// taken: delivered, or queued for the limit.
pub(super) fn deliver_bytes(
    p: &Pipe,
    l: &mut Local,
    bytes: &[u8],
    dirty: &mut Vec<usize>,
    idx: usize,
    now_ns: u64,
) -> bool {
    match l.admit(bytes.len(), now_ns) {
        Admit::Now => {}
        Admit::Drop => return false,
        Admit::Queue => {
            // taken: it waits for the ingress limit in the daemon's queue
            l.enqueue(bytes.to_vec());
            return true;
        }
    }
    match l.rx.push(&p.region, bytes, 0) {
        Ok(()) => {
            if let Some(t) = &l.tap {
                t.offer_bytes(bytes, Dir::In);
            }
            l.count(Counter::RxPackets, 1);
            l.count(Counter::RxBytes, bytes.len() as u64);
            mark(l, idx, dirty);
            true
        }
        Err(_) => {
            l.count(Counter::DropRxFull, 1);
            false
        }
    }
}

/// What one [`pump`] moved.
pub(super) struct Pumped {
    /// Frames taken from the tx ring.
    pub taken: usize,
    /// Frames delivered into rx rings or sent to the wire.
    pub forwarded: u64,
    /// Frames taken of traffic no rate limit holds (see [`Local::paced`]).
    pub unpaced: usize,
}

/// Moves up to [`BATCH`] frames from pipe `i`'s tx ring.
#[allow(clippy::too_many_arguments)]
pub(super) fn pump(
    snap: &Snapshot,
    local: &mut [Local],
    i: usize,
    dirty: &mut Vec<usize>,
    edge: Option<&mut Edge>,
    now: Instant,
    now_ns: u64,
    cross: &mut Cross<'_>,
) -> Pumped {
    let mut edge = edge;
    let sp = &snap.pipes[i];
    let stats_before = (local[i].tx.stats, local[i].rx.stats);
    let mut taken = 0;
    let mut forwarded = 0u64;
    let mut paced = 0;
    // (a pipe that waits for tokens below takes no frame after that)
    let src_paced = local[i].paced(now_ns);
    let mut hdr_buf = [0u8; HEADER_PEEK];
    while taken < BATCH {
        let Some(r) = local[i].tx.pop(&sp.region) else {
            break;
        };
        taken += 1;
        let Ok(frame) = r else {
            local[i].dirty_counters = true;
            continue;
        };
        if let Some(b) = local[i].egress.as_mut() {
            if !b.take(frame.len, now_ns) {
                // over its egress limit: the frame stays in its ring (the container's TCP
                // feels the back-pressure) and the ring is not read until the tokens are there
                let wait = b.wait_for_run(frame.len, now_ns).max(1);
                local[i].tx.unpop(&frame);
                local[i].egress_until = now_ns + wait;
                local[i].paced_at = Some(now_ns);
                local[i].count(Counter::RateWaits, 1);
                taken -= 1;
                break;
            }
        }
        let hl = frame.len.min(HEADER_PEEK);
        let hdr = &mut hdr_buf[..hl];
        if !sp.region.read(frame.off, hdr) {
            continue;
        }
        if let Some(t) = &local[i].tap {
            t.offer_region(&sp.region, frame.off, frame.len, hdr, Dir::Out);
        }
        let decision = decide(hdr, frame.len, i, &snap.table);
        if src_paced || matches!(decision, Decision::Unicast(d) if local[d].paced(now_ns)) {
            paced += 1;
        }
        match decision {
            Decision::Unicast(d) => {
                let ok = deliver(snap, local, i, d, frame, hdr, dirty, false, now_ns, cross);
                forwarded += u64::from(ok);
                if ok && cross.shared.auto_channels.load(Ordering::Relaxed) {
                    let to = snap.pipes[d].id;
                    let opens = super::talk::opens_connection(hdr);
                    if local[i].talk.note(to, now_ns, opens) {
                        cross.shared.talked(sp.id, to);
                    }
                }
            }
            Decision::Flood if !local[i].flood.take(now) => {
                local[i].count(Counter::DropFloodLimited, 1);
            }
            Decision::Flood => {
                local[i].count(Counter::Flooded, 1);
                for d in (0..snap.pipes.len()).filter(|&d| d != i) {
                    forwarded += u64::from(deliver(
                        snap, local, i, d, frame, hdr, dirty, true, now_ns, cross,
                    ));
                }
            }
            Decision::Reply(bytes) => {
                local[i].count(Counter::ArpReplies, 1);
                forwarded += u64::from(deliver_bytes(sp, &mut local[i], &bytes, dirty, i, now_ns));
            }
            Decision::NdpReply(bytes) => {
                local[i].count(Counter::NdpReplies, 1);
                forwarded += u64::from(deliver_bytes(sp, &mut local[i], &bytes, dirty, i, now_ns));
            }
            Decision::Wire(dst) => match edge.as_deref_mut() {
                Some(e) => match e.send(
                    &sp.region,
                    frame.off,
                    frame.len,
                    hdr,
                    snap.routes.next_hop(dst),
                    now,
                ) {
                    Sent::Sent => {
                        local[i].count(Counter::WireTx, 1);
                        forwarded += 1;
                    }
                    Sent::Held => local[i].count(Counter::WireTx, 1),
                    Sent::TooBig | Sent::Dropped => local[i].count(Counter::DropWire, 1),
                },
                None => local[i].count(Counter::DropNoRoute, 1),
            },
            Decision::Drop(reason) => local[i].count(
                match reason {
                    DropReason::Malformed => Counter::DropMalformed,
                    DropReason::Spoofed => Counter::DropSpoofed,
                    DropReason::NoRoute => Counter::DropNoRoute,
                    DropReason::Unsupported => Counter::DropUnsupported,
                    DropReason::ExtHeader => Counter::DropExtHeader,
                },
                1,
            ),
        }
    }
    // what went into rx rings is published before the sender sees its frames taken: a sender
    // that waits for that before it sends on a new fast channel is then never overtaken
    for &d in dirty.iter() {
        local[d].rx.publish(&snap.pipes[d].region);
        local[d].rx_dirty = false;
    }
    dirty.clear();
    if taken > 0 {
        if local[i].tx.release_and_kick(&sp.region) {
            local[i].rx.stats.kicks += 1;
        }
        local[i].dirty_counters = true;
    } else if (local[i].tx.stats, local[i].rx.stats) != stats_before {
        // nothing moved, but something was counted (an impossible index from the container)
        local[i].dirty_counters = true;
    }
    Pumped {
        taken,
        forwarded,
        unpaced: taken - paced,
    }
}
