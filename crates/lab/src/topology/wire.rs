//! Two hosts joined by a wire, in namespaces of the lab's own: `hostA` and `hostB`, each with
//! its end of the wire as `eth0` (192.168.77.1 and .2), and between them a switch namespace
//! whose bridge joins the two ends. Removed on drop (deleting a namespace removes its links).
//!
//! The switch is where the wire is shaped (`--wire-rate`, `--wire-delay`): a qdisc on each of
//! its two ports, so traffic in both directions passes it whoever sends it. (A qdisc on the
//! hosts' own ends would not do: AF_XDP and AF_PACKET with qdisc bypass transmit past it.)

use crate::proc::{checked, ip, unique};
use anyhow::{bail, Context, Result};
use std::process::Command;

/// Host A's address on the wire.
pub const HOST_A: &str = "192.168.77.1";
/// Host B's address on the wire.
pub const HOST_B: &str = "192.168.77.2";
/// The wire's subnet length.
pub const WIRE_PREFIX: u8 = 24;
/// Each host's end of the wire.
pub const WIRE_DEV: &str = "eth0";

/// How the wire is shaped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Rate in tc's syntax (`10gbit`), per direction.
    pub rate: Option<String>,
    /// One-way delay in tc's syntax (`10us`).
    pub delay: Option<String>,
}

impl Shape {
    /// In words, for results (`None`: unshaped).
    pub fn describe(&self) -> Option<String> {
        match (&self.rate, &self.delay) {
            (None, None) => None,
            (r, d) => Some(format!(
                "rate {}, delay {} (tc on the switch's ports)",
                r.as_deref().unwrap_or("unlimited"),
                d.as_deref().unwrap_or("0")
            )),
        }
    }

    /// The rate in Gbps, if shaped (tc units: bit, kbit, mbit, gbit, tbit; bps and its
    /// multiples are bytes per second).
    pub fn gbps(&self) -> Option<f64> {
        let r = self.rate.as_deref()?;
        let digits = r.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let v: f64 = digits.parse().ok()?;
        let bits = match &r[digits.len()..] {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            "bps" => 8.0,
            "kbps" => 8e3,
            "mbps" => 8e6,
            "gbps" => 8e9,
            _ => return None,
        };
        Some(v * bits / 1e9)
    }

    /// Checks the values' shape (digits then a unit) before `tc` sees them.
    pub fn check(&self) -> Result<()> {
        let ok = |v: &str, units: &[&str]| {
            let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let unit = &v[digits.len()..];
            !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
                && units.contains(&unit)
        };
        if let Some(r) = &self.rate {
            if !ok(
                r,
                &[
                    "bit", "kbit", "mbit", "gbit", "tbit", "bps", "kbps", "mbps", "gbps",
                ],
            ) {
                bail!("--wire-rate {r:?}: use a tc rate such as 10gbit or 500mbit");
            }
        }
        if let Some(d) = &self.delay {
            if !ok(d, &["us", "ms", "s", "usec", "msec"]) {
                bail!("--wire-delay {d:?}: use a tc time such as 10us or 1ms");
            }
        }
        Ok(())
    }
}

impl Shape {
    /// Whether this kernel has the qdiscs the shape needs, tried on a veth in a namespace of
    /// our own (TBF for the rate, netem for the delay).
    pub fn probe(&self) -> Result<()> {
        if self.rate.is_none() && self.delay.is_none() {
            return Ok(());
        }
        let ns = unique("q");
        let tc = |args: &[&str]| {
            checked(
                Command::new("ip")
                    .args(["netns", "exec", &ns, "tc"])
                    .args(args),
                "tc",
            )
        };
        let r = ip(&["netns", "add", &ns]).and_then(|_| {
            ip(&[
                "-n", &ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
            ])?;
            if self.delay.is_some() {
                tc(&["qdisc", "add", "dev", "p0", "root", "netem", "delay", "1us"]).map_err(
                    |_| {
                        anyhow::anyhow!(
                        "--wire-delay needs the netem qdisc (sch_netem), which this kernel does \
                         not have: leave --wire-delay out"
                    )
                    },
                )?;
                tc(&["qdisc", "del", "dev", "p0", "root"])?;
            }
            if self.rate.is_some() {
                tc(&[
                    "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1gbit", "burst", "64kb",
                    "latency", "1ms",
                ])
                .map_err(|_| {
                    anyhow::anyhow!(
                        "--wire-rate needs the TBF qdisc (sch_tbf), which this kernel does \
                             not have: leave --wire-rate out"
                    )
                })?;
            }
            Ok(())
        });
        let _ = ip(&["netns", "del", &ns]);
        r
    }
}

