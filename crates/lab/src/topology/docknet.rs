//! DockNet topologies: client and server pipes on a daemon of the lab's own, joined by fast
//! channels in the fast-channel mode (by the daemon itself, once they talk, in `docknet-auto`). On two hosts, a daemon on each host drives its end of
//! the wire (AF_XDP for `docknet`, AF_PACKET for `docknet-packet`): client pipes on host A's,
//! server pipes on host B's, all in one subnet (each daemon answers ARP on the wire for its
//! own pipes). In `docknet-host` each daemon drives a link to its host's kernel instead, and
//! the hosts' kernels route between them. In `docknet-pods` the pipes are pods that the CNI
//! plugin attaches, routed by the node agent ([`super::pods`]).

use super::daemon::Daemon;
use super::pods::Pods;
use super::wire::{Shape, Wire, HOST_A, HOST_B, WIRE_DEV};
use crate::mode::Mode;
use crate::plan::DaemonSetup;
use anyhow::{Context, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

/// The host link's name on each host in `docknet-host` (`docknet daemon --host-link NAME`).
const HOST_LINK: &str = "docknet0";

/// `pairs` client/server pipe pairs: pair `i` is pipes `c<i>` (10.78.1.i+1) and `s<i>`
/// (10.78.2.i+1) on one /16.
#[derive(Debug)]
pub struct DocknetLab {
    /// The daemon (host A's on two hosts).
    pub daemon: Daemon,
    /// Two hosts: host B's daemon (the servers' pipes).
    pub daemon_b: Option<Daemon>,
    /// The mode built.
    pub mode: Mode,
    /// The pipes' MTU.
    pub mtu: u32,
    /// Two hosts: the hosts and the wire (removed after the daemons).
    pub wire: Option<Wire>,
    /// `docknet-pods`: the pods that stand for the pipes (removed before the daemons).
    pub pods: Option<Box<Pods>>,
}

impl DocknetLab {
    /// Starts a daemon as `setup` says and creates the pipes (and channels, for `docknet-fc`).
    pub fn build(
        exe: &Path,
        mode: Mode,
        setup: &DaemonSetup,
        pairs: usize,
        mtu: u32,
    ) -> Result<DocknetLab> {
        Self::build_with(exe, mode, setup, pairs, mtu, false)
    }

    /// [`DocknetLab::build`]; with `ipv6`, every pipe also has an IPv6 address (dual stack:
    /// [`DocknetLab::client_ip6`], [`DocknetLab::server_ip6`] on one /64).
    pub fn build_with(
        exe: &Path,
        mode: Mode,
        setup: &DaemonSetup,
        pairs: usize,
        mtu: u32,
        ipv6: bool,
    ) -> Result<DocknetLab> {
        let daemon = if mode == Mode::DocknetAuto {
            Daemon::start_auto(exe, setup)?
        } else {
            Daemon::start(exe, setup)?
        };
        let mut c = daemon.client()?;
        let v6 = |a: Ipv6Addr| ipv6.then(|| format!("{a}/64"));
        for i in 0..pairs {
            let (cl, sv) = (Self::client_pipe(i), Self::server_pipe(i));
            let none = Default::default();
            let (ci, si) = (v6(Self::client_ip6(i)), v6(Self::server_ip6(i)));
            c.pipe_create_dual(
                &cl,
                &format!("{}/16", Self::client_ip(i)),
                ci.as_deref(),
                Some(mtu),
                None,
                none,
            )
            .with_context(|| format!("creating pipe {cl}"))?;
            c.pipe_create_dual(
                &sv,
                &format!("{}/16", Self::server_ip(i)),
                si.as_deref(),
                Some(mtu),
                None,
                Default::default(),
            )
            .with_context(|| format!("creating pipe {sv}"))?;
            if matches!(mode, Mode::DocknetFc | Mode::DocknetFcPreload) {
                c.fc_connect(&cl, &sv, None)
                    .with_context(|| format!("connecting {cl} and {sv}"))?;
            }
        }
        Ok(DocknetLab {
            daemon,
            daemon_b: None,
            mode,
            mtu,
            wire: None,
            pods: None,
        })
    }

    /// Two hosts over a wire of `mtu` (shaped as `shape` says), a daemon on each driving its
    /// end of the wire (`docknet`: AF_XDP, `docknet-packet`: AF_PACKET) or a link to its host's
    /// kernel (`docknet-host`), `pairs` client pipes on host A and server pipes on host B, each
    /// host's pipes routed through the other host's address (`docknet route`, or the hosts'
    /// kernel routes for `docknet-host`).
    pub fn build_two_host(
        exe: &Path,
        mode: Mode,
        setup: &DaemonSetup,
        pairs: usize,
        mtu: u32,
        shape: &Shape,
    ) -> Result<DocknetLab> {
        let nic = match mode {
            Mode::Docknet | Mode::DocknetVxlan => "xdp",
            Mode::DocknetPacket => "packet",
            Mode::DocknetHost => "host-link",
            // the daemon's default: what a node of a cluster runs
            Mode::DocknetPods => "auto",
            _ => anyhow::bail!("{mode} is not a two-host DockNet mode"),
        };
        let wire = Wire::build(mtu, shape)?;
        let start = |ns: &str, core| {
            if mode == Mode::DocknetHost {
                Daemon::start_host_link(exe, setup.idle, core, setup.master_nice, ns, HOST_LINK)
            } else {
                Daemon::start_on(
                    exe,
                    setup.idle,
                    core,
                    setup.master_nice,
                    Some((ns, WIRE_DEV, nic)),
                )
            }
            .with_context(|| format!("starting the daemon of {ns} ({nic})"))
        };
        let daemon = start(&wire.host_a, setup.master_core)?;
        let daemon_b = start(&wire.host_b, setup.master_core_b)?;
        if mode == Mode::DocknetPods {
            let want = |client: bool, i| match client {
                true => Self::client_ip(i),
                false => Self::server_ip(i),
            };
            // (on failure the daemons, then the wire, go as the locals drop)
            let pods = Box::new(Pods::build(
                exe,
                &wire,
                [&daemon, &daemon_b],
                pairs,
                mtu,
                want,
            )?);
            return Ok(DocknetLab {
                daemon,
                daemon_b: Some(daemon_b),
                mode,
                mtu,
                wire: Some(wire),
                pods: Some(pods),
            });
        }
        let (mut ca, mut cb) = (daemon.client()?, daemon_b.client()?);
        for i in 0..pairs {
            let (cl, sv) = (Self::client_pipe(i), Self::server_pipe(i));
            ca.pipe_create(&cl, &format!("{}/16", Self::client_ip(i)), Some(mtu), None)
                .with_context(|| format!("creating pipe {cl} on host A"))?;
            cb.pipe_create(&sv, &format!("{}/16", Self::server_ip(i)), Some(mtu), None)
                .with_context(|| format!("creating pipe {sv} on host B"))?;
        }
        // each host's pipes form its pod network (a /24 per 250 pairs, clients' on host A,
        // servers' on host B), reached through the other host's address, as the node agent
        // routes a cluster's nodes (in VXLAN tunnels to it in docknet-vxlan); with host links
        // the hosts' kernels route them, as the routed mode's hosts do
        let vni = (mode == Mode::DocknetVxlan).then_some(1);
        if mode == Mode::DocknetHost {
            for host in [&wire.host_a, &wire.host_b] {
                wire.sysctl(host, "net.ipv4.ip_forward=1")?;
            }
        }
        for k in 0..pairs.div_ceil(250) {
            let (clients, servers) = (Self::client_ip(k * 250), Self::server_ip(k * 250));
            let net = |ip: Ipv4Addr| {
                let o = ip.octets();
                format!("{}.{}.{}.0/24", o[0], o[1], o[2])
            };
            if mode == Mode::DocknetHost {
                wire.ip_in(
                    &wire.host_a,
                    &["route", "add", &net(servers), "via", HOST_B],
                )?;
                wire.ip_in(
                    &wire.host_b,
                    &["route", "add", &net(clients), "via", HOST_A],
                )?;
                continue;
            }
            ca.route_add(&net(servers), HOST_B, vni)
                .with_context(|| format!("routing {} through host B", net(servers)))?;
            cb.route_add(&net(clients), HOST_A, vni)
                .with_context(|| format!("routing {} through host A", net(clients)))?;
        }
        Ok(DocknetLab {
            daemon,
            daemon_b: Some(daemon_b),
            mode,
            mtu,
            wire: Some(wire),
            pods: None,
        })
    }

    /// The daemon that owns `pipe` (servers' pipes are on host B's when there are two).
    pub fn daemon_of(&self, pipe: &str) -> &Daemon {
        match &self.daemon_b {
            Some(b) if pipe.starts_with('s') => b,
            _ => &self.daemon,
        }
    }

    /// Waits until the first `n` servers' pipes are attached to their containers (a host
    /// starting many containers at once may take seconds to attach them all).
    pub fn wait_servers(&self, n: usize, timeout: std::time::Duration) -> Result<()> {
        let pipes: Vec<String> = (0..n).map(Self::server_pipe).collect();
        self.wait_attached(&pipes, timeout)
    }

    /// Waits until every pipe of `pipes` is attached to its container (each asked of the
    /// daemon that owns it).
    pub fn wait_attached(&self, pipes: &[String], timeout: std::time::Duration) -> Result<()> {
        let t = std::time::Instant::now();
        loop {
            let mut up = 0;
            for name in pipes {
                let listed = self.daemon_of(name).client()?.pipe_ls()?;
                // a pod's pipe is named after it (the plugin's container ID)
                let pipe = match self.pods.as_ref().and_then(|p| p.pod(name)) {
                    Some(pod) => &pod.ns.0,
                    None => name,
                };
                if listed.iter().any(|p| &p.name == pipe && p.socket.is_some()) {
                    up += 1;
                }
            }
            if up == pipes.len() {
                return Ok(());
            }
            if t.elapsed() > timeout {
                anyhow::bail!("{up} of {} pipes attached after {timeout:?}", pipes.len());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Pipe of pair `i`'s client.
    pub fn client_pipe(i: usize) -> String {
        format!("c{i}")
    }

    /// Pipe of pair `i`'s server.
    pub fn server_pipe(i: usize) -> String {
        format!("s{i}")
    }

    /// Address of pair `i`'s client.
    pub fn client_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, 1 + (i / 250) as u8 * 2, (i % 250) as u8 + 1)
    }

    /// Address of pair `i`'s server.
    pub fn server_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, 2 + (i / 250) as u8 * 2, (i % 250) as u8 + 1)
    }

    /// IPv6 address of pair `i`'s client (`fd00:78::1:N`, on the /64 of every pair).
    pub fn client_ip6(i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x78, 0, 0, 0, 0, 1, i as u16 + 1)
    }

    /// IPv6 address of pair `i`'s server (`fd00:78::2:N`).
    pub fn server_ip6(i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x78, 0, 0, 0, 0, 2, i as u16 + 1)
    }

    /// `docknet run --pipe PIPE [--cpu N] -- PROG ARGS` on this lab's daemon; in the preload
    /// modes with `--preload` (the program's kernel sockets go to DockNet). In `docknet-pods`,
    /// `PROG ARGS` in the namespace of the pod that stands for `pipe` (on core N).
    pub fn run_in(
        &self,
        exe: &Path,
        pipe: &str,
        core: Option<usize>,
        prog: &Path,
        args: Vec<String>,
    ) -> Command {
        self.run_bound(exe, pipe, core, &[], prog, args)
    }

    /// [`DocknetLab::run_in`] with host directories shown read-only in the container
    /// (`--bind`).
    pub fn run_bound(
        &self,
        exe: &Path,
        pipe: &str,
        core: Option<usize>,
        binds: &[&Path],
        prog: &Path,
        args: Vec<String>,
    ) -> Command {
        if let Some(pod) = self.pods.as_ref().and_then(|p| p.pod(pipe)) {
            // in the pod's namespace, where its pipe is, as its container runs (it sees the
            // host's files, so `binds` need nothing; the pods' modes are not preload modes)
            let mut c = std::process::Command::new("setsid");
            c.args(["ip", "netns", "exec", &pod.ns.0]);
            if let Some(core) = core {
                c.args(["taskset", "-c", &core.to_string()]);
            }
            c.arg(prog).args(args);
            return c;
        }
        let mut c = self.daemon_of(pipe).cmd(exe);
        c.args(["run", "--pipe", pipe]);
        if let Some(core) = core {
            c.args(["--cpu", &core.to_string()]);
        }
        if self.mode.is_preload() {
            c.arg("--preload");
        }
        for b in binds {
            c.arg("--bind").arg(b);
        }
        c.arg("--").arg(prog).args(args);
        c
    }
}

impl Drop for DocknetLab {
    fn drop(&mut self) {
        // the pods (DEL asks the daemons), then the daemons (their XDP programs and sockets)
        // before the hosts they run in
        drop(self.pods.take());
        self.daemon.stop();
        if let Some(b) = self.daemon_b.as_mut() {
            b.stop();
        }
        drop(self.wire.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_for_every_pair() {
        let mut all = std::collections::HashSet::new();
        for i in 0..250 {
            assert!(all.insert(DocknetLab::client_ip(i)));
            assert!(all.insert(DocknetLab::server_ip(i)));
        }
        assert_eq!(DocknetLab::server_ip(0), Ipv4Addr::new(10, 78, 2, 1));
        assert_eq!(DocknetLab::client_ip(9), Ipv4Addr::new(10, 78, 1, 10));
    }
}
