//! Unix sockets that carry one file descriptor per message (`SOCK_SEQPACKET`, `SCM_RIGHTS`):
//! the daemon hands regions to containers over them, and to its fd holder. Abstract socket
//! names live in a network namespace, so a name bound inside a container's namespace is
//! reachable from that container only (the way memif and Calico-VPP hand out their rings).

use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

fn io_err(e: nix::Error) -> io::Error {
    io::Error::from(e)
}

fn seqpacket(nonblocking: bool) -> io::Result<OwnedFd> {
    let mut f = SockFlag::SOCK_CLOEXEC;
    if nonblocking {
        f |= SockFlag::SOCK_NONBLOCK;
    }
    socket::socket(AddressFamily::Unix, SockType::SeqPacket, f, None).map_err(io_err)
}

/// A non-blocking listening socket bound to the abstract name `name` (no leading `@`) in the
/// calling thread's network namespace.
pub fn listen_abstract(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket(true)?;
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(io_err)?;
    socket::bind(s.as_raw_fd(), &addr).map_err(io_err)?;
    socket::listen(&s, Backlog::new(16).map_err(io_err)?).map_err(io_err)?;
    Ok(s)
}

/// A listening socket bound to a filesystem path (mode as the directory allows).
pub fn listen_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let s = seqpacket(false)?;
    let addr = UnixAddr::new(path).map_err(io_err)?;
    socket::bind(s.as_raw_fd(), &addr).map_err(io_err)?;
    socket::listen(&s, Backlog::new(4).map_err(io_err)?).map_err(io_err)?;
    Ok(s)
}

/// Connects to the abstract name `name` (blocking socket).
pub fn connect_abstract(name: &str) -> io::Result<OwnedFd> {
    let s = seqpacket(false)?;
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(io_err)?;
    socket::connect(s.as_raw_fd(), &addr).map_err(io_err)?;
    Ok(s)
}

/// Connects to a filesystem path (blocking socket).
pub fn connect_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let s = seqpacket(false)?;
    let addr = UnixAddr::new(path).map_err(io_err)?;
    socket::connect(s.as_raw_fd(), &addr).map_err(io_err)?;
    Ok(s)
}

/// Accepts one connection, non-blocking and close-on-exec.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = socket::accept4(
        listener.as_raw_fd(),
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
    .map_err(io_err)?;
    Ok(own(fd))
}

/// Accepts one connection, blocking and close-on-exec (waits if the listener is blocking).
pub fn accept_blocking(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fd = socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC).map_err(io_err)?;
    Ok(own(fd))
}

/// A connected pair (in-process attachments and tests).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io_err)
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fl = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL).map_err(io_err)?);
    let fl = if on {
        fl | OFlag::O_NONBLOCK
    } else {
        fl - OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(fl)).map_err(io_err).map(drop)
}

/// Sends one message with `fd` attached (if any). A non-blocking socket whose queue is full
/// fails with `WouldBlock`: the receiver is not reading.
pub fn send(sock: BorrowedFd<'_>, msg: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let n = socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(msg)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io_err)?;
    if n != msg.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "message cut"));
    }
    Ok(())
}

/// Receives one message into `buf`: its length and the fd that came with it. `Ok(None)` at end
/// of stream. Extra fds beyond the first, and messages longer than `buf` (truncated), are
/// refused: the extra fds are closed.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(buf)];
    let r = socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io_err)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in r.cmsgs().map_err(io_err)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(own));
        }
    }
    let n = r.bytes;
    let truncated = r
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if truncated || fds.len() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message truncated or carrying more than one fd",
        ));
    }
    Ok(Some((n, fds.pop())))
}

/// The peer's process id, user and group (`SO_PEERCRED`).
pub fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<(i32, u32, u32)> {
    let c = socket::getsockopt(&sock.as_fd(), socket::sockopt::PeerCredentials).map_err(io_err)?;
    Ok((c.pid(), c.uid(), c.gid()))
}

/// Takes ownership of a descriptor the kernel just installed in our table for us.
#[allow(unsafe_code)]
fn own(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was returned by accept4 or arrived in SCM_RIGHTS in this very call: the
    // kernel installed it for us and nothing else in the process knows or owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_one_fd_and_end_of_stream_is_none() {
        let (a, b) = pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        send(a.as_fd(), b"one", Some(f.as_fd())).unwrap();
        send(a.as_fd(), b"two", None).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((&buf[..n], fd.is_some()), (&b"one"[..], true));
        let (n, fd) = recv(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((&buf[..n], fd.is_none()), (&b"two"[..], true));
        drop(a);
        assert!(recv(b.as_fd(), &mut buf).unwrap().is_none());
    }

    #[test]
    fn oversized_messages_are_refused() {
        let (a, b) = pair().unwrap();
        send(a.as_fd(), &[7u8; 100], None).unwrap();
        let mut small = [0u8; 10];
        assert!(recv(b.as_fd(), &mut small).is_err());
    }

    #[test]
    fn abstract_names_connect_and_a_full_queue_says_would_block() {
        let name = format!("docknet-test/{}", std::process::id());
        let l = listen_abstract(&name).unwrap();
        let c = connect_abstract(&name).unwrap();
        let s = accept(l.as_fd()).unwrap();
        let (pid, uid, _) = peer_cred(s.as_fd()).unwrap();
        assert_eq!(pid as u32, std::process::id());
        assert_eq!(uid, nix::unistd::Uid::effective().as_raw());
        // nobody reads `c`: the daemon side must not block
        let mut full = false;
        for _ in 0..100_000 {
            match send(s.as_fd(), &[0u8; 64], None) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(full);
        drop(c);
    }
}