/// The two hosts and the wire.
#[derive(Debug)]
pub struct Wire {
    /// Host A's namespace (the clients' host).
    pub host_a: String,
    /// Host B's namespace (the servers' host).
    pub host_b: String,
    /// The switch's namespace.
    pub switch: String,
    /// The wire's MTU.
    pub mtu: u32,
    namespaces: Vec<String>,
}

impl Wire {
    /// Builds the hosts and the wire at `mtu`, shaped as `shape` says; on error, removes what
    /// was built.
    pub fn build(mtu: u32, shape: &Shape) -> Result<Wire> {
        shape.check()?;
        let base = unique("");
        let mut w = Wire {
            host_a: format!("{base}hA"),
            host_b: format!("{base}hB"),
            switch: format!("{base}sw"),
            mtu,
            namespaces: Vec::new(),
        };
        let m = mtu.to_string();
        for ns in [w.switch.clone(), w.host_a.clone(), w.host_b.clone()] {
            ip(&["netns", "add", &ns])?;
            w.namespaces.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &w.switch, "link", "add", "sw0", "type", "bridge"])?;
        ip(&["-n", &w.switch, "link", "set", "sw0", "up"])?;
        for (host, port, addr) in [(&w.host_a, "pa", HOST_A), (&w.host_b, "pb", HOST_B)] {
            ip(&[
                "-n", &w.switch, "link", "add", port, "mtu", &m, "type", "veth", "peer", "name",
                WIRE_DEV, "mtu", &m, "netns", host,
            ])?;
            ip(&["-n", &w.switch, "link", "set", port, "master", "sw0"])?;
            ip(&["-n", &w.switch, "link", "set", port, "up"])?;
            ip(&[
                "-n",
                host,
                "addr",
                "add",
                &format!("{addr}/{WIRE_PREFIX}"),
                "dev",
                WIRE_DEV,
            ])?;
            ip(&["-n", host, "link", "set", WIRE_DEV, "up"])?;
            w.shape_port(port, shape)?;
        }
        Ok(w)
    }

    fn tc(&self, args: &[&str]) -> Result<()> {
        checked(
            Command::new("ip")
                .args(["netns", "exec", &self.switch, "tc"])
                .args(args),
            &format!("tc {}", args.join(" ")),
        )
        .map(drop)
    }

    /// netem for the delay, TBF under it for the rate (or TBF alone).
    fn shape_port(&self, port: &str, shape: &Shape) -> Result<()> {
        // a burst of at least one 64 KiB GSO frame, else TBF drops what the kernel modes send
        let tbf = |parent: &[&str], rate: &str| {
            let mut a = vec!["qdisc", "add", "dev", port];
            a.extend_from_slice(parent);
            a.extend_from_slice(&["tbf", "rate", rate, "burst", "256kb", "latency", "2ms"]);
            self.tc(&a)
        };
        match (&shape.rate, &shape.delay) {
            (None, None) => Ok(()),
            (Some(r), None) => tbf(&["root", "handle", "1:"], r),
            (r, Some(d)) => {
                self.tc(&[
                    "qdisc", "add", "dev", port, "root", "handle", "1:", "netem", "delay", d,
                    "limit", "100000",
                ])
                .context("netem (is sch_netem available?)")?;
                match r {
                    Some(r) => tbf(&["parent", "1:1", "handle", "10:"], r),
                    None => Ok(()),
                }
            }
        }
    }

    /// Routes, forwarding and the like inside a host: `ip -n HOST ARGS...`.
    pub fn ip_in(&self, host: &str, args: &[&str]) -> Result<()> {
        let mut a = vec!["-n", host];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// `sysctl -w KEY=VALUE` inside a host.
    pub fn sysctl(&self, host: &str, kv: &str) -> Result<()> {
        checked(
            Command::new("ip").args(["netns", "exec", host, "sysctl", "-qw", kv]),
            &format!("sysctl {kv} in {host}"),
        )
        .map(drop)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("docknet: warning: removing namespace {ns}: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_checked_before_tc_sees_them() {
        let s = |r: Option<&str>, d: Option<&str>| Shape {
            rate: r.map(String::from),
            delay: d.map(String::from),
        };
        assert!(s(Some("10gbit"), Some("10us")).check().is_ok());
        assert!(s(None, None).check().is_ok());
        assert!(s(Some("1.5gbit"), None).check().is_ok());
        for bad in [
            s(Some("fast"), None),
            s(Some("10 gbit"), None),
            s(None, Some("10")),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(s(Some("x; rm -rf /"), None).check().is_err());
        assert_eq!(s(None, None).describe(), None);
        assert_eq!(s(Some("10gbit"), None).gbps(), Some(10.0));
        assert_eq!(s(Some("500mbit"), None).gbps(), Some(0.5));
        assert_eq!(s(None, Some("1ms")).gbps(), None);
        assert!(s(Some("10gbit"), None)
            .describe()
            .unwrap()
            .contains("10gbit"));
    }
}
