//! The rings' tests: layout, wrap-around, hostile indices and descriptors, restarts.

use super::*;
use crate::layout::{plan, RingParams};

/// A region with two rings of these parameters, and the first ring.
fn ring_of(depth: u32, frame_size: u32, area_len: usize) -> (Region, RingLayout) {
    let p = RingParams {
        depth,
        frame_size,
        area_len,
    };
    let (rings, size) = plan([p, p]).unwrap();
    (Region::anonymous(size).unwrap(), rings[0])
}

fn ring(depth: u32) -> (Region, RingLayout) {
    ring_of(depth, 128, depth as usize * 128)
}

#[test]
fn frames_of_any_length_lie_end_to_end_and_wrap_to_the_start() {
    // 64 descriptors, frames up to 1024 bytes, 4096 bytes of area
    let (r, l) = ring_of(64, 1024, 4096);
    let mut prod = Producer::new(l);
    let mut c = Consumer::new(l);
    // small frames take a line each: 64 of them fit, as many as there are descriptors
    for i in 0..64u8 {
        prod.push(&r, &[i; 60], 0).unwrap();
    }
    assert_eq!(prod.push(&r, &[0; 60], 0), Err(PushError::Full));
    prod.publish(&r);
    for i in 0..64u8 {
        let f = c.pop(&r).unwrap().unwrap();
        assert_eq!(f.off, l.area + 64 * i as usize);
    }
    c.release(&r);
    // large ones, then a small one behind them: a fourth large one no longer fits
    for i in 0..3u8 {
        prod.push(&r, &[i; 1024], 0).unwrap();
    }
    prod.push(&r, &[7; 100], 0).unwrap();
    assert_eq!(prod.push(&r, &[9; 1024], 0), Err(PushError::Full));
    assert_eq!(prod.space(&r), 0, "no room for a frame of the largest size");
    assert!(prod.fits(&r, 800) && !prod.fits(&r, 900));
    prod.publish(&r);
    let first = c.pop(&r).unwrap().unwrap();
    c.release(&r);
    // the first large frame's room is free again: the next wraps to the start
    prod.push(&r, &[8; 900], 0).unwrap();
    prod.publish(&r);
    let mut seen = vec![];
    while let Some(f) = c.pop(&r) {
        let f = f.unwrap();
        let mut b = vec![0u8; f.len];
        assert!(r.read(f.off, &mut b));
        assert!(b.iter().all(|x| *x == b[0]), "frame overwritten");
        seen.push((f.off - l.area, f.len, b[0]));
    }
    assert_eq!(first.off, l.area);
    assert_eq!(
        seen,
        vec![
            (1024, 1024, 1),
            (2048, 1024, 2),
            (3072, 100, 7),
            (0, 900, 8)
        ]
    );
    // a frame larger than the ring's largest is refused, whatever the room
    c.release(&r);
    assert_eq!(prod.push(&r, &[1; 1025], 0), Err(PushError::BadLength));
    assert!(prod.reserve_len(&r, 1025).is_none());
    // commit needs a reserve, and no more than it reserved
    assert_eq!(prod.commit(&r, 10, 0), Err(PushError::BadLength));
    let s = prod.reserve_len(&r, 100).unwrap();
    assert_eq!(s.cap, 128);
    assert_eq!(prod.commit(&r, 129, 0), Err(PushError::BadLength));
    assert_eq!(prod.commit(&r, 128, 0), Ok(()));
}

#[test]
fn a_consumer_that_keeps_up_keeps_the_producer_at_the_warm_front() {
    let (r, l) = ring_of(256, 2048, 1 << 20);
    let mut prod = Producer::new(l);
    let mut c = Consumer::new(l);
    let mut highest = 0;
    for i in 0..1000u32 {
        prod.push(&r, &[i as u8; 1500], 0).unwrap();
        prod.publish(&r);
        let f = c.pop(&r).unwrap().unwrap();
        let mut b = vec![0u8; f.len];
        assert!(r.read(f.off, &mut b));
        assert!(b.iter().all(|x| *x == i as u8));
        highest = highest.max(f.off - l.area);
        c.release(&r);
    }
    assert!(highest < WARM_AREA, "frames reached {highest}");
    // a consumer that falls behind: the producer goes on past the front, overwriting nothing
    for i in 0..100u32 {
        prod.push(&r, &[i as u8; 1500], 0).unwrap();
    }
    prod.publish(&r);
    let mut offs = vec![];
    for i in 0..100u32 {
        let f = c.pop(&r).unwrap().unwrap();
        let mut b = vec![0u8; f.len];
        assert!(r.read(f.off, &mut b));
        assert!(b.iter().all(|x| *x == i as u8), "frame {i} overwritten");
        offs.push(f.off - l.area);
    }
    assert!(offs.iter().any(|o| *o > WARM_AREA));
}

