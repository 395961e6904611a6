//! The two stacks behind one trait.

use docknet_lib::{Stack, TcpListener, TcpStream, UdpSocket};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// A UDP socket of either stack.
pub trait Datagram: Send + 'static {
    /// Sends one datagram.
    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize>;
    /// Receives one datagram (`TimedOut`/`WouldBlock` after the read timeout).
    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)>;
    /// Sets the receive timeout.
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()>;
}

impl Datagram for std::net::UdpSocket {
    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        std::net::UdpSocket::send_to(self, buf, to)
    }
    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        std::net::UdpSocket::recv_from(self, buf)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        std::net::UdpSocket::set_read_timeout(self, t)
    }
}

impl Datagram for UdpSocket {
    fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        UdpSocket::send_to(self, buf, to)
    }
    fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        UdpSocket::recv_from(self, buf)
    }
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        UdpSocket::set_read_timeout(self, t);
        Ok(())
    }
}

/// A network stack a measurement runs over.
pub trait Net: Clone + Send + Sync + 'static {
    /// A UDP socket.
    type Udp: Datagram;
    /// Binds a UDP socket (port 0: any).
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<Self::Udp>;
    /// A connected TCP stream.
    type Stream: Read + Write + Send + 'static;
    /// A TCP listener.
    type Listener: Send + 'static;
    /// `kernel` or `docknet`.
    fn name(&self) -> &'static str;
    /// Listens on `addr`.
    fn listen(&self, addr: SocketAddr) -> io::Result<Self::Listener>;
    /// Waits for a connection.
    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Stream>;
    /// Connects to `addr`. `nodelay`: Nagle off (request/response); otherwise the stack's
    /// throughput setting (Nagle on, as both stacks do by default for bulk senders).
    fn connect(&self, addr: SocketAddr, nodelay: bool) -> io::Result<Self::Stream>;
    /// Sends FIN.
    fn shutdown_write(&self, s: &mut Self::Stream) -> io::Result<()>;
    /// MTU of the link the stack sends on, if known.
    fn mtu(&self) -> Option<u32>;
}

/// Kernel sockets (`std::net`).
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelNet;

impl Net for KernelNet {
    type Udp = std::net::UdpSocket;
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<Self::Udp> {
        std::net::UdpSocket::bind(addr)
    }
    type Stream = std::net::TcpStream;
    type Listener = std::net::TcpListener;

    fn name(&self) -> &'static str {
        "kernel"
    }

    fn listen(&self, addr: SocketAddr) -> io::Result<Self::Listener> {
        std::net::TcpListener::bind(addr)
    }

    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Stream> {
        let (s, _) = l.accept()?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    fn connect(&self, addr: SocketAddr, nodelay: bool) -> io::Result<Self::Stream> {
        // the server may still be starting: retry a refused connect for a few seconds
        let t = Instant::now();
        loop {
            match std::net::TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_nodelay(nodelay)?;
                    return Ok(s);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && t.elapsed() < Duration::from_secs(5) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn shutdown_write(&self, s: &mut Self::Stream) -> io::Result<()> {
        s.shutdown(std::net::Shutdown::Write)
    }

    fn mtu(&self) -> Option<u32> {
        None
    }
}

/// MTU of the kernel interface that holds `addr` (from `/sys/class/net/*/mtu`), if found.
pub fn kernel_mtu(addr: impl Into<IpAddr>) -> Option<u32> {
    let addr = addr.into();
    let ifs = nix::ifaddrs::getifaddrs().ok()?;
    for i in ifs {
        let a = i.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
        });
        if a == Some(addr) {
            let m =
                std::fs::read_to_string(format!("/sys/class/net/{}/mtu", i.interface_name)).ok()?;
            return m.trim().parse().ok();
        }
    }
    None
}

/// DockLib sockets over the container's DockPipe.
#[derive(Debug, Clone)]
pub struct DockNet {
    /// The stack.
    pub stack: Stack,
    /// The pipe's MTU.
    pub mtu: u32,
}

impl Net for DockNet {
    type Udp = UdpSocket;
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<Self::Udp> {
        UdpSocket::bind(&self.stack, addr.port())
    }
    type Stream = TcpStream;
    type Listener = TcpListener;

    fn name(&self) -> &'static str {
        "docknet"
    }

    fn listen(&self, addr: SocketAddr) -> io::Result<Self::Listener> {
        let mine = match addr.ip() {
            IpAddr::V4(a) => a.is_unspecified() || a == self.stack.ip(),
            IpAddr::V6(a) => a.is_unspecified() || self.stack.ip6().is_some_and(|(m, _)| m == a),
        };
        if !mine {
            let v6 = self
                .stack
                .ip6()
                .map(|(a, _)| format!(", {a}"))
                .unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!(
                    "{} is not this pipe's address ({}{v6})",
                    addr.ip(),
                    self.stack.ip()
                ),
            ));
        }
        TcpListener::bind(&self.stack, addr.port())
    }

    fn accept(&self, l: &mut Self::Listener) -> io::Result<Self::Stream> {
        l.accept().map(|(s, _)| s)
    }

    fn connect(&self, addr: SocketAddr, nodelay: bool) -> io::Result<Self::Stream> {
        let t = Instant::now();
        loop {
            match TcpStream::connect(&self.stack, addr) {
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && t.elapsed() < Duration::from_secs(5) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(s) => {
                    s.set_nodelay(nodelay);
                    return Ok(s);
                }
                r => return r,
            }
        }
    }

    fn shutdown_write(&self, s: &mut Self::Stream) -> io::Result<()> {
        s.shutdown_write();
        Ok(())
    }

    fn mtu(&self) -> Option<u32> {
        Some(self.mtu)
    }
}
