//! The master loop: runs a master thread (and its link's waker thread) until shutdown.

use super::link::waker;
use super::{Master, MasterShared};
use crate::nic::Edge;
use docknet_pipe::wake;
use docknet_pipe::{IdlePolicy, Idler};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Runs the master loop until `shared.shutdown` is set (driving `edge`, if given; a waker
/// thread watches it while the master sleeps).
pub fn run(shared: Arc<MasterShared>, policy: IdlePolicy, edge: Option<Edge>) {
    run_shard(shared, 0, policy, edge)
}

/// Runs master `me` of `shared.shards.len()` until shutdown (see [`run`]).
pub fn run_shard(shared: Arc<MasterShared>, me: usize, policy: IdlePolicy, edge: Option<Edge>) {
    // the waker polls copies of the link's descriptors: they stay valid while it runs
    let fds: Vec<OwnedFd> = edge.iter().flat_map(|e| e.waker_fds()).collect();
    let waker_thread = (!fds.is_empty()).then(|| {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("docknet-link-waker".into())
            .spawn(move || waker(s, fds))
    });
    let mut m = Master::shard(shared.clone(), me, edge);
    let mut idler = Idler::new(policy);
    let st = &shared.stats[m.me];
    // The time split costs no clock read of its own on the busy path: the span from one
    // round's start (its own clock read) to the next is busy if the round moved frames, idle
    // if not, less any sleep in between (timed around the sleep). Published every
    // `PUBLISH_EVERY` rounds and around each sleep; this thread is the only writer.
    const PUBLISH_EVERY: u64 = 64;
    let (mut rounds, mut frames, mut busy, mut idle, mut asleep, mut sleeps) =
        (0u64, 0, 0, 0, 0, 0);
    let mut prev: Option<(u64, bool)> = None;
    let mut slept_ns = 0u64;
    let publish = |r, f, b, i, a, s| {
        st.rounds.store(r, Ordering::Relaxed);
        st.frames.store(f, Ordering::Relaxed);
        st.busy_ns.store(b, Ordering::Relaxed);
        st.idle_ns.store(i, Ordering::Relaxed);
        st.asleep_ns.store(a, Ordering::Relaxed);
        st.sleeps.store(s, Ordering::Relaxed);
    };
    // SYNC: a shutdown asked before `Master::shard` read the version bumped no version this
    // master will ever see change, so it is checked once here (after that read: a later
    // shutdown's poke changes the version, and `refresh` sees it).
    let asked_before = shared.shutdown.load(Ordering::Acquire);
    while !asked_before && m.refresh() {
        let n = m.round();
        rounds += 1;
        frames += n as u64;
        if let Some((start, worked)) = prev {
            let span = m.round_ns.saturating_sub(start).saturating_sub(slept_ns);
            if worked {
                busy += span;
            } else {
                idle += span;
            }
        }
        prev = Some((m.round_ns, n > 0));
        slept_ns = 0;
        if rounds % PUBLISH_EVERY == 0 {
            publish(rounds, frames, busy, idle, asleep, sleeps);
        }
        if n > 0 {
            if m.round_was_paced() {
                idler.aside();
            } else {
                idler.busy();
            }
            continue;
        }
        if idler.step() {
            // No `idler.busy()` after it: a timeout with no work goes straight back to sleep;
            // work found in the next round resets the idler.
            publish(rounds, frames, busy, idle, asleep, sleeps);
            let t0 = wake::monotonic_ns();
            m.sleep();
            slept_ns = wake::monotonic_ns().saturating_sub(t0);
            asleep += slept_ns;
            sleeps += 1;
            publish(rounds, frames, busy, idle, asleep, sleeps);
        }
    }
    publish(rounds, frames, busy, idle, asleep, sleeps);
    m.flush_all(true);
    drop(m);
    if let Some(Ok(t)) = waker_thread {
        shared.shutdown.store(true, Ordering::Release);
        shared.poke();
        let _ = t.join();
    }
}