#[test]
fn a_restarted_producer_keeps_clear_of_frames_still_queued() {
    let (r, l) = ring_of(8, 1024, 2048);
    let mut prod = Producer::new(l);
    let mut c = Consumer::new(l);
    prod.push(&r, &[1; 700], 0).unwrap();
    prod.push(&r, &[2; 700], 0).unwrap();
    prod.publish(&r);
    let f = c.pop(&r).unwrap().unwrap();
    assert_eq!(f.len, 700);
    c.release(&r);
    // a new producer on the same ring: frame 2 is still queued at 704..1404
    let mut again = Producer::adopt(&r, l);
    again.push(&r, &[3; 300], 0).unwrap();
    // 1728..2048 and 0..704 are free: 700 bytes would end at frame 2's start
    assert_eq!(again.push(&r, &[4; 700], 0), Err(PushError::Full));
    again.publish(&r);
    for want in [2u8, 3] {
        let f = c.pop(&r).unwrap().unwrap();
        let mut b = vec![0u8; f.len];
        assert!(r.read(f.off, &mut b) && b.iter().all(|x| *x == want));
    }
}

#[test]
fn push_pop_wraps_and_fills() {
    let (r, l) = ring(4);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    for round in 0u32..10 {
        for i in 0..4u8 {
            p.push(&r, &[i, round as u8], 0).unwrap();
        }
        assert_eq!(p.push(&r, &[9], 0), Err(PushError::Full));
        p.publish(&r);
        for i in 0..4u8 {
            let f = c.pop(&r).unwrap().unwrap();
            let mut b = [0u8; 2];
            assert!(r.read(f.off, &mut b));
            assert_eq!(b, [i, round as u8]);
        }
        assert!(c.pop(&r).is_none());
        c.release(&r);
    }
    assert_eq!(p.stats.frames, 40);
    assert_eq!(c.stats.frames, 40);
    assert_eq!(p.stats.full, 10);
}

#[test]
fn parts_arrive_as_one_frame_and_too_much_is_refused() {
    let (r, l) = ring(2);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    p.push_parts(&r, &[b"head", b"", b"payload"], 7).unwrap();
    let big = [1u8; 100];
    assert_eq!(
        p.push_parts(&r, &[&big, &big], 0),
        Err(PushError::BadLength)
    );
    assert_eq!(p.push_parts(&r, &[b"", b""], 0), Err(PushError::BadLength));
    p.publish(&r);
    let f = c.pop(&r).unwrap().unwrap();
    let mut b = [0u8; 11];
    assert!(f.len == 11 && f.flags == 7 && r.read(f.off, &mut b));
    assert_eq!(&b, b"headpayload");
    assert!(c.pop(&r).is_none());
}

#[test]
fn a_frame_put_back_comes_again_and_its_slot_stays_the_consumers() {
    let (r, l) = ring(2);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    p.push(&r, b"a", 0).unwrap();
    p.push(&r, b"b", 0).unwrap();
    p.publish(&r);
    let f = c.pop(&r).unwrap().unwrap();
    c.unpop(&f);
    c.release(&r);
    // the producer still sees a full ring: the put-back frame's slot is not released
    assert_eq!(p.push(&r, b"c", 0), Err(PushError::Full));
    let again = c.pop(&r).unwrap().unwrap();
    assert_eq!((again.off, again.len), (f.off, f.len));
    let mut b = [0u8; 1];
    assert!(r.read(again.off, &mut b) && b == *b"a");
    assert_eq!(c.stats.frames, 1);
    assert!(c.pop(&r).is_some());
    assert!(c.pop(&r).is_none());
}

