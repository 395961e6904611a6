//! Start-up time: reach a server the moment it answers. Fresh TCP connects, a new one every
//! retry interval (over DockLib the earlier ones stay in flight; over the kernel a try
//! unanswered within the interval is given up, its handshakes being far shorter), and ICMP
//! echo requests, side by side; the CLOCK_MONOTONIC time of the first answer of each
//! ([`ReachReport`]).

use crate::report::ReachReport;
use crate::stats::now_ns;
use anyhow::{bail, Context, Result};
use docknet_lib::{Stack, TcpStream};
use nix::sys::socket::{
    recvfrom, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol,
    SockType, SockaddrIn,
};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How hard to try.
#[derive(Debug, Clone, Copy)]
pub struct Reach {
    /// The server's TCP address.
    pub connect: SocketAddrV4,
    /// Ping this address as well.
    pub ping: Option<Ipv4Addr>,
    /// A try unanswered this long is given up and tried again.
    pub retry: Duration,
    /// Give up altogether after this long.
    pub timeout: Duration,
}

/// Connects (ends when one handshake completes); returns its time and the tries.
fn kernel_connect(r: &Reach, deadline: Instant) -> Result<(u64, u64)> {
    let mut tries = 0;
    loop {
        tries += 1;
        if std::net::TcpStream::connect_timeout(&r.connect.into(), r.retry).is_ok() {
            return Ok((now_ns(), tries));
        }
        if Instant::now() > deadline {
            bail!("no connect to {} answered in {:?}", r.connect, r.timeout);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// An ICMP echo request with `ident` and `seq`.
fn echo_request(ident: u16, seq: u16) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[0] = 8;
    p[4..6].copy_from_slice(&ident.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    p[8..].copy_from_slice(b"docknet!");
    let c = docknet_lib::frame::checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// Pings over a raw socket of the kernel until a reply comes; its time and the requests.
fn kernel_ping(dst: Ipv4Addr, r: &Reach, deadline: Instant) -> Result<(u64, u64)> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::empty(),
        SockProtocol::Icmp,
    )
    .context("a raw ICMP socket (needs root)")?;
    let us = r.retry.as_micros().clamp(100, 1_000_000) as i64;
    setsockopt(
        &fd,
        sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(us / 1_000_000, (us % 1_000_000) as _),
    )?;
    let ident = (std::process::id() & 0xffff) as u16;
    let to = SockaddrIn::from(SocketAddrV4::new(dst, 0));
    let mut buf = [0u8; 2048];
    for seq in 1u16.. {
        if Instant::now() > deadline {
            bail!("no echo reply from {dst} in {:?}", r.timeout);
        }
        // unreachable for now (no route or neighbour yet): try again after the interval
        if sendto(
            fd.as_raw_fd(),
            &echo_request(ident, seq),
            &to,
            MsgFlags::empty(),
        )
        .is_err()
        {
            std::thread::sleep(r.retry);
            continue;
        }
        let sent = Instant::now();
        while sent.elapsed() < r.retry {
            let Ok((n, from)) = recvfrom::<SockaddrIn>(fd.as_raw_fd(), &mut buf) else {
                break;
            };
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            let ok = from.is_some_and(|f| f.ip() == dst)
                && n >= ihl + 8
                && buf[ihl] == 0
                && buf[ihl + 4..ihl + 6] == ident.to_be_bytes();
            if ok {
                return Ok((now_ns(), u64::from(seq)));
            }
        }
    }
    unreachable!("the loop returns or fails")
}

/// When the echo thread (if one was started) got its answer, and after how many tries.
fn ping_result(
    ping: Option<std::thread::JoinHandle<Result<(u64, u64)>>>,
) -> Result<(Option<u64>, u64)> {
    match ping {
        Some(h) => {
            let (t, n) = h.join().expect("the ping thread")?;
            Ok((Some(t), n))
        }
        None => Ok((None, 0)),
    }
}

/// Over the kernel's sockets.
pub fn kernel(r: Reach) -> Result<ReachReport> {
    let start_ns = now_ns();
    let deadline = Instant::now() + r.timeout;
    let ping = r
        .ping
        .map(|dst| std::thread::spawn(move || kernel_ping(dst, &r, deadline)));
    let (connect_ns, connect_tries) = kernel_connect(&r, deadline)?;
    let (ping_ns, ping_tries) = ping_result(ping)?;
    Ok(ReachReport {
        start_ns,
        connect_ns,
        ping_ns,
        connect_tries,
        ping_tries,
    })
}

/// Over DockLib: `stack` is attached already.
pub fn docknet(stack: &Stack, r: Reach) -> Result<ReachReport> {
    let start_ns = now_ns();
    let deadline = Instant::now() + r.timeout;
    let pinger = stack.clone();
    let ping = r.ping.map(|dst| {
        std::thread::spawn(move || -> Result<(u64, u64)> {
            // each echo waits longer than the last (the retry interval, doubling to 100 ms): a
            // first reply can take longer than the interval (wake-ups, the neighbour), and a
            // request given up too soon would be tried again forever
            let mut wait = r.retry;
            for tries in 1u64.. {
                if pinger.ping(dst, 8, wait).is_ok() {
                    return Ok((now_ns(), tries));
                }
                if Instant::now() > deadline {
                    bail!("no echo reply from {dst} in {:?}", r.timeout);
                }
                wait = (wait * 2).min(Duration::from_millis(100));
            }
            unreachable!("the loop returns or fails")
        })
    });
    // A new connect every retry interval, and the earlier ones stay in flight: the first
    // handshake to complete ends it. A fresh DockLib handshake can take longer than the interval
    // (the server's first wake-ups), so giving tries up after it would try forever.
    const IN_FLIGHT: usize = 256;
    let mut tries = 0u64;
    let mut flight: Vec<TcpStream> = Vec::new();
    let mut next = Instant::now();
    let connect_ns = 'outer: loop {
        if Instant::now() >= next {
            tries += 1;
            if flight.len() >= IN_FLIGHT {
                flight.remove(0).abort();
            }
            flight.push(TcpStream::connect_start(stack, r.connect)?);
            next = Instant::now() + r.retry;
        }
        let mut i = 0;
        while i < flight.len() {
            match flight[i].connect_result() {
                Some(Ok(())) => break 'outer now_ns(),
                // refused: the server is not listening yet
                Some(Err(_)) => drop(flight.swap_remove(i)),
                None => i += 1,
            }
        }
        if Instant::now() > deadline {
            bail!("no connect to {} answered in {:?}", r.connect, r.timeout);
        }
        std::thread::sleep(Duration::from_micros(20));
    };
    for s in flight {
        s.abort();
    }
    let (ping_ns, ping_tries) = ping_result(ping)?;
    Ok(ReachReport {
        start_ns,
        connect_ns,
        ping_ns,
        connect_tries: tries,
        ping_tries,
    })
}
