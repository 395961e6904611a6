//! DockNet topologies: client and server pipes on a daemon of the lab's own, joined by fast
//! channels in the fast-channel mode.

use super::daemon::Daemon;
use crate::mode::Mode;
use crate::plan::DaemonSetup;
use anyhow::{Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// `pairs` client/server pipe pairs: pair `i` is pipes `c<i>` (10.78.1.i+1) and `s<i>`
/// (10.78.2.i+1) on one /16.
#[derive(Debug)]
pub struct DocknetLab {
    /// The daemon.
    pub daemon: Daemon,
    /// The mode built.
    pub mode: Mode,
    /// The pipes' MTU.
    pub mtu: u32,
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
        let daemon = Daemon::start(exe, setup)?;
        let mut c = daemon.client()?;
        for i in 0..pairs {
            let (cl, sv) = (Self::client_pipe(i), Self::server_pipe(i));
            c.pipe_create(&cl, &format!("{}/16", Self::client_ip(i)), Some(mtu), None)
                .with_context(|| format!("creating pipe {cl}"))?;
            c.pipe_create(&sv, &format!("{}/16", Self::server_ip(i)), Some(mtu), None)
                .with_context(|| format!("creating pipe {sv}"))?;
            if mode == Mode::DocknetFc {
                c.fc_connect(&cl, &sv, None)
                    .with_context(|| format!("connecting {cl} and {sv}"))?;
            }
        }
        Ok(DocknetLab { daemon, mode, mtu })
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

    /// `docknet run --pipe PIPE [--cpu N] -- PROG ARGS` on this lab's daemon.
    pub fn run_in(
        &self,
        exe: &Path,
        pipe: &str,
        core: Option<usize>,
        prog: &Path,
        args: Vec<String>,
    ) -> Command {
        let mut c = self.daemon.cmd(exe);
        c.args(["run", "--pipe", pipe]);
        if let Some(core) = core {
            c.args(["--cpu", &core.to_string()]);
        }
        c.arg("--").arg(prog).args(args);
        c
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
