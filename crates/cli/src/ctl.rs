//! Client commands: `status`, `pipe ...`, `fc ...`.

use anyhow::Result;
use docknet_daemon::proto::{Client, Request};
use serde_json::Value;
use std::path::Path;

/// Sends one request and returns the result.
pub fn call(socket: &Path, req: Request) -> Result<Value> {
    let mut c = Client::connect(socket)?;
    Ok(c.call(&req)?)
}

fn s(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        x => x.to_string(),
    }
}

/// Prints pipes as a table.
pub fn print_pipes(list: &Value) {
    println!(
        "{:<20} {:<18} {:<17} {:>6} {:>6}  fast channels",
        "NAME", "IP", "MAC", "MTU", "DEPTH"
    );
    for p in list.as_array().into_iter().flatten() {
        let fcs: Vec<String> = p["fast_channels"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(String::from))
            .collect();
        println!(
            "{:<20} {:<18} {:<17} {:>6} {:>6}  {}",
            s(p, "name"),
            s(p, "ip"),
            s(p, "mac"),
            s(p, "mtu"),
            s(p, "ring_depth"),
            if fcs.is_empty() {
                "-".into()
            } else {
                fcs.join(",")
            }
        );
    }
}

/// Prints one pipe with its counters.
pub fn print_pipe(p: &Value) {
    for k in [
        "name",
        "ip",
        "mac",
        "mtu",
        "ring_depth",
        "frame_size",
        "region_bytes",
        "map",
    ] {
        println!("{k:<14} {}", s(p, k));
    }
    println!("{:<14} {}", "fast_channels", p["fast_channels"]);
    if let Some(c) = p["counters"].as_object() {
        println!("counters:");
        for (k, v) in c {
            println!("  {k:<18} {v}");
        }
    }
}

/// Prints `status`.
pub fn print_status(v: &Value) {
    if let Some(o) = v.as_object() {
        for (k, x) in o {
            println!(
                "{k:<14} {}",
                x.as_str().map_or_else(|| x.to_string(), String::from)
            );
        }
    }
}
