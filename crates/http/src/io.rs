//! One event loop over two stacks: the [`Io`] trait has what an HTTP server and a load
//! generator need (non-blocking accept, connect, read, write, and a level-triggered wait over
//! many sockets), implemented by kernel sockets ([`KernelIo`]: `poll(2)`) and by DockLib
//! ([`DockIo`]: [`docknet_lib::Stack::wait`]). Both are level-triggered, so the loops above
//! are written once.

use docknet_lib::{Interest, Ready, Stack, TcpListener, TcpStream, Watch};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::io::{self, Read, Write};
use std::net::SocketAddrV4;
use std::os::fd::AsFd;
use std::time::Duration;

/// A socket in a wait: the listener, or a connection and what it waits for.
#[derive(Debug)]
pub enum Item<'a, L, C> {
    /// Ready when a connection can be accepted.
    Listener(&'a L),
    /// Ready per its interest (or on an error).
    Conn(&'a C, Interest),
}

/// What the loops need of a network stack.
pub trait Io: Clone + Send + 'static {
    /// A listening socket.
    type Listener: Send;
    /// A connection.
    type Conn: Send;
    /// The stack's name (`kernel`, `docknet`).
    fn name(&self) -> &'static str;
    /// Listens on `addr`.
    fn listen(&self, addr: SocketAddrV4) -> io::Result<Self::Listener>;
    /// Accepts a waiting connection (`WouldBlock` if none).
    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Conn>;
    /// Starts connecting to `addr` without waiting.
    fn connect(&self, addr: SocketAddrV4) -> io::Result<Self::Conn>;
    /// How the connect went: `None` while in progress.
    fn connected(&self, c: &mut Self::Conn) -> Option<io::Result<()>>;
    /// Non-blocking read (`WouldBlock`; 0: end of stream).
    fn read(&self, c: &mut Self::Conn, buf: &mut [u8]) -> io::Result<usize>;
    /// Non-blocking write (`WouldBlock`).
    fn write(&self, c: &mut Self::Conn, buf: &[u8]) -> io::Result<usize>;
    /// Ends the sending side once what was written has gone (a FIN after the data).
    fn shutdown_write(&self, c: &mut Self::Conn);
    /// Waits until an item is ready or `timeout` passes; `(index, ready)` into `out`.
    fn wait(
        &self,
        items: &[Item<'_, Self::Listener, Self::Conn>],
        timeout: Option<Duration>,
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<()>;
}

/// Kernel sockets, non-blocking, waited on with `poll(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelIo;

fn flags(i: Interest) -> PollFlags {
    let mut f = PollFlags::empty();
    if i.read {
        f |= PollFlags::POLLIN;
    }
    if i.write {
        f |= PollFlags::POLLOUT;
    }
    f
}

impl Io for KernelIo {
    type Listener = std::net::TcpListener;
    type Conn = std::net::TcpStream;

    fn name(&self) -> &'static str {
        "kernel"
    }

    fn listen(&self, addr: SocketAddrV4) -> io::Result<Self::Listener> {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    }

    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Conn> {
        let (c, _) = l.accept()?;
        c.set_nonblocking(true)?;
        c.set_nodelay(true)?;
        Ok(c)
    }

    fn connect(&self, addr: SocketAddrV4) -> io::Result<Self::Conn> {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        s.set_tcp_nodelay(true)?;
        match s.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok(s.into())
    }

    fn connected(&self, c: &mut Self::Conn) -> Option<io::Result<()>> {
        // a failed connect leaves its error in SO_ERROR (read once, then cleared)
        match c.take_error() {
            Ok(Some(e)) | Err(e) => return Some(Err(e)),
            Ok(None) => {}
        }
        match c.peer_addr() {
            Ok(_) => Some(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn read(&self, c: &mut Self::Conn, buf: &mut [u8]) -> io::Result<usize> {
        c.read(buf)
    }

    fn write(&self, c: &mut Self::Conn, buf: &[u8]) -> io::Result<usize> {
        c.write(buf)
    }

    fn shutdown_write(&self, c: &mut Self::Conn) {
        let _ = c.shutdown(std::net::Shutdown::Write);
    }

    fn wait(
        &self,
        items: &[Item<'_, Self::Listener, Self::Conn>],
        timeout: Option<Duration>,
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<()> {
        out.clear();
        let mut fds: Vec<PollFd<'_>> = items
            .iter()
            .map(|it| match it {
                Item::Listener(l) => PollFd::new(l.as_fd(), PollFlags::POLLIN),
                Item::Conn(c, i) => PollFd::new(c.as_fd(), flags(*i)),
            })
            .collect();
        let t = match timeout {
            None => PollTimeout::NONE,
            Some(d) => PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX),
        };
        match nix::poll::poll(&mut fds, t) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(()),
            Err(e) => return Err(io::Error::from(e)),
        }
        for (i, f) in fds.iter().enumerate() {
            let r = f.revents().unwrap_or(PollFlags::empty());
            if r.is_empty() {
                continue;
            }
            let hup = r.contains(PollFlags::POLLHUP);
            let error = r.contains(PollFlags::POLLERR);
            out.push((
                i,
                Ready {
                    read: r.contains(PollFlags::POLLIN) || hup || error,
                    write: r.contains(PollFlags::POLLOUT) || error,
                    hup,
                    error,
                },
            ));
        }
        Ok(())
    }
}

/// Which stack a program's sockets use (its `--stack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StackKind {
    /// The kernel's TCP/IP (std sockets, poll(2)).
    Kernel,
    /// DockLib over the container's DockPipe (run it under `docknet run --pipe NAME`).
    Docknet,
}

/// DockLib sockets over the container's pipe.
#[derive(Debug, Clone)]
pub struct DockIo(pub Stack);

impl DockIo {
    /// DockLib on the pipe this process was started on (`docknet run --pipe NAME`), its calls
    /// waiting as `idle` says (spin, adaptive, adaptive:SPIN_US, adaptive:SPIN_US:YIELD_US, block).
    pub fn attach(idle: &str) -> anyhow::Result<DockIo> {
        let idle =
            docknet_pipe::IdlePolicy::parse(idle).map_err(|e| anyhow::anyhow!("--idle: {e}"))?;
        let stack = Stack::attach_default(docknet_lib::StackConfig {
            idle,
            ..docknet_lib::StackConfig::default()
        })?;
        Ok(DockIo(stack))
    }
}

impl Io for DockIo {
    type Listener = TcpListener;
    type Conn = TcpStream;

    fn name(&self) -> &'static str {
        "docknet"
    }

    fn listen(&self, addr: SocketAddrV4) -> io::Result<Self::Listener> {
        if !addr.ip().is_unspecified() && *addr.ip() != self.0.ip() {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{} is not this pipe's address ({})", addr.ip(), self.0.ip()),
            ));
        }
        TcpListener::bind(&self.0, addr.port())
    }

    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Conn> {
        l.try_accept().map(|(c, _)| c)
    }

    fn connect(&self, addr: SocketAddrV4) -> io::Result<Self::Conn> {
        TcpStream::connect_start(&self.0, addr)
    }

    fn connected(&self, c: &mut Self::Conn) -> Option<io::Result<()>> {
        c.connect_result()
    }

    fn read(&self, c: &mut Self::Conn, buf: &mut [u8]) -> io::Result<usize> {
        c.try_read(buf)
    }

    fn write(&self, c: &mut Self::Conn, buf: &[u8]) -> io::Result<usize> {
        // sent by the loop's next wait, in one poll with every other connection's
        c.try_write_deferred(buf)
    }

    fn shutdown_write(&self, c: &mut Self::Conn) {
        c.shutdown_write();
    }

    fn wait(
        &self,
        items: &[Item<'_, Self::Listener, Self::Conn>],
        timeout: Option<Duration>,
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<()> {
        let w: Vec<Watch<'_>> = items
            .iter()
            .map(|it| match it {
                Item::Listener(l) => Watch::Listener(l),
                Item::Conn(c, i) => Watch::Stream(c, *i),
            })
            .collect();
        self.0.wait(&w, timeout, out)
    }
}
