//! Client commands: `status`, `pipe ...`, `fc ...`: one typed request, one reply printed as a
//! table or (`--json`) as the daemon's JSON.

use anyhow::Result;
use docknet_daemon::proto::{Client, FcInfo, PipeInfo, Status};
use serde::Serialize;
use std::path::Path;

/// A client of the daemon at `socket`.
pub fn client(socket: &Path) -> Result<Client> {
    Ok(Client::connect(socket)?)
}

/// Prints `v` as pretty JSON, or with `human`.
pub fn print<T: Serialize>(v: &T, json: bool, human: impl Fn(&T)) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        human(v);
    }
    Ok(())
}

/// Routes as a table.
pub fn print_routes(list: &Vec<docknet_daemon::proto::RouteInfo>) {
    println!("{:<20} {:<16} VXLAN", "NETWORK", "VIA");
    for r in list {
        let vni = r.vxlan.map_or_else(|| "-".to_string(), |v| v.to_string());
        println!("{:<20} {:<16} {vni}", r.net, r.via);
    }
}

/// Services as a table.
pub fn print_services(list: &Vec<docknet_daemon::proto::ServiceInfo>) {
    println!(
        "{:<24} {:<22} {:<5} {:<10} BACKENDS",
        "NAME", "ADDRESS", "PROTO", "AFFINITY"
    );
    for s in list {
        println!(
            "{:<24} {:<22} {:<5} {:<10} {}",
            s.name,
            s.address,
            service_proto(s.proto),
            match s.affinity {
                docknet_daemon::proto::ServiceAffinity::None => "none",
                docknet_daemon::proto::ServiceAffinity::ClientIp => "client-ip",
            },
            if s.backends.is_empty() {
                "- (connects refused)".into()
            } else {
                s.backends.join(",")
            }
        );
    }
}

/// `tcp` or `udp`.
pub fn service_proto(p: docknet_daemon::proto::ServiceProto) -> &'static str {
    match p {
        docknet_daemon::proto::ServiceProto::Tcp => "tcp",
        docknet_daemon::proto::ServiceProto::Udp => "udp",
    }
}

/// Pipes as a table.
pub fn print_pipes(list: &Vec<PipeInfo>) {
    println!(
        "{:<20} {:<18} {:<17} {:>6} {:>6}  fast channels",
        "NAME", "IP", "MAC", "MTU", "DEPTH"
    );
    for p in list {
        println!(
            "{:<20} {:<18} {:<17} {:>6} {:>6}  {}",
            p.name,
            p.ip,
            p.mac,
            p.mtu,
            p.ring_depth,
            if p.fast_channels.is_empty() {
                "-".into()
            } else {
                p.fast_channels.join(",")
            }
        );
        if let Some(a) = &p.ip6 {
            println!("{:<20} {a}", "");
        }
    }
}

/// One pipe with its counters.
pub fn print_pipe(p: &PipeInfo) {
    let fields: [(&str, String); 11] = [
        ("name", p.name.clone()),
        ("ip", p.ip.clone()),
        ("ip6", p.ip6.clone().unwrap_or_else(|| "-".into())),
        ("mac", p.mac.clone()),
        ("mtu", p.mtu.to_string()),
        ("ring_depth", p.ring_depth.to_string()),
        ("frame_size", p.frame_size.to_string()),
        ("region_bytes", p.region_bytes.to_string()),
        ("socket", p.socket.clone().unwrap_or_else(|| "-".into())),
        ("connections", p.connections.to_string()),
        ("fast_channels", format!("{:?}", p.fast_channels)),
    ];
    for (k, v) in fields {
        println!("{k:<14} {v}");
    }
    if !p.labels.is_empty() {
        println!("labels:");
        for (k, v) in &p.labels {
            println!("  {k} = {v}");
        }
    }
    if let Some(c) = &p.counters {
        println!("counters:");
        for (k, v) in c {
            println!("  {k:<18} {v}");
        }
    }
}

/// A created pipe, in one line.
pub fn print_created(p: &PipeInfo) {
    let ip6 = p.ip6.as_ref().map(|a| format!(", {a}")).unwrap_or_default();
    println!(
        "created pipe {} ({}{ip6}, mac {}, mtu {})",
        p.name, p.ip, p.mac, p.mtu
    );
}

/// A new fast channel, in one line.
pub fn print_fc(f: &FcInfo) {
    println!(
        "fast channel {} <-> {} (mtu {}, {} slots each way)",
        f.a, f.b, f.mtu, f.ring_depth
    );
}

