//! Two hosts on a wire, each with a daemon driving its end: the helpers the wire's test
//! binaries share (`nic.rs`, `node_agent.rs`).

use super::*;
use docknet_lab::topology::daemon::Daemon;
use docknet_lab::topology::wire::{Shape, Wire, WIRE_DEV};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn host_daemon(wire: &Wire, host: &str, mode: &str) -> Daemon {
    let _ = wire;
    Daemon::start_on(
        Path::new(EXE),
        "adaptive",
        None,
        0,
        Some((host, WIRE_DEV, mode)),
    )
    .unwrap_or_else(|e| panic!("daemon on {host} ({mode}): {e:#}"))
}

/// `docknet run --pipe PIPE -- dnperf server` on daemon `d`, serving one connection at `ip`.
pub fn server(d: &Daemon, pipe: &str, ip: &str) -> std::process::Child {
    d.cmd(Path::new(EXE))
        .args(["run", "--pipe", pipe, "--", dnperf()])
        .args(["server", "--stack", "docknet", "--idle", "adaptive"])
        .args(["--bind", &format!("{ip}:7000"), "--conns", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// `docknet run --pipe PIPE -- dnperf client`: a checked transfer of `bytes` to `ip`, in
/// writes of 64 KiB.
pub fn client(d: &Daemon, pipe: &str, ip: &str, bytes: u64) -> Command {
    client_sized(d, pipe, ip, bytes, 65536)
}

/// [`client`] in writes of `size` bytes.
pub fn client_sized(d: &Daemon, pipe: &str, ip: &str, bytes: u64, size: usize) -> Command {
    let mut c = d.cmd(Path::new(EXE));
    c.args(["run", "--pipe", pipe, "--", dnperf()])
        .args(["client", "--stack", "docknet", "--idle", "adaptive"])
        .args(["--connect", &format!("{ip}:7000"), "--workload", "check"])
        .args([
            "--bytes",
            &bytes.to_string(),
            "--size",
            &size.to_string(),
            "--json",
        ]);
    c
}

/// A checked transfer of `bytes` from pipe `from.1` on daemon `from.0` to a server on pipe
/// `to.1` of daemon `to.0` at address `to.2`, in writes of 64 KiB.
pub fn transfer_between(
    from: (&Daemon, &str),
    to: (&Daemon, &str, &str),
    bytes: u64,
) -> serde_json::Value {
    transfer_sized(from, to, bytes, 65536)
}

/// [`transfer_between`] in writes of `size` bytes. The server is ended when the client
/// failed (it would wait for its connection for good).
pub fn transfer_sized(
    from: (&Daemon, &str),
    to: (&Daemon, &str, &str),
    bytes: u64,
    size: usize,
) -> serde_json::Value {
    let mut srv = Reaped(server(to.0, to.1, to.2));
    std::thread::sleep(Duration::from_millis(300));
    let o = client_sized(from.0, from.1, to.2, bytes, size)
        .output()
        .unwrap();
    if o.status.success() {
        let _ = srv.0.wait();
    }
    result_of(o, "transfer failed")
}

/// Two hosts on a wire, a daemon driving each end in `mode`, pipe `c0` at `client` on host A's
/// and `s0` at `server` on host B's (the wire outlives the daemons: declared first).
pub fn two_nodes(mode: &str, client: &str, server: &str) -> (Wire, Daemon, Daemon) {
    two_nodes_at(1500, mode, client, server)
}

/// [`two_nodes`] on a wire of MTU `mtu`, the pipes at the same MTU.
pub fn two_nodes_at(mtu: u32, mode: &str, client: &str, server: &str) -> (Wire, Daemon, Daemon) {
    let wire = Wire::build(mtu, &Shape::default()).unwrap();
    let a = host_daemon(&wire, &wire.host_a, mode);
    let b = host_daemon(&wire, &wire.host_b, mode);
    // pipes at the wire's MTU, as the lab makes them: their segments to the far host are as
    // large as the wire takes
    let m = mtu.to_string();
    ok(&a, &["pipe", "create", "c0", "--ip", client, "--mtu", &m]);
    ok(&b, &["pipe", "create", "s0", "--ip", server, "--mtu", &m]);
    (wire, a, b)
}

/// `ip ARGS...` in namespace `ns`, which must work.
pub fn ip_in(ns: &str, args: &[&str]) {
    let o = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
