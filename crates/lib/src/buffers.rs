//! TCP socket buffers kept from connections that ended, for the next ones.
//!
//! A socket's receive and send buffers (256 KiB each by default) are allocated zeroed, so
//! every connection wrote 512 KiB before its first byte moved: a third of a local `connect`'s
//! time over a fast channel, and as much again on the accepting side, where a server that
//! takes a connection per request (gunicorn's sync workers, a PHP pool, every `connect` of a
//! client library without a pool) pays it each time. Buffers of ended connections wait here,
//! up to [`KEEP_BYTES`] in the process, and a new socket takes one of its size as it is. What
//! an earlier connection left in it is never read: a ring buffer hands out only what was
//! written into it since it was made, and the bytes are the same process's. The pool's lock is
//! only ever tried, never waited for.

use smoltcp::socket::Socket;
use std::sync::Mutex;

/// Bytes kept at most (sixteen buffers of DockLib's default 256 KiB). The oldest buffers go
/// first when a new one needs room: those of a size no stack makes any more do not stay.
const KEEP_BYTES: usize = 4 << 20;

/// Buffers kept, of any size, oldest first.
struct Kept(Mutex<Vec<Vec<u8>>>);

impl Kept {
    /// Never waits for the lock (a forked child's copy of it may be held by a thread that is
    /// not there, and the pool is only a shortcut): without it, a new buffer.
    fn take(&self, len: usize) -> Vec<u8> {
        if let Ok(mut k) = self.0.try_lock() {
            if let Some(i) = k.iter().rposition(|b| b.len() == len) {
                return k.remove(i);
            }
        }
        vec![0; len]
    }

    /// Keeps a TCP socket's buffers (others are dropped); what does not fit is freed after
    /// the lock is let go.
    fn recycle(&self, s: Socket<'static>) {
        let Socket::Tcp(t) = s else {
            return;
        };
        let (rx, tx) = t.into_buffers();
        let mut gone: Vec<Vec<u8>> = Vec::new();
        if let Ok(mut k) = self.0.try_lock() {
            for b in [rx, tx].into_iter().flatten() {
                if b.len() > KEEP_BYTES {
                    gone.push(b);
                    continue;
                }
                let mut held: usize = k.iter().map(Vec::len).sum();
                while held + b.len() > KEEP_BYTES && !k.is_empty() {
                    let old = k.remove(0);
                    held -= old.len();
                    gone.push(old);
                }
                k.push(b);
            }
        }
        drop(gone);
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
    fn a_socket_s_buffers_are_taken_again_at_their_size_and_the_bytes_kept_are_bounded() {
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
        // bounded by bytes: the oldest go first, whatever their size
        let big = KEEP_BYTES / 4;
        for _ in 0..8 {
            let s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![1u8; big]),
                tcp::SocketBuffer::new(vec![1u8; big]),
            );
            kept.recycle(Socket::Tcp(s));
        }
        let k = kept.0.lock().unwrap();
        assert_eq!(k.len(), 4);
        assert!(k.iter().map(Vec::len).sum::<usize>() <= KEEP_BYTES);
        drop(k);
        // a buffer larger than the bound is not kept
        let s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![1u8; KEEP_BYTES + 1]),
            tcp::SocketBuffer::new(vec![1u8; 8]),
        );
        kept.recycle(Socket::Tcp(s));
        assert_eq!(
            kept.take(KEEP_BYTES + 1)
                .iter()
                .filter(|&&x| x != 0)
                .count(),
            0
        );
        assert_eq!(kept.take(8), vec![1u8; 8]);
    }
}
