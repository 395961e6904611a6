//! TCP socket buffers kept from connections that ended, for the next ones.
//!
//! A socket's receive and send buffers (256 KiB each by default) are allocated zeroed, so
//! every connection wrote 512 KiB before its first byte moved: a third of a local `connect`'s
//! time over a fast channel, and as much again on the accepting side, where a server that
//! takes a connection per request (gunicorn's sync workers, a PHP pool, every `connect` of a
//! client library without a pool) pays it each time. Buffers of ended connections wait here,
//! up to [`KEEP`] of them in the process, and a new socket takes one of its size as it is. What
//! an earlier connection left in it is never read: a ring buffer hands out only what was
//! written into it since it was made, and the bytes are the same process's.

use smoltcp::socket::Socket;
use std::sync::Mutex;

/// Buffers kept at most (at DockLib's default size, 4 MiB).
const KEEP: usize = 16;

/// Buffers kept, of any size.
struct Kept(Mutex<Vec<Vec<u8>>>);

impl Kept {
    fn take(&self, len: usize) -> Vec<u8> {
        let mut k = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match k.iter().rposition(|b| b.len() == len) {
            Some(i) => k.swap_remove(i),
            None => {
                drop(k);
                vec![0; len]
            }
        }
    }

    fn recycle(&self, s: Socket<'static>) {
        let Socket::Tcp(t) = s else {
            return;
        };
        let (rx, tx) = t.into_buffers();
        let mut k = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for b in [rx, tx].into_iter().flatten() {
            if k.len() < KEEP {
                k.push(b);
            }
        }
    }
}

static KEPT: Kept = Kept(Mutex::new(Vec::new()));

/// A buffer of `len` bytes: one kept, or a new one.
pub(crate) fn take(len: usize) -> Vec<u8> {
    KEPT.take(len)
}

/// Keeps the buffers of a socket removed from its set (a TCP socket's; others are dropped).
pub(crate) fn recycle(s: Socket<'static>) {
    KEPT.recycle(s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::socket::tcp;

    #[test]
    fn a_socket_s_buffers_are_taken_again_at_their_size_and_the_count_is_bounded() {
        let len = 4096 + 17;
        let s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![7u8; len]),
            tcp::SocketBuffer::new(vec![9u8; len]),
        );
        let kept = Kept(Mutex::new(Vec::new()));
        kept.recycle(Socket::Tcp(s));
        let a = kept.take(len);
        let b = kept.take(len);
        assert_eq!(a.len(), len);
        assert_eq!(b.len(), len);
        // (the kept ones: their old bytes, not new zeroed ones)
        assert!(a.iter().all(|&x| x == 7 || x == 9) && b.iter().all(|&x| x == 7 || x == 9));
        // none left of that size: a new one
        assert_eq!(kept.take(len), vec![0; len]);
        for _ in 0..KEEP {
            let s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![1u8; len + 1]),
                tcp::SocketBuffer::new(vec![1u8; len + 1]),
            );
            kept.recycle(Socket::Tcp(s));
        }
        assert_eq!(kept.0.lock().unwrap().len(), KEEP);
    }
}
