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
    }
}

/// One pipe with its counters.
pub fn print_pipe(p: &PipeInfo) {
    let fields: [(&str, String); 10] = [
        ("name", p.name.clone()),
        ("ip", p.ip.clone()),
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
    if let Some(c) = &p.counters {
        println!("counters:");
        for (k, v) in c {
            println!("  {k:<18} {v}");
        }
    }
}

/// A created pipe, in one line.
pub fn print_created(p: &PipeInfo) {
    println!(
        "created pipe {} ({}, mac {}, mtu {})",
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

/// `status`.
pub fn print_status(s: &Status) {
    let fields: [(&str, String); 10] = [
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
        ("forwarded", s.forwarded.to_string()),
        ("master_sleeps", s.master_sleeps.to_string()),
    ];
    for (k, v) in fields {
        println!("{k:<14} {v}");
    }
}