/// `status`: the daemon's, or with none answering on `socket`, what a stopped daemon's fd holder
/// in `run_dir` (default: the socket's directory) still keeps (then exit status 1).
pub fn status(socket: &Path, run_dir: Option<&Path>, json: bool) -> Result<std::process::ExitCode> {
    let err = match client(socket).and_then(|mut c| Ok(c.status()?)) {
        Ok(s) => {
            print(&s, json, print_status)?;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        Err(e) => e,
    };
    let dir = run_dir.or(socket.parent()).unwrap_or(Path::new("."));
    let Some(held) = docknet_daemon::holder::held(dir) else {
        return Err(err);
    };
    if json {
        let v = serde_json::json!({ "daemon": null, "run_dir": dir, "held": held });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let until = held.seconds_left.map_or_else(
            || "until a daemon comes (--holder-grace forever)".to_string(),
            |s| format!("for {s} s more, then gives them up (--holder-grace)"),
        );
        println!(
            "no daemon answers on {}: {err:#}\nheld with no daemon: the fd holder (pid {}) keeps {} regions and sockets of {} for the next daemon, {until}",
            socket.display(),
            held.pid,
            held.kept,
            dir.display()
        );
    }
    Ok(std::process::ExitCode::FAILURE)
}

/// `status`.
pub fn print_status(s: &Status) {
    let fields: [(&str, String); 15] = [
        ("protocol", s.protocol.to_string()),
        ("version", s.version.clone()),
        ("pid", s.pid.to_string()),
        ("run_dir", s.run_dir.clone()),
        ("socket", s.socket.clone()),
        ("idle", s.idle.clone()),
        (
            "master_core",
            s.master_core.map_or("-".into(), |c| c.to_string()),
        ),
        ("pipes", s.pipes.to_string()),
        ("services", s.services.to_string()),
        ("forwarded", s.forwarded.to_string()),
        ("master_sleeps", s.master_sleeps.to_string()),
        (
            "masters",
            format!(
                "{} (cores {}, nice {}; {} frames between them, {} dropped)",
                s.masters,
                if s.master_cores.is_empty() {
                    "any".to_string()
                } else {
                    s.master_cores
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                },
                s.master_nice,
                s.cross_master,
                s.cross_master_drops
            ),
        ),
        (
            "cold_pipes",
            format!("{} ({} watcher threads)", s.cold_pipes, s.watchers),
        ),
        (
            "fast_channels",
            format!(
                "{} ({} automatic now; {} made, {} asks not served, {} removed idle)",
                s.fast_channels,
                s.auto_channels,
                s.auto_channels_made,
                s.auto_channels_skipped,
                s.auto_channels_reaped
            ),
        ),
        (
            "spare_regions",
            format!(
                "{} of {} ready ({:.1} MB each)",
                s.spare_regions_ready,
                s.spare_regions,
                s.spare_region_bytes as f64 / 1e6
            ),
        ),
    ];
    for (k, v) in fields {
        println!("{k:<14} {v}");
    }
    if let Some(n) = &s.nic {
        println!(
            "{:<14} {} ({}, {} queue{}, XDP {}, {}{}), mac {}, mtu {}, {} neighbour{}",
            "nic",
            n.iface,
            n.mode,
            n.queues,
            if n.queues == 1 { "" } else { "s" },
            n.attach,
            n.copy,
            if n.offload { ", segment offload" } else { "" },
            n.mac,
            n.mtu,
            n.neighbours,
            if n.neighbours == 1 { "" } else { "s" }
        );
        let c = &n.counters;
        println!(
            "{:<14} delivered {} sent {} not-for-us {} arp-requests {} arp-replies {}",
            "", c.delivered, c.sent, c.not_for_us, c.arp_requests, c.arp_replies
        );
        let drops = [
            ("malformed", c.drop_malformed),
            ("bad-checksum", c.drop_bad_checksum),
            ("too-big", c.drop_too_big),
            ("rx-full", c.drop_rx_full),
            ("unresolved", c.drop_unresolved),
            ("tx-full", c.drop_tx_full + n.port.tx_ring_full),
        ];
        let d: Vec<String> = drops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("{:<14} drops: {}", "", d.join(" "));
    }
}

/// `rate show` as text.
pub fn print_rate(r: &docknet_daemon::proto::RateInfo) {
    let fmt = |bps: u64| {
        if bps >= 1_000_000_000 {
            format!("{:.3} Gbit/s", bps as f64 / 1e9)
        } else if bps >= 1_000_000 {
            format!("{:.3} Mbit/s", bps as f64 / 1e6)
        } else {
            format!("{:.3} kbit/s", bps as f64 / 1e3)
        }
    };
    println!(
        "{}: timers fine {} us, coarse {} ms",
        r.pipe, r.fine_us, r.coarse_ms
    );
    for (what, d) in [("egress", &r.egress), ("ingress", &r.ingress)] {
        match d {
            None => println!("  {what:<8} unlimited"),
            Some(d) => println!(
                "  {what:<8} {} burst {} bits; credit {} bits, {} bytes through, {} waits{}",
                fmt(d.rate_bps),
                d.burst_bits,
                d.tokens_bits,
                d.passed_bytes,
                d.waits,
                d.queued_bytes
                    .map_or(String::new(), |q| format!(", {q} bytes queued"))
            ),
        }
    }
}
