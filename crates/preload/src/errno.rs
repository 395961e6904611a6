//! DockLib's errors as the errno values Linux gives for the same event.

use crate::sys::Errno;
use std::io::{self, ErrorKind};

/// The call that failed, where Linux's errno depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `connect` (a timeout is ETIMEDOUT).
    Connect,
    /// A read, write or accept (a timeout from SO_RCVTIMEO/SO_SNDTIMEO is EAGAIN).
    Io,
    /// `bind`/`listen`.
    Bind,
}

/// The errno for `e` from `op`.
pub fn of(e: &io::Error, op: Op) -> Errno {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        ErrorKind::WouldBlock => libc::EAGAIN,
        ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        ErrorKind::ConnectionReset => libc::ECONNRESET,
        ErrorKind::ConnectionAborted => libc::ECONNABORTED,
        ErrorKind::BrokenPipe => libc::EPIPE,
        ErrorKind::NotConnected => match op {
            // the pipe is gone: the network is, for this socket
            Op::Connect => libc::ENETUNREACH,
            _ => libc::ENOTCONN,
        },
        ErrorKind::TimedOut => match op {
            Op::Connect => libc::ETIMEDOUT,
            _ => libc::EAGAIN,
        },
        ErrorKind::AddrInUse => libc::EADDRINUSE,
        ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
        ErrorKind::InvalidInput => match op {
            Op::Bind => libc::EINVAL,
            _ => libc::EINVAL,
        },
        ErrorKind::Interrupted => libc::EINTR,
        ErrorKind::OutOfMemory => libc::ENOMEM,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_linux_errnos() {
        let e = |k| io::Error::from(k);
        assert_eq!(of(&e(ErrorKind::WouldBlock), Op::Io), libc::EAGAIN);
        assert_eq!(
            of(&e(ErrorKind::ConnectionRefused), Op::Connect),
            libc::ECONNREFUSED
        );
        assert_eq!(of(&e(ErrorKind::ConnectionReset), Op::Io), libc::ECONNRESET);
        assert_eq!(of(&e(ErrorKind::BrokenPipe), Op::Io), libc::EPIPE);
        assert_eq!(of(&e(ErrorKind::TimedOut), Op::Connect), libc::ETIMEDOUT);
        assert_eq!(of(&e(ErrorKind::TimedOut), Op::Io), libc::EAGAIN);
        assert_eq!(of(&e(ErrorKind::AddrInUse), Op::Bind), libc::EADDRINUSE);
        assert_eq!(of(&e(ErrorKind::NotConnected), Op::Io), libc::ENOTCONN);
        assert_eq!(
            of(&e(ErrorKind::NotConnected), Op::Connect),
            libc::ENETUNREACH
        );
        assert_eq!(
            of(&io::Error::from_raw_os_error(libc::EMFILE), Op::Io),
            libc::EMFILE
        );
        assert_eq!(of(&io::Error::other("x"), Op::Io), libc::EIO);
    }
}
