//! Noticing pipes that talk: the master counts each pipe's unicast frames in a row to one
//! other pipe of this host, and asks the control plane for a fast channel between the two
//! once the run is long enough, or at once when the frame opens a TCP connection (a SYN
//! without ACK: the two are about to talk, however sparsely; [`crate::autofc`] decides and
//! builds it). One compare and an add per frame; an ask is a push into a bounded queue, at most
//! once a second per partner and a hundred times a second per pipe.

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
    /// Counts a frame to pipe `to` (`opens`: it opens a TCP connection, [`opens_connection`]);
    /// true when it is time to ask for a channel to it.
    pub(super) fn note(&mut self, to: u64, now_ns: u64, opens: bool) -> bool {
        if self.to == to {
            self.run = self.run.saturating_add(1);
        } else {
            self.to = to;
            self.run = 1;
        }
        if opens {
            // a connection's first segment counts for a whole run: a client that sends a
            // message a second would otherwise pay the master's hop (a second wake-up) for
            // half a minute before its run was long enough
            self.run = self.run.max(TALK_FRAMES);
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

/// Whether the frame whose first bytes are `hdr` opens a TCP connection: IPv4 or IPv6 (no
/// extension header), TCP, SYN without ACK. Reads only what `hdr` holds.
pub(super) fn opens_connection(hdr: &[u8]) -> bool {
    const ETH: usize = 14;
    let at = |i: usize| hdr.get(i).copied();
    let tcp = match (at(12), at(13)) {
        (Some(0x08), Some(0x00)) => match (at(ETH), at(ETH + 9)) {
            (Some(v), Some(6)) if v >> 4 == 4 && v & 0x0f >= 5 => ETH + usize::from(v & 0x0f) * 4,
            _ => return false,
        },
        (Some(0x86), Some(0xdd)) if at(ETH + 6) == Some(6) => ETH + 40,
        _ => return false,
    };
    at(tcp + 13).is_some_and(|f| f & 0x12 == 0x02)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_s_syn_asks_at_once_within_the_same_limits() {
        let mut t = Talk::default();
        assert!(t.note(7, 1_000, true), "a SYN asks at once");
        assert!(!t.note(7, 2_000, true), "not again within a second");
        assert!(
            !t.note(8, 3_000, true),
            "nor for a new partner within 10 ms"
        );
        assert!(t.note(8, 3_000 + TALK_NEW_NS, true));
    }

    #[test]
    fn a_syn_is_told_from_every_other_segment() {
        // Ethernet, IPv4 (20-byte header), TCP with the given flags
        let v4 = |flags: u8| {
            let mut f = vec![0u8; 14 + 20 + 20];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14] = 0x45;
            f[14 + 9] = 6;
            f[14 + 20 + 13] = flags;
            f
        };
        assert!(opens_connection(&v4(0x02)));
        assert!(!opens_connection(&v4(0x12)), "SYN-ACK");
        assert!(!opens_connection(&v4(0x10)), "ACK");
        let mut udp = v4(0x02);
        udp[14 + 9] = 17;
        assert!(!opens_connection(&udp));
        let mut v6 = vec![0u8; 14 + 40 + 20];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[14] = 0x60;
        v6[14 + 6] = 6;
        v6[14 + 40 + 13] = 0x02;
        assert!(opens_connection(&v6));
        // short or odd frames read as not opening anything
        assert!(!opens_connection(&v4(0x02)[..40]));
        let mut bad = v4(0x02);
        bad[14] = 0x44;
        assert!(!opens_connection(&bad));
        assert!(!opens_connection(&[]));
    }

    #[test]
    fn a_run_asks_once_then_once_a_second() {
        let mut t = Talk::default();
        let asks: usize = (0..TALK_FRAMES * 3)
            .map(|k| usize::from(t.note(7, 1_000 + u64::from(k), false)))
            .sum();
        assert_eq!(asks, 1, "a long run asks once");
        assert!(
            !t.note(7, 1_000 + TALK_RETRY_NS, false),
            "not before a second"
        );
        assert!(
            t.note(7, 2_000 + TALK_RETRY_NS, false),
            "and again a second later"
        );
    }

    #[test]
    fn alternating_partners_never_ask() {
        let mut t = Talk::default();
        for k in 0..10_000u64 {
            assert!(!t.note(1 + k % 2, k, false));
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
                asks += usize::from(t.note(k, now, false));
            }
        }
        assert!((99..=101).contains(&asks), "{asks}");
    }

    #[test]
    fn a_new_partner_starts_a_new_run() {
        let mut t = Talk::default();
        for k in 0..TALK_FRAMES - 1 {
            assert!(!t.note(1, u64::from(k), false));
        }
        assert!(!t.note(2, 100, false));
        let asked = (0..TALK_FRAMES).any(|k| t.note(2, 200 + u64::from(k), false));
        assert!(asked);
        // another partner is asked for as soon as its run is long enough and 10 ms passed
        let asked = (0..TALK_FRAMES).any(|k| t.note(3, 300 + u64::from(k), false));
        assert!(!asked, "not within 10 ms");
        assert!(t.note(3, 300 + TALK_NEW_NS, false));
    }
}
