//! An encrypted tunnel between the two hosts: OpenVPN with a static key (AES-256-CBC,
//! HMAC-SHA256) over UDP on the wire, a TUN device on each host. The `vxlan-openvpn` mode
//! carries its VXLAN overlay through it: an encrypted overlay in userspace, as weave's
//! encrypted mode was in Kratzke's study (this kernel has neither ESP nor WireGuard).
//!
//! The key is made for the run (`openvpn --genkey secret`) in a directory of the run's own
//! (mode 0700), removed with the tunnel; both OpenVPN processes are children of this process,
//! ended by their pid.

use super::wire::{Wire, HOST_A, HOST_B};
use crate::proc::{checked, terminate, unique};
use anyhow::{bail, Context, Result};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tunnel's address on host A.
pub const TUNNEL_A: &str = "10.99.0.1";
/// The tunnel's address on host B.
pub const TUNNEL_B: &str = "10.99.0.2";
/// The TUN device on each host.
pub const TUNNEL_DEV: &str = "ovpn0";
/// What OpenVPN adds to a packet at most in this configuration: outer IPv4 and UDP (28),
/// packet id and time (8), IV (16), HMAC-SHA256 (32), CBC padding (up to 16).
pub const OPENVPN_OVERHEAD: u32 = 100;
const PORT: &str = "1194";

/// A running tunnel ([module docs](self)); removed on drop.
#[derive(Debug)]
pub struct Tunnel {
    procs: Vec<Child>,
    dir: PathBuf,
    /// MTU of the TUN devices: the wire's less [`OPENVPN_OVERHEAD`], so no tunnel packet is
    /// fragmented on the wire.
    pub mtu: u32,
}

impl Tunnel {
    /// Builds the tunnel between the hosts of `wire` (whose MTU is `wire_mtu`) and waits until
    /// host A reaches host B through it.
    pub fn build(wire: &Wire, wire_mtu: u32) -> Result<Tunnel> {
        if wire_mtu < 1280 + OPENVPN_OVERHEAD {
            bail!("the wire's MTU {wire_mtu} leaves too little for the tunnel (at least 1380)");
        }
        let dir = std::env::temp_dir().join(unique("ovpn"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let mut t = Tunnel {
            procs: Vec::new(),
            dir,
            mtu: wire_mtu - OPENVPN_OVERHEAD,
        };
        let key = t.dir.join("static.key");
        checked(
            Command::new("openvpn")
                .args(["--genkey", "secret"])
                .arg(&key),
            "openvpn --genkey (apt-get install openvpn)",
        )?;
        let mtu = t.mtu.to_string();
        for (host, local, remote, me, peer) in [
            (&wire.host_a, HOST_A, HOST_B, TUNNEL_A, TUNNEL_B),
            (&wire.host_b, HOST_B, HOST_A, TUNNEL_B, TUNNEL_A),
        ] {
            let log = std::fs::File::create(t.dir.join(format!("{me}.log")))?;
            let child = Command::new("ip")
                .args(["netns", "exec", host, "openvpn", "--dev", TUNNEL_DEV])
                .args(["--dev-type", "tun", "--proto", "udp", "--local", local])
                .args(["--lport", PORT, "--remote", remote, "--rport", PORT])
                .args(["--ifconfig", me, peer, "--secret"])
                .arg(&key)
                .args(["--cipher", "AES-256-CBC", "--auth", "SHA256"])
                .args(["--tun-mtu", &mtu, "--verb", "1"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting openvpn (apt-get install openvpn)")?;
            t.procs.push(child);
        }
        t.wait_up(&wire.host_a, Duration::from_secs(10))?;
        Ok(t)
    }

    /// Waits until `host` (A) gets an answer from B's end of the tunnel.
    fn wait_up(&mut self, host: &str, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            for (i, p) in self.procs.iter_mut().enumerate() {
                if let Ok(Some(st)) = p.try_wait() {
                    bail!(
                        "openvpn on host {} exited ({st}): {}",
                        ["A", "B"][i],
                        self.log_tail(i)
                    );
                }
            }
            // a short wait per try: a ping sent before B's end is up is lost, not late
            let ok = Command::new("ip")
                .args([
                    "netns", "exec", host, "ping", "-c", "1", "-W", "0.1", TUNNEL_B,
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if t.elapsed() > timeout {
                bail!(
                    "the OpenVPN tunnel did not carry a ping within {timeout:?}: {}",
                    self.log_tail(0)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The last lines of tunnel end `i`'s log (0: host A).
    fn log_tail(&self, i: usize) -> String {
        let me = [TUNNEL_A, TUNNEL_B][i];
        let text = std::fs::read_to_string(self.dir.join(format!("{me}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(3)..].join(" / ")
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        for p in &mut self.procs {
            terminate(p);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
