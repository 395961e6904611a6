//! Model-based tests of the rings: random operation sequences checked against a `VecDeque`,
//! and a hostile peer writing arbitrary indices and descriptors.

use docknet_pipe::layout::{plan, RingParams, DESC_SEQ};
use docknet_pipe::{Consumer, Producer, PushError, Region, RingLayout};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// The largest frame of the test rings.
const FRAME: usize = 256;

/// A ring of `depth` descriptors whose area holds fewer bytes than `depth` frames of the
/// largest size, so either can run out first.
fn ring(depth: u32) -> (Region, RingLayout) {
    let p = RingParams {
        depth,
        frame_size: FRAME as u32,
        area_len: (depth as usize * 128).max(FRAME),
    };
    let (rings, size) = plan([p, p]).unwrap();
    (Region::anonymous(size).unwrap(), rings[1])
}

#[derive(Debug, Clone)]
enum Op {
    Push(Vec<u8>),
    Publish,
    Pop,
    Release,
    /// Both sides restart and re-adopt the ring from shared memory.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 1..=FRAME).prop_map(Op::Push),
        2 => Just(Op::Publish),
        4 => Just(Op::Pop),
        2 => Just(Op::Release),
        1 => Just(Op::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn honest_sequences_match_a_queue(depth_log in 1u32..6, ops in proptest::collection::vec(op(), 1..400)) {
        let depth = 1 << depth_log;
        let (r, l) = ring(depth);
        let mut p = Producer::new(l);
        let mut c = Consumer::new(l);
        // committed frames are visible at once (sequence numbers); publishing only updates the
        // shared index and kicks a sleeper
        let mut visible: VecDeque<Vec<u8>> = VecDeque::new();
        let mut popped: Vec<(Vec<u8>, usize)> = Vec::new();
        let line = |n: usize| n.next_multiple_of(64);
        for o in ops {
            match o {
                Op::Push(d) => {
                    let in_flight = visible.len() + popped.len();
                    let used: usize = visible.iter().map(|v| line(v.len())).sum::<usize>()
                        + popped.iter().map(|(v, _)| line(v.len())).sum::<usize>();
                    let res = p.push(&r, &d, 7);
                    if in_flight == depth as usize {
                        prop_assert_eq!(res, Err(PushError::Full));
                    } else if res.is_err() {
                        // out of room in the area: allowed only when the queued frames leave
                        // too little: free bytes are at most two runs (around the end), and
                        // the end a wrapped frame skipped (less than a frame) is lost till
                        // the frames before it are released
                        prop_assert_eq!(res, Err(PushError::Full));
                        prop_assert!(used + 2 * line(d.len()) + FRAME > l.area_len, "refused with {} of {} bytes used", used, l.area_len);
                    } else {
                        visible.push_back(d);
                    }
                }
                Op::Publish => {
                    p.publish(&r);
                }
                Op::Pop => match (c.pop(&r), visible.pop_front()) {
                    (None, None) => {}
                    (Some(Ok(f)), Some(want)) => {
                        let mut got = vec![0u8; f.len];
                        prop_assert!(r.read(f.off, &mut got));
                        prop_assert_eq!(&got, &want);
                        prop_assert_eq!(f.flags, 7);
                        popped.push((want, f.off));
                    }
                    (got, want) => prop_assert!(false, "ring gave {:?}, model {:?}", got, want),
                },
                Op::Release => {
                    // what was taken stayed intact until released (nothing was written over it)
                    for (want, off) in popped.drain(..) {
                        let mut got = vec![0u8; want.len()];
                        prop_assert!(r.read(off, &mut got));
                        prop_assert_eq!(&got, &want);
                    }
                    c.release(&r);
                }
                Op::Restart => {
                    p = Producer::adopt(&r, l);
                    c = Consumer::adopt(&r, l);
                    // taken but not released: delivered again, in order, before the rest
                    for (f, _) in popped.drain(..).rev() {
                        visible.push_front(f);
                    }
                }
            }
        }
        prop_assert_eq!(c.stats.bad_desc + c.stats.oversize + c.stats.ring_overrun, 0);
        prop_assert_eq!(p.stats.ring_overrun, 0);
    }

    #[test]
    fn hostile_producer_cannot_push_the_consumer_out_of_bounds(
        writes in proptest::collection::vec((0u8..6, any::<u32>(), any::<u32>(), any::<u32>()), 1..300)
    ) {
        let (r, l) = ring(16);
        let mut c = Consumer::new(l);
        let mut results = 0u64;
        for (what, a, b, v) in writes {
            match what {
                0 => r.u32_at(l.prod_off()).unwrap().store(v, Ordering::Release),
                1 => {
                    let d = l.desc_off(a);
                    r.u32_at(d).unwrap().store(b, Ordering::Relaxed);
                    r.u32_at(d + 4).unwrap().store(v % 300, Ordering::Relaxed);
                }
                4 => {
                    // any sequence word at any descriptor
                    r.u32_at(l.desc_off(a) + DESC_SEQ).unwrap().store(v, Ordering::Release);
                }
                5 => {
                    // the right sequence word for the consumer's next slot, with an arbitrary
                    // offset and length: the frame is announced, and must be checked
                    let idx = c.index().wrapping_add(a % 3);
                    let d = l.desc_off(idx);
                    r.u32_at(d).unwrap().store(b % 4096, Ordering::Relaxed);
                    r.u32_at(d + 4).unwrap().store(v % 300, Ordering::Relaxed);
                    r.u32_at(d + DESC_SEQ).unwrap().store(idx.wrapping_add(1), Ordering::Release);
                }
                2 => {
                    // a plausible producer index near the consumer's
                    let near = c.index().wrapping_add(v % 40);
                    r.u32_at(l.prod_off()).unwrap().store(near, Ordering::Release);
                }
                _ => {
                    for _ in 0..(a % 20) {
                        match c.pop(&r) {
                            Some(Ok(f)) => {
                                results += 1;
                                prop_assert!(f.off >= l.area && f.off + f.len <= l.area + l.area_len);
                                prop_assert!(f.len >= 1 && f.len <= FRAME);
                            }
                            Some(Err(_)) => results += 1,
                            None => break,
                        }
                    }
                    c.release(&r);
                }
            }
        }
        prop_assert_eq!(c.stats.frames + c.stats.bad_desc + c.stats.oversize, results);
    }

    #[test]
    fn hostile_consumer_cannot_make_the_producer_overwrite_or_overflow(
        ops in proptest::collection::vec((0u8..3, any::<u32>()), 1..300)
    ) {
        let (r, l) = ring(8);
        let mut p = Producer::new(l);
        // Model: the furthest consumer index the producer may believe. The last value written
        // counts only while it is plausible (forward, and not past what was produced); a lie
        // that becomes plausible later only loses the liar's own frames.
        let mut pushed = 0u32;
        let mut believed = 0u32;
        let mut shared = 0u32;
        for (what, v) in ops {
            match what {
                0 => { if p.push(&r, &v.to_le_bytes(), 0).is_ok() { pushed = pushed.wrapping_add(1); } }
                1 => { p.publish(&r); }
                _ => {
                    shared = if v % 2 == 0 { believed.wrapping_add(v % 10) } else { v };
                    r.u32_at(l.cons_off()).unwrap().store(shared, Ordering::Release);
                }
            }
            if shared.wrapping_sub(believed) <= pushed.wrapping_sub(believed) {
                believed = shared;
            }
            // Whatever the consumer wrote, the producer never believes more slots are free
            // than that: it cannot overwrite frames the consumer has not released.
            let really_free = 8 - pushed.wrapping_sub(believed);
            prop_assert!(p.space(&r) <= really_free, "space {} > free {}", p.space(&r), really_free);
        }
    }
}

/// The accepted-frame branch of a hostile producer: plausible descriptors with sequence words
/// are taken, implausible ones refused, and every taken frame lies inside the area.
#[test]
fn announced_frames_of_a_hostile_producer_are_accepted_only_in_bounds() {
    let (r, l) = ring(16);
    let mut c = Consumer::new(l);
    let (mut ok, mut refused) = (0, 0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..10_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let d = l.desc_off(i);
        let (off, len) = ((x as u32) % 2500, ((x >> 32) as u32) % 400);
        r.u32_at(d).unwrap().store(off, Ordering::Relaxed);
        r.u32_at(d + 4).unwrap().store(len, Ordering::Relaxed);
        r.u32_at(d + DESC_SEQ)
            .unwrap()
            .store(i + 1, Ordering::Release);
        match c.pop(&r) {
            Some(Ok(f)) => {
                ok += 1;
                assert!(f.off >= l.area && f.off + f.len <= l.area + l.area_len);
                assert!((1..=FRAME).contains(&f.len));
            }
            Some(Err(_)) => refused += 1,
            None => panic!("an announced frame was not seen"),
        }
        c.release(&r);
    }
    assert!(
        ok > 1000 && refused > 1000,
        "{ok} accepted, {refused} refused"
    );
    assert_eq!(c.stats.frames, ok);
}