#[test]
fn committed_frames_are_visible_and_publish_updates_the_index() {
    let (r, l) = ring(8);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    assert!(!c.ready(&r));
    p.push(&r, b"x", 0).unwrap();
    assert!(
        c.ready(&r),
        "sequence number makes a committed frame visible"
    );
    assert_eq!(r.load_u32(l.prod_off(), Ordering::Acquire), 0);
    p.publish(&r);
    assert_eq!(r.load_u32(l.prod_off(), Ordering::Acquire), 1);
    assert!(c.pop(&r).is_some());
    assert!(!c.ready(&r));
}

#[test]
fn bad_descriptors_are_counted_and_skipped() {
    let (r, l) = ring(8);
    let mut c = Consumer::new(l);
    let cases = [
        (0u32, 0u32, BadDescriptor::ZeroLength),
        (0, 129, BadDescriptor::Oversize),
        (8 * 128 - 10, 20, BadDescriptor::OutOfBounds),
        (u32::MAX, 1, BadDescriptor::OutOfBounds),
    ];
    for (i, (off, len, _)) in cases.iter().enumerate() {
        let d = l.desc_off(i as u32);
        r.store_u32(d, *off, Ordering::Relaxed);
        r.store_u32(d + DESC_LEN, *len, Ordering::Relaxed);
        r.store_u32(d + DESC_SEQ, i as u32 + 1, Ordering::Relaxed);
    }
    r.store_u32(l.prod_off(), cases.len() as u32, Ordering::Release);
    for (_, _, want) in cases {
        assert_eq!(c.pop(&r), Some(Err(want)));
    }
    assert_eq!(c.stats.bad_desc, 3);
    assert_eq!(c.stats.oversize, 1);
}

#[test]
fn announced_frame_with_wrong_sequence_is_refused() {
    let (r, l) = ring(8);
    let mut c = Consumer::new(l);
    let d = l.desc_off(0);
    r.store_u32(d + DESC_LEN, 10, Ordering::Relaxed);
    r.store_u32(d + DESC_SEQ, 77, Ordering::Relaxed);
    assert!(c.pop(&r).is_none(), "nothing announced, nothing taken");
    r.store_u32(l.prod_off(), 1, Ordering::Release);
    assert_eq!(c.pop(&r), Some(Err(BadDescriptor::Sequence)));
    assert_eq!(c.stats.bad_desc, 1);
    assert!(c.pop(&r).is_none());
}

#[test]
fn impossible_producer_index_is_an_overrun_not_a_walk() {
    let (r, l) = ring(8);
    let mut c = Consumer::new(l);
    r.store_u32(l.prod_off(), 1000, Ordering::Release);
    assert!(c.pop(&r).is_none());
    assert_eq!(c.stats.ring_overrun, 1);
    // producer comes back to its senses
    r.store_u32(l.prod_off(), 0, Ordering::Release);
    assert!(c.pop(&r).is_none());
}

#[test]
fn hostile_consumer_index_cannot_make_room() {
    let (r, l) = ring(4);
    let mut p = Producer::new(l);
    for _ in 0..4 {
        p.push(&r, b"a", 0).unwrap();
    }
    p.publish(&r);
    // consumer claims to have read 100 frames of the 4 produced
    r.store_u32(l.cons_off(), 100, Ordering::Release);
    assert_eq!(p.push(&r, b"b", 0), Err(PushError::Full));
    assert_eq!(p.stats.ring_overrun, 1);
    // and a consumer index that goes backwards is refused too
    r.store_u32(l.cons_off(), 2, Ordering::Release);
    assert!(p.push(&r, b"b", 0).is_ok());
    r.store_u32(l.cons_off(), 1, Ordering::Release);
    p.push(&r, b"c", 0).unwrap();
    assert_eq!(p.push(&r, b"d", 0), Err(PushError::Full));
    assert_eq!(p.stats.ring_overrun, 2);
}

