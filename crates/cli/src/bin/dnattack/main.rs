//! dnattack: attacks DockNet from inside a container, to check that a hostile container can
//! hurt only itself. The tests and `scripts/soak.sh` run it under `docknet run`; each attack
//! prints one JSON line saying what it tried and what the kernel or the daemon answered.
//!
//!   dnattack truncate | grow | punch    try to take the pipe's memory away (sealed: refused)
//!   dnattack scribble --seconds S       random bytes over the whole region, continuously
//!   dnattack forge-rx                   leave the rx ring claiming queued frames at hostile
//!                                       places, for the next daemon to read back
//!   dnattack flood --seconds S          broadcast frames as fast as the ring takes them
//!   dnattack wake-storm --seconds S     toggle and FUTEX_WAKE the daemon's sleep word
//!   dnattack connect-storm --seconds S  connect to the pipe's socket over and over
//!   dnattack escape [--socket PATH]...  try to leave the sandbox (host files, devices,
//!                                       /proc/sys, mount, ptrace, host Unix sockets)
//!   dnattack fork-bomb --max N --hold S fork children that wait until N or the first
//!                                       refusal; say how many, hold them S seconds
//!   dnattack inspect                    what the daemon hands this container: its pipe and
//!                                       the fast channels it sees
//!   dnattack window-overrun --to IP:PORT --seconds S
//!                                       a TCP peer that fills a DockLib server's receive
//!                                       window and sends past every edge it offered
//!   dnattack stale-edge --to IP:PORT [--rounds N]
//!                                       half-open connections ended by a RST, each followed
//!                                       by one from the same port whose numbers start before
//!                                       the first's, sending up to the first's window edge
//!   dnattack channel-rewrite --to IP:PORT --seconds S [--their-frames]
//!                                       a fast-channel partner that streams TCP into a
//!                                       DockLib server and rewrites its frames, headers and
//!                                       payload, while the server reads them (or the
//!                                       server's frames while it writes them)
//!   dnattack lying-records --to IP:PORT [--rounds N]
//!                                       a fast-channel partner that sends records out of
//!                                       sequence, past the window, for no connection,
//!                                       malformed or spoofed, and honest ones
//!   dnattack syn-options --to IP:PORT [--mutations N] [--bytes N]
//!                                       SYNs with lying options, then a connection
//!                                       offering two MSS options
//!   dnattack syn-flood --to IP:PORT --seconds S
//!                                       SYNs from every port in turn, never completed
//!   dnattack vxlan-inject --to NODE --vni N --inner-src IP --inner-dst IP [--count K]
//!                                       VXLAN datagrams to another node's tunnel end,
//!                                       wrapping frames from an address not this pod's

#![deny(unsafe_code)]

