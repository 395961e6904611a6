//! Noticing pipes that talk: the master counts each pipe's unicast frames in a row to one
//! other pipe of this host, and asks the control plane for a fast channel between the two
//! once the run is long enough ([`crate::autofc`] decides and builds it). One compare and an
//! add per frame; an ask is a push into a bounded queue, at most once a second per partner and
//! a hundred times a second per pipe.

/// Frames in a row from one pipe to another before the master asks for a channel: a
/// connection that has exchanged a few dozen segments, not a probe or a lone datagram.
pub const TALK_FRAMES: u32 = 32;
/// A pipe asks again for the same partner at most this often (nanoseconds), while its frames
/// keep going through the daemon (the channel was refused, or removed since).
pub const TALK_RETRY_NS: u64 = 1_000_000_000;
/// A pipe asks for a new partner at most this often (nanoseconds): at most 100 asks a second
/// from a pipe that changes partners at every run.
pub const TALK_NEW_NS: u64 = 10_000_000;

/// One pipe's current run of frames to one partner.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Talk {
    /// The partner's pipe id.
    to: u64,
    /// Frames in a row to it.
    run: u32,
    /// When this pipe last asked (ns, monotonic; 0: never).
    asked_ns: u64,
    /// For which partner.
    asked_to: u64,
}

impl Talk {
    /// Counts a frame to pipe `to`; true when it is time to ask for a channel to it.
    pub(super) fn note(&mut self, to: u64, now_ns: u64) -> bool {
        if self.to == to {
            self.run = self.run.saturating_add(1);
        } else {
            self.to = to;
            self.run = 1;
        }
        if self.run < TALK_FRAMES {
            return false;
        }
        let since = now_ns.saturating_sub(self.asked_ns);
        let wait = if self.asked_to == to {
            TALK_RETRY_NS
        } else {
            TALK_NEW_NS
        };
        if self.asked_ns == 0 || since >= wait {
            self.asked_ns = now_ns.max(1);
            self.asked_to = to;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_asks_once_then_once_a_second() {
        let mut t = Talk::default();
        let asks: usize = (0..TALK_FRAMES * 3)
            .map(|k| usize::from(t.note(7, 1_000 + u64::from(k))))
            .sum();
        assert_eq!(asks, 1, "a long run asks once");
        assert!(!t.note(7, 1_000 + TALK_RETRY_NS), "not before a second");
        assert!(t.note(7, 2_000 + TALK_RETRY_NS), "and again a second later");
    }

    #[test]
    fn alternating_partners_never_ask() {
        let mut t = Talk::default();
        for k in 0..10_000u64 {
            assert!(!t.note(1 + k % 2, k));
        }
    }

    #[test]
    fn a_pipe_that_changes_partners_asks_at_most_a_hundred_times_a_second() {
        let mut t = Talk::default();
        let mut asks = 0;
        // a new partner every run, a frame every 10 ns: a second of frames
        for k in 0..100_000_000u64 / u64::from(TALK_FRAMES) {
            for f in 0..u64::from(TALK_FRAMES) {
                let now = 1 + (k * u64::from(TALK_FRAMES) + f) * 10;
                asks += usize::from(t.note(k, now));
            }
        }
        assert!((99..=101).contains(&asks), "{asks}");
    }

    #[test]
    fn a_new_partner_starts_a_new_run() {
        let mut t = Talk::default();
        for k in 0..TALK_FRAMES - 1 {
            assert!(!t.note(1, u64::from(k)));
        }
        assert!(!t.note(2, 100));
        let asked = (0..TALK_FRAMES).any(|k| t.note(2, 200 + u64::from(k)));
        assert!(asked);
        // another partner is asked for as soon as its run is long enough and 10 ms passed
        let asked = (0..TALK_FRAMES).any(|k| t.note(3, 300 + u64::from(k)));
        assert!(!asked, "not within 10 ms");
        assert!(t.note(3, 300 + TALK_NEW_NS));
    }
}