#[test]
fn adopt_resumes_indices() {
    let (r, l) = ring(8);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    for i in 0..5u8 {
        p.push(&r, &[i], 0).unwrap();
    }
    p.publish(&r);
    c.pop(&r);
    c.pop(&r);
    c.release(&r);
    let mut c2 = Consumer::adopt(&r, l);
    let mut p2 = Producer::adopt(&r, l);
    let f = c2.pop(&r).unwrap().unwrap();
    let mut b = [0u8];
    r.read(f.off, &mut b);
    assert_eq!(b, [2]);
    assert_eq!(p2.space(&r), 8 - 3);
}

#[test]
fn adopt_after_a_crash_between_commit_and_publish() {
    let (r, l) = ring(8);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    p.push(&r, b"a", 0).unwrap();
    p.publish(&r);
    // two more committed, never published; the consumer takes one of them by sequence
    p.push(&r, b"b", 0).unwrap();
    p.push(&r, b"c", 0).unwrap();
    c.pop(&r).unwrap().unwrap();
    c.pop(&r).unwrap().unwrap();
    c.release(&r);
    // restart both sides
    let mut p2 = Producer::adopt(&r, l);
    let mut c2 = Consumer::adopt(&r, l);
    let f = c2.pop(&r).unwrap().unwrap();
    let mut b = [0u8];
    r.read(f.off, &mut b);
    assert_eq!(&b, b"c", "the committed frame survives the restart");
    p2.push(&r, b"d", 0).unwrap();
    let f = c2.pop(&r).unwrap().unwrap();
    r.read(f.off, &mut b);
    assert_eq!(&b, b"d", "and the producer does not reuse its index");
    assert_eq!(p2.stats.ring_overrun + c2.stats.ring_overrun, 0);
}

#[test]
fn a_producer_asleep_on_a_full_ring_is_kicked_only_by_a_release_that_frees_slots() {
    let (r, l) = ring(4);
    let (mut p, mut c) = (Producer::new(l), Consumer::new(l));
    for _ in 0..4 {
        p.push(&r, &[1; 8], 0).unwrap();
    }
    p.publish(&r);
    assert!(!p.arm_space(&r), "full: may sleep");
    let word = || r.u32_at(l.space_off()).unwrap().load(Ordering::Relaxed);
    assert_eq!(word(), 1);
    assert!(!c.release_and_kick(&r), "nothing taken: no kick");
    assert_eq!(word(), 1);
    c.pop(&r).unwrap().unwrap();
    assert!(c.release_and_kick(&r), "a slot freed: kicked");
    assert_eq!(word(), 0);
    assert!(p.arm_space(&r), "space now: do not sleep");
    p.disarm_space(&r);
    assert_eq!(word(), 0);
}

#[test]
fn publish_kicks_only_a_sleeper() {
    let (r, l) = ring(8);
    let mut p = Producer::new(l);
    let mut c = Consumer::new(l);
    p.push(&r, b"a", 0).unwrap();
    assert!(!p.publish(&r));
    assert!(c.arm(&r), "work is pending, arm must say so");
    c.disarm(&r);
    c.pop(&r);
    c.release(&r);
    assert!(!c.arm(&r));
    p.push(&r, b"b", 0).unwrap();
    assert!(p.publish(&r), "consumer was armed: a kick is due");
    assert_eq!(c.sleep_word(&r).unwrap().load(Ordering::Relaxed), 0);
}

#[test]
fn a_producer_learns_when_its_consumer_took_every_frame_before_a_position() {
    let (r, l) = ring(8);
    let mut prod = Producer::new(l);
    let mut c = Consumer::new(l);
    assert!(prod.consumed(&r, prod.position()), "nothing queued");
    for i in 0..5u8 {
        prod.push(&r, &[i; 60], 0).unwrap();
    }
    prod.publish(&r);
    let at = prod.position();
    assert!(!prod.consumed(&r, at));
    for _ in 0..4 {
        c.pop(&r).unwrap().unwrap();
    }
    c.release(&r);
    assert!(!prod.consumed(&r, at), "one still queued");
    prod.push(&r, &[9; 60], 0).unwrap();
    prod.publish(&r);
    c.pop(&r).unwrap().unwrap();
    c.release(&r);
    assert!(prod.consumed(&r, at), "later frames do not count");
    // a consumer index beyond what was produced is refused, not believed
    r.store_u32(l.cons_off(), at.wrapping_add(100), Ordering::Release);
    assert!(!prod.consumed(&r, prod.position()));
}