mod overrun;
mod records;
mod rewrite;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use docknet_pipe::delivery::{Msg, DEFAULT_SOCKET, MAX_MSG};
use docknet_pipe::{fdpass, layout, Region, RegionInfo};
use serde_json::json;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Attacks DockNet from inside a container (run it under `docknet run`) and reports, as one
/// JSON line per attack, what it tried and what happened.
#[derive(Debug, Parser)]
#[command(name = "dnattack", version)]
struct Cli {
    /// The pipe's abstract socket (default: $DOCKNET_PIPE or @docknet/pipe).
    #[arg(long)]
    pipe: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// ftruncate the region to 0 (sealed against shrinking: must fail).
    Truncate,
    /// Grow the region (sealed against growing: must fail).
    Grow,
    /// Punch a hole in the region (reads zeros afterwards: the container's own loss).
    Punch,
    /// Random bytes over the whole region, continuously.
    Scribble {
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Leave the rx ring claiming that half its descriptors hold frames not yet taken, and a
    /// few more committed but not published, all at hostile places (offsets past the frame
    /// area, lengths past the largest frame): what a daemon that restarts now reads back.
    ForgeRx,
    /// Broadcast frames as fast as the tx ring takes them.
    Flood {
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Runs of unicast frames to each of many pipes, so the daemon sees this pipe talk to all of
    /// them and builds fast channels of its own; report how many channels this pipe got.
    ChannelGrab {
        /// The pipes' addresses.
        #[arg(long, value_delimiter = ',', required = true)]
        to: Vec<std::net::Ipv4Addr>,
        /// Frames to each.
        #[arg(long, default_value_t = 200)]
        frames: u32,
        /// Send TCP SYNs (a frame that opens a connection asks for a channel at once).
        #[arg(long)]
        syn: bool,
    },
    /// Toggle the daemon's sleep word on our tx ring and FUTEX_WAKE it, continuously.
    WakeStorm {
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Connect to the pipe's socket over and over.
    ConnectStorm {
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Print what the daemon hands this container: the pipe and the channels.
    Inspect,
    /// A TCP peer crafted by hand: fill a DockLib server's receive window (pipelined requests,
    /// answers never acknowledged), then send odd-sized segments past the furthest edge it
    /// offered; report what it acknowledged against the edges seen.
    WindowOverrun {
        /// The server (an HTTP server: the requests are GETs).
        #[arg(long)]
        to: std::net::SocketAddrV4,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// A fast-channel partner that sends lying records (an established connection's bytes
    /// outside TCP's segments): out of sequence, past the window, for no connection,
    /// malformed, spoofed, and honest ones; report, per kind, the resets and answers seen.
    LyingRecords {
        /// The server (an HTTP server: the honest records are GETs).
        #[arg(long)]
        to: std::net::SocketAddrV4,
        #[arg(long, default_value_t = 90)]
        rounds: u32,
    },
    /// Half-open connections ended by a RST, each followed by a connection from the same port
    /// whose numbers start 300 KB before the first's and which sends up to where the first's
    /// window ended, past its own buffer's room; report the segments sent past the room.
    StaleEdge {
        /// The server.
        #[arg(long)]
        to: std::net::SocketAddrV4,
        #[arg(long, default_value_t = 40)]
        rounds: u32,
    },
    /// A fast-channel partner that rewrites its frames, headers and payload, after it
    /// published them, while a DockLib server reads them (TCP connections crafted by hand,
    /// streaming requests); report what was sent and rewritten.
    ChannelRewrite {
        /// The server (an HTTP server: the segments carry GETs).
        #[arg(long)]
        to: std::net::SocketAddrV4,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Write random bytes where the server writes its frames to this side (the front of
        /// its ring's frame area, and just past the last frame it published) while it writes
        /// them, instead of rewriting this side's frames.
        #[arg(long)]
        their_frames: bool,
    },
    /// SYNs with lying options and lengths (and random changes of one) at a DockLib server,
    /// then one connection offering two MSS options that fetches `/bytes/N`; report what came.
    SynOptions {
        /// The server (an HTTP server).
        #[arg(long)]
        to: std::net::SocketAddrV4,
        /// SYNs changed at random bytes, beyond the crafted ones.
        #[arg(long, default_value_t = 2000)]
        mutations: u32,
        /// Bytes asked of the server on the completed connection.
        #[arg(long, default_value_t = 100_000)]
        bytes: usize,
    },
    /// SYNs at a DockLib server from every port of this container in turn, never completed:
    /// half-open connections on its listener for as long as the flood lasts.
    SynFlood {
        /// The server.
        #[arg(long)]
        to: std::net::SocketAddrV4,
        /// How long to flood.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// TCP segments (60 KiB unless said) to an address on the wire, most with a lie in a header
    /// the daemon reads to ask its link to cut them (segment offload): header lengths too small or
    /// past the frame, IPv4 total lengths past the frame or short of the headers, fragment
    /// bits, truncated frames and flipped header bytes; every fifth one truthful. Reports how
    /// many of each kind were sent.
    GsoLies {
        /// The address on the wire.
        #[arg(long)]
        to: std::net::Ipv4Addr,
        /// Segments to send.
        #[arg(long, default_value_t = 200)]
        count: u32,
        /// Payload bytes of each segment (before the lies): 61,440 (60 KiB) by default, for a
        /// link that cuts segments; one that fits a jumbo frame (8,900 on an MTU of 9,000)
        /// attacks a link whose frames span several buffers (AF_XDP's multi-buffer frames).
        #[arg(long, default_value_t = 60 * 1024, value_parser = clap::value_parser!(u32).range(100..=61_440))]
        payload: u32,
    },
    /// VXLAN datagrams from this pod to a node's tunnel end (UDP port 4789), each wrapping a
    /// UDP frame from `--inner-src` (another pod's address, say) to `--inner-dst`: what a pod
    /// would send to slip frames past its own daemon's source check.
    VxlanInject {
        /// The node (its link's address).
        #[arg(long)]
        to: std::net::Ipv4Addr,
        /// The network identifier to claim.
        #[arg(long)]
        vni: u32,
        /// The inner frame's source.
        #[arg(long)]
        inner_src: std::net::Ipv4Addr,
        /// The inner frame's destination.
        #[arg(long)]
        inner_dst: std::net::Ipv4Addr,
        /// Datagrams to send.
        #[arg(long, default_value_t = 100)]
        count: u32,
    },
    /// UDP datagrams to `--to`:`--port` claiming each `--src` in turn as their source (another
    /// pod's address, the node's, anyone's): what a pod would send to pass itself off as
    /// someone else beyond its pipe. Reports how many were sent from each.
    Spoof {
        /// Where to.
        #[arg(long)]
        to: std::net::Ipv4Addr,
        /// Its UDP port.
        #[arg(long, default_value_t = 9999)]
        port: u16,
        /// The sources to claim (repeat the option).
        #[arg(long = "src", required = true)]
        srcs: Vec<std::net::Ipv4Addr>,
        /// Datagrams from each source.
        #[arg(long, default_value_t = 50)]
        count: u32,
    },
    /// Fork children that wait, until `--max` or the first refusal; print how many (a first
    /// line, "holding": true), hold them `--hold` seconds, end them and print it again.
    ForkBomb {
        /// Children to try for.
        #[arg(long, default_value_t = 1000)]
        max: u32,
        /// Seconds to hold them before ending them.
        #[arg(long, default_value_t = 0.0)]
        hold: f64,
    },
    /// Try to leave the sandbox.
    Escape {
        /// Host Unix sockets to try to connect to.
        #[arg(long = "socket")]
        sockets: Vec<PathBuf>,
        /// Host files only their owner may read, to try to read.
        #[arg(long = "secret")]
        secrets: Vec<PathBuf>,
        /// Device nodes in a directory shown from the host, to try to open.
        #[arg(long = "device")]
        devices: Vec<PathBuf>,
    },
}

fn socket_name(cli: &Cli) -> String {
    cli.pipe
        .clone()
        .or_else(|| std::env::var("DOCKNET_PIPE").ok())
        .map(|s| s.trim_start_matches('@').to_string())
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// The pipe's memfd and its planned layout, as the daemon hands them out.
fn grab(name: &str) -> Result<(OwnedFd, RegionInfo, OwnedFd)> {
    let conn = fdpass::connect_abstract(name).with_context(|| format!("connecting to @{name}"))?;
    let mut buf = [0u8; MAX_MSG];
    let (n, fd) = fdpass::recv(conn.as_fd(), &mut buf)?.context("the daemon hung up")?;
    let Msg::Hello(p) = Msg::decode(&buf[..n])? else {
        bail!("no pipe in the first message");
    };
    let id = layout::Identity {
        ip_a: p.ip,
        ip_b_or_prefix: u32::from(p.prefix),
        mac_a: p.mac,
        mac_b: [0; 6],
        mtu: p.mtu,
    };
    let info = RegionInfo::planned(layout::Kind::Pipe, id, p.depth)?;
    Ok((fd.context("no region fd")?, info, conn))
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn main_inner(cli: Cli) -> Result<serde_json::Value> {
    let name = socket_name(&cli);
    let until = |s: f64| Instant::now() + Duration::from_secs_f64(s);
    Ok(match cli.cmd {
        Cmd::Truncate | Cmd::Grow => {
            let (fd, info, _c) = grab(&name)?;
            let f = std::fs::File::from(fd);
            let to = if matches!(cli.cmd, Cmd::Truncate) {
                0
            } else {
                info.size as u64 * 2
            };
            let r = f.set_len(to);
            json!({"attack": "resize", "to": to, "refused": r.is_err(),
                   "error": r.err().map(|e| e.to_string())})
        }
        Cmd::Punch => {
            let (fd, info, _c) = grab(&name)?;
            let flags = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
            let r = nix::fcntl::fallocate(&fd, flags, 0, info.size as i64);
            json!({"attack": "punch", "refused": r.is_err(), "error": r.err().map(|e| e.to_string())})
        }
        Cmd::Scribble { seconds } => {
            let (fd, info, _c) = grab(&name)?;
            let r = Region::map_sealed(fd.as_fd(), info.size)?;
            let (end, mut x, mut rounds) = (until(seconds), 0x9e37_79b9_7f4a_7c15u64, 0u64);
            while Instant::now() < end {
                for off in (0..r.len()).step_by(8) {
                    r.store_u64(off, xorshift(&mut x), Ordering::Relaxed);
                }
                rounds += 1;
            }
            json!({"attack": "scribble", "bytes": r.len(), "rounds": rounds})
        }
        Cmd::ForgeRx => {
            let (fd, info, _c) = grab(&name)?;
            let r = Region::map_sealed(fd.as_fd(), info.size)?;
            let ring = info.rings[1];
            let prod = r.load_u32(ring.prod_off(), Ordering::Acquire);
            let (queued, unpublished) = (ring.depth / 2, 4u32);
            let cons = prod.wrapping_sub(queued);
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for i in 0..queued + unpublished {
                let idx = cons.wrapping_add(i);
                let d = ring.desc_off(idx);
                let off = match i % 3 {
                    0 => u32::MAX - 63,
                    1 => ring.area_len as u32 + 64,
                    _ => xorshift(&mut x) as u32,
                };
                r.store_u32(d + layout::DESC_OFFSET, off, Ordering::Relaxed);
                r.store_u32(d + layout::DESC_LEN, u32::MAX >> (i % 8), Ordering::Relaxed);
                r.store_u32(d + layout::DESC_SEQ, idx.wrapping_add(1), Ordering::Release);
            }
            r.store_u32(ring.cons_off(), cons, Ordering::Release);
            json!({"attack": "forge-rx", "queued": queued, "unpublished": unpublished,
                   "prod": prod, "cons": cons})
        }
        Cmd::Flood { seconds } => {
            let mut ep = docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?;
            let mut f = vec![0u8; 60];
            docknet_lib::frame::write_ipv4_headers(
                &mut f,
                ep.mac(),
                [0xff; 6],
                ep.ip(),
                std::net::Ipv4Addr::BROADCAST,
                docknet_lib::frame::PROTO_EXPERIMENT,
                60,
            );
            let (end, mut sent) = (until(seconds), 0u64);
            while Instant::now() < end {
                for _ in 0..64 {
                    if ep.send(&f).is_ok() {
                        sent += 1;
                    }
                }
                ep.flush();
                let mut b = [0u8; 64];
                while ep.recv(&mut b).is_some() {}
            }
            json!({"attack": "flood", "sent": sent})
        }
        Cmd::ChannelGrab { to, frames, syn } => {
            let mut ep = docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?;
            let mut sent = 0u64;
            for ip in &to {
                let mac = ep
                    .resolve(*ip, Duration::from_secs(2))
                    .with_context(|| format!("no answer for {ip}"))?;
                let mut f = vec![0u8; 60];
                let proto = if syn {
                    6
                } else {
                    docknet_lib::frame::PROTO_EXPERIMENT
                };
                docknet_lib::frame::write_ipv4_headers(
                    &mut f,
                    ep.mac(),
                    mac,
                    ep.ip(),
                    *ip,
                    proto,
                    if syn { 54 } else { 60 },
                );
                if syn {
                    // ports 40000 -> 9, data offset 5 words, SYN (no checksum: the daemon
                    // looks at the flags, the victim's stack drops the segment)
                    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
                    f[36..38].copy_from_slice(&9u16.to_be_bytes());
                    f[46] = 5 << 4;
                    f[47] = 0x02;
                    f[48..50].copy_from_slice(&1024u16.to_be_bytes());
                }
                for _ in 0..frames {
                    if ep
                        .send_blocking(&f, Instant::now() + Duration::from_secs(1))
                        .is_ok()
                    {
                        sent += 1;
                    }
                }
                // the channel, if the daemon builds one, arrives within its next turn
                std::thread::sleep(Duration::from_millis(100));
                ep.refresh();
            }
            std::thread::sleep(Duration::from_millis(300));
            ep.refresh();
            json!({"attack": "channel-grab", "sent": sent, "channels": ep.fc_peers().len()})
        }
        Cmd::WakeStorm { seconds } => {
            let (fd, info, _c) = grab(&name)?;
            let r = Region::map_sealed(fd.as_fd(), info.size)?;
            let word = r
                .u32_at(info.rings[0].sleep_off())
                .context("sleep word out of range")?;
            let (end, mut wakes) = (until(seconds), 0u64);
            while Instant::now() < end {
                word.store(0, Ordering::Relaxed);
                docknet_pipe::wake::wake(word);
                word.store(1, Ordering::Relaxed);
                wakes += 1;
            }
            json!({"attack": "wake-storm", "wakes": wakes})
        }
        Cmd::ConnectStorm { seconds } => {
            let (end, mut ok, mut refused) = (until(seconds), 0u64, 0u64);
            let mut held = Vec::new();
            while Instant::now() < end {
                match fdpass::connect_abstract(&name) {
                    Ok(c) => {
                        ok += 1;
                        if held.len() < 64 {
                            held.push(c);
                        }
                    }
                    Err(_) => refused += 1,
                }
            }
            json!({"attack": "connect-storm", "connected": ok, "refused": refused})
        }
        Cmd::Escape {
            sockets,
            secrets,
            devices,
        } => escape(&sockets, &secrets, &devices),
        Cmd::ForkBomb { max, hold } => fork_bomb(max, hold)?,
        Cmd::WindowOverrun { to, seconds } => overrun::run(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            to,
            seconds,
        )?,
        Cmd::LyingRecords { to, rounds } => records::run(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            to,
            rounds,
        )?,
        Cmd::StaleEdge { to, rounds } => overrun::stale_edge(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            to,
            rounds,
        )?,
        Cmd::ChannelRewrite {
            to,
            seconds,
            their_frames,
        } => rewrite::run(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            &name,
            to,
            seconds,
            their_frames,
        )?,
        Cmd::SynOptions {
            to,
            mutations,
            bytes,
        } => overrun::syn_options(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            to,
            mutations,
            bytes,
        )?,
        Cmd::SynFlood { to, seconds } => overrun::syn_flood(
            docknet_lib::Endpoint::connect(&name, docknet_pipe::IdlePolicy::Spin)?,
            to,
            seconds,
        )?,
        Cmd::GsoLies { to, count, payload } => gso_lies(&name, to, count, payload as usize)?,
        Cmd::VxlanInject {
            to,
            vni,
            inner_src,
            inner_dst,
            count,
        } => vxlan_inject(&name, to, vni, inner_src, inner_dst, count)?,
        Cmd::Spoof {
            to,
            port,
            srcs,
            count,
        } => spoof(&name, to, port, &srcs, count)?,
        Cmd::Inspect => {
            let conn = fdpass::connect_abstract(&name)
                .with_context(|| format!("connecting to @{name}"))?;
            let (mut pipe, mut channels, mut services) = (None, Vec::new(), None);
            let mut buf = [0u8; MAX_MSG];
            loop {
                let (n, fd) = fdpass::recv(conn.as_fd(), &mut buf)?.context("hung up")?;
                match Msg::decode(&buf[..n])? {
                    Msg::Hello(p) => pipe = Some(p.name),
                    Msg::Channel(c) => channels.push(c.peer),
                    Msg::Synced => break,
                    Msg::Closed { .. } | Msg::Gateway { .. } => {}
                    Msg::Services { len } => {
                        let fd = fd.context("a services table without its memfd")?;
                        let table = docknet_pipe::services::read_sealed(&fd, len as usize)?;
                        // try to change the table every container reads: write, truncate,
                        // and a writable shared mapping
                        let f = std::fs::File::from(fd);
                        let write = std::os::unix::fs::FileExt::write_at(&f, b"X", 0).is_ok();
                        let truncate = f.set_len(0).is_ok();
                        // SAFETY: a fresh mapping of the received memfd, never dereferenced;
                        // unmapped at once when it was made.
                        #[allow(unsafe_code)]
                        let mapped = unsafe {
                            let p = libc::mmap(
                                std::ptr::null_mut(),
                                len as usize,
                                libc::PROT_READ | libc::PROT_WRITE,
                                libc::MAP_SHARED,
                                std::os::fd::AsRawFd::as_raw_fd(&f),
                                0,
                            );
                            let ok = p != libc::MAP_FAILED;
                            if ok {
                                libc::munmap(p, len as usize);
                            }
                            ok
                        };
                        services = Some(json!({
                            "count": table.len(),
                            "written": write,
                            "truncated": truncate,
                            "mapped_writable": mapped,
                        }));
                    }
                }
            }
            let mut out = json!({"pipe": pipe, "channels": channels});
            // a table only when the daemon has services (sent before `Synced`)
            if let Some(t) = services {
                out["services"] = t;
            }
            out
        }
    })
}

/// `dnattack vxlan-inject`: `count` VXLAN datagrams from this pod's own address (so its daemon's
/// source check passes) to node `to`'s port 4789, each wrapping a UDP frame from `inner_src` to
/// `inner_dst` under identifier `vni`.
fn vxlan_inject(
    name: &str,
    to: std::net::Ipv4Addr,
    vni: u32,
    inner_src: std::net::Ipv4Addr,
    inner_dst: std::net::Ipv4Addr,
    count: u32,
) -> Result<serde_json::Value> {
    use docknet_lib::frame::write_ipv4_headers;
    const ETH: usize = 14;
    let mut ep = docknet_lib::Endpoint::connect(name, docknet_pipe::IdlePolicy::Spin)?;
    // the inner frame: Ethernet, IPv4, UDP to port 9 and 16 bytes
    let inner_len = ETH + 20 + 8 + 16;
    let mut inner = vec![0u8; inner_len];
    write_ipv4_headers(
        &mut inner,
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        inner_src,
        inner_dst,
        17,
        inner_len,
    );
    inner[ETH + 20..ETH + 22].copy_from_slice(&4000u16.to_be_bytes());
    inner[ETH + 22..ETH + 24].copy_from_slice(&9u16.to_be_bytes());
    inner[ETH + 24..ETH + 26].copy_from_slice(&24u16.to_be_bytes());
    // the outer datagram: this pod to the node, UDP to 4789, the VXLAN header
    let total = ETH + 20 + 8 + 8 + inner_len;
    let mut f = vec![0u8; total];
    write_ipv4_headers(&mut f, ep.mac(), [2, 0, 0, 0, 0, 3], ep.ip(), to, 17, total);
    let udp = &mut f[ETH + 20..ETH + 28];
    udp[0..2].copy_from_slice(&50000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&4789u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((total - ETH - 20) as u16).to_be_bytes());
    f[ETH + 28] = 0x08;
    f[ETH + 32..ETH + 35].copy_from_slice(&vni.to_be_bytes()[1..4]);
    f[ETH + 36..].copy_from_slice(&inner);
    let mut sent = 0u64;
    for _ in 0..count {
        while ep.send(&f).is_err() {
            ep.flush();
            ep.idle(Duration::from_micros(50));
        }
        sent += 1;
        ep.flush();
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(json!({"attack": "vxlan-inject", "sent": sent}))
}

/// Sends `count` UDP datagrams to `to:port` from each of `srcs` ([`Cmd::Spoof`]), through the
/// daemon (the gateway's MAC: whatever the daemon answers ARP with).
fn spoof(
    name: &str,
    to: std::net::Ipv4Addr,
    port: u16,
    srcs: &[std::net::Ipv4Addr],
    count: u32,
) -> Result<serde_json::Value> {
    use docknet_lib::frame::write_ipv4_headers;
    const ETH: usize = 14;
    let mut ep = docknet_lib::Endpoint::connect(name, docknet_pipe::IdlePolicy::Spin)?;
    let payload = b"dnattack spoof";
    let total = ETH + 20 + 8 + payload.len();
    let mut sent = serde_json::Map::new();
    for &src in srcs {
        let mut f = vec![0u8; total];
        write_ipv4_headers(&mut f, ep.mac(), [2, 0, 0, 0, 0, 3], src, to, 17, total);
        let udp = &mut f[ETH + 20..ETH + 28];
        udp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        udp[2..4].copy_from_slice(&port.to_be_bytes());
        udp[4..6].copy_from_slice(&((total - ETH - 20) as u16).to_be_bytes());
        // UDP checksum 0: none, which IPv4 allows
        f[ETH + 28..].copy_from_slice(payload);
        for _ in 0..count {
            while ep.send(&f).is_err() {
                ep.flush();
                ep.idle(Duration::from_micros(50));
            }
            ep.flush();
            std::thread::sleep(Duration::from_micros(200));
        }
        sent.insert(src.to_string(), json!(count));
    }
    Ok(json!({"attack": "spoof", "sent": sent}))
}

/// Sends `count` TCP segments of `payload` bytes from this pipe to `to`, most of them lying in
/// a header that segment offload reads ([`Cmd::GsoLies`]).
fn gso_lies(
    name: &str,
    to: std::net::Ipv4Addr,
    count: u32,
    payload: usize,
) -> Result<serde_json::Value> {
    use docknet_lib::frame::write_ipv4_headers;
    const ETH: usize = 14;
    let mut ep = docknet_lib::Endpoint::connect(name, docknet_pipe::IdlePolicy::Spin)?;
    let total = ETH + 20 + 20 + payload;
    let mut base = vec![0u8; total];
    write_ipv4_headers(
        &mut base,
        ep.mac(),
        [2, 0, 0, 0, 0, 3],
        ep.ip(),
        to,
        6,
        total,
    );
    base[ETH + 6] = 0x40; // DF
    let tcp = ETH + 20;
    base[tcp..tcp + 2].copy_from_slice(&40000u16.to_be_bytes());
    base[tcp + 2..tcp + 4].copy_from_slice(&9u16.to_be_bytes());
    base[tcp + 12] = 5 << 4; // data offset: 20 bytes
    base[tcp + 13] = 0x18; // PSH, ACK
    base[tcp + 14..tcp + 16].copy_from_slice(&1024u16.to_be_bytes());
    let kinds = [
        "truthful",
        "tcp-offset-small",
        "tcp-offset-past",
        "ip-length-past",
        "ip-length-short",
        "ip-header-long",
        "more-fragments",
        "fragment-offset",
        "truncated",
        "flipped",
    ];
    let mut sent = std::collections::BTreeMap::<&str, u64>::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(count);
    let send = |ep: &mut docknet_lib::Endpoint, f: &[u8]| {
        while ep.send(f).is_err() {
            ep.flush();
            ep.idle(Duration::from_micros(50));
        }
        ep.flush();
    };
    // one truthful segment first, and time for the daemon to resolve `to` on the wire, so
    // that the lies meet the edge's checks rather than the wait for an ARP answer
    send(&mut ep, &base);
    *sent.entry(kinds[0]).or_default() += 1;
    std::thread::sleep(Duration::from_millis(300));
    for i in 1..count {
        let mut f = base.clone();
        // every fifth one truthful, the others each lie in turn
        let kind = if i % 5 == 0 {
            kinds[0]
        } else {
            kinds[1 + (i as usize) % (kinds.len() - 1)]
        };
        match kind {
            "tcp-offset-small" => f[tcp + 12] = 2 << 4,
            "tcp-offset-past" => {
                f[tcp + 12] = 15 << 4;
                f[tcp + 20..tcp + 60].fill(0xfe);
            }
            "ip-length-past" => f[ETH + 2..ETH + 4].copy_from_slice(&65535u16.to_be_bytes()),
            "ip-length-short" => f[ETH + 2..ETH + 4].copy_from_slice(&30u16.to_be_bytes()),
            "ip-header-long" => f[ETH] = 0x4f,
            "more-fragments" => f[ETH + 6] = 0x20,
            "fragment-offset" => f[ETH + 6..ETH + 8].copy_from_slice(&0x0100u16.to_be_bytes()),
            "truncated" => f.truncate(ETH + 30),
            "flipped" => {
                for _ in 0..4 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // bytes of the TCP header and the payload's start (a lie about the
                    // addresses is dropped before the edge: another test's)
                    let at = ETH + 20 + (seed % 40) as usize;
                    f[at] ^= (seed >> 8) as u8 | 1;
                }
            }
            _ => {}
        }
        send(&mut ep, &f);
        *sent.entry(kind).or_default() += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(json!({"attack": "gso-lies", "sent": sent}))
}

/// Forks up to `max` children that only wait, stopping at the first refusal; prints how many
/// (and why it stopped), holds them `hold` seconds, then ends them.
fn fork_bomb(max: u32, hold: f64) -> Result<serde_json::Value> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::{fork, ForkResult};
    use std::io::Write;
    let mut kids = Vec::new();
    let mut refused = None;
    for _ in 0..max {
        // SAFETY: this program has a single thread (nothing before this spawned one), so the
        // child may run anything; it only waits for its signal.
        #[allow(unsafe_code)]
        let forked = unsafe { fork() };
        match forked {
            Ok(ForkResult::Child) => loop {
                nix::unistd::pause();
            },
            Ok(ForkResult::Parent { child }) => kids.push(child),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let report = |holding: bool| {
        json!({
            "attack": "fork-bomb",
            "forks": kids.len(),
            "refused": refused.map(|e| e.desc()),
            "errno": refused.map(|e| e as i32),
            "holding": holding,
        })
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", report(true))?;
    out.flush()?;
    drop(out);
    std::thread::sleep(Duration::from_secs_f64(hold.max(0.0)));
    for k in &kids {
        let _ = kill(*k, Signal::SIGKILL);
    }
    for k in &kids {
        let _ = nix::sys::wait::waitpid(*k, None);
    }
    Ok(report(false))
}

/// Each way out, tried; `true` means it worked (a hole).
fn escape(sockets: &[PathBuf], secrets: &[PathBuf], devices: &[PathBuf]) -> serde_json::Value {
    // first, before this program opens anything: descriptors it was started with beyond the
    // standard three (one of a host directory would lead out of the root)
    let inherited: Vec<i32> = (3..1024)
        .filter(|fd| {
            // SAFETY: F_GETFD only asks whether the descriptor is open; nothing is borrowed
            #[allow(unsafe_code)]
            let r = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
            r >= 0
        })
        .collect();
    let ok = |r: bool| serde_json::Value::Bool(r);
    let write = |p: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p)
            .is_ok()
    };
    let block_dev = std::fs::read_dir("/dev").ok().is_some_and(|d| {
        d.flatten().any(|e| {
            use std::os::unix::fs::FileTypeExt;
            e.file_type().is_ok_and(|t| t.is_block_device())
        })
    }) || [
        "/dev/vda",
        "/dev/sda",
        "/dev/nvme0n1",
        "/dev/mem",
        "/dev/kmsg",
    ]
    .iter()
    .any(|p| std::fs::File::open(p).is_ok());
    let mount = nix::mount::mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .is_ok();
    let unshare = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
    let ptrace_init = nix::sys::ptrace::attach(nix::unistd::Pid::from_raw(1)).is_ok();
    let host_sockets: Vec<serde_json::Value> = sockets
        .iter()
        .map(|p| {
            let stream = std::os::unix::net::UnixStream::connect(p).is_ok();
            let seq = fdpass::connect_path(p).is_ok();
            json!({"path": p, "connected": stream || seq})
        })
        .collect();
    let shadow = std::fs::read("/etc/shadow").is_ok_and(|b| !b.is_empty());
    let secret = secrets
        .iter()
        .any(|p| std::fs::read(p).is_ok_and(|b| !b.is_empty()));
    // the inodes the container is shown from the host (its device nodes, the masks over
    // secrets and kernel files, the system directories): a change of their mode or times
    // would be the host's. Each is set to the mode it has, so a hole changes nothing.
    let chmod_host = [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/etc/shadow",
        "/proc/kcore",
        "/etc/passwd",
        "/usr/bin",
    ]
    .iter()
    .any(|p| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m.permissions().mode()))
                .is_ok()
        })
    });
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("CapEff:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        });
    json!({
        "attack": "escape",
        "write_etc": ok(write("/etc/dnattack")),
        "write_usr": ok(write("/usr/dnattack")),
        "write_root": ok(write("/dnattack")),
        "write_proc_sys": ok(std::fs::write("/proc/sys/kernel/domainname", "x").is_ok()),
        "write_sysrq": ok(std::fs::write("/proc/sysrq-trigger", "h").is_ok()),
        "read_kcore": ok(std::fs::File::open("/proc/kcore").and_then(|f| {
            use std::io::Read;
            let mut b = [0u8; 16];
            (&f).read(&mut b)
        }).is_ok_and(|n| n > 0)),
        "read_shadow": ok(shadow),
        "read_secret": ok(secret),
        "open_device": ok(devices.iter().any(|p| std::fs::File::open(p).is_ok())),
        "inherited_fds": inherited,
        "uid": nix::unistd::geteuid().as_raw(),
        "block_device": ok(block_dev),
        "chmod_host_inode": ok(chmod_host),
        "mount": ok(mount),
        "unshare_user": ok(unshare),
        "ptrace_init": ok(ptrace_init),
        "host_sockets": host_sockets,
        "cap_eff": caps,
        "tty": ok(std::fs::File::open("/dev/tty").is_ok()),
    })
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dnattack: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
