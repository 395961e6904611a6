//! An Open vSwitch of the lab's own: `ovsdb-server` and `ovs-vswitchd` as children of this
//! process, with a private directory for the database, sockets, pid files and logs (never
//! /var/run/openvswitch), ended by pid on drop.

use crate::proc::{checked, terminate};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Open vSwitch.
#[derive(Debug)]
pub struct Ovs {
    dir: PathBuf,
    db: PathBuf,
    procs: Vec<Child>,
}

impl Ovs {
    /// Starts the database and the switch daemon, the latter inside `host_ns` so its ports are
    /// the lab's veths; `base` names the private directory.
    pub fn start(host_ns: &str, base: &str) -> Result<Ovs> {
        let dir = std::env::temp_dir().join(format!("{base}-ovs"));
        std::fs::create_dir_all(&dir)?;
        let mut ovs = Ovs {
            db: dir.join("db.sock"),
            dir,
            procs: Vec::new(),
        };
        let d = ovs.dir.clone();
        let conf = d.join("conf.db");
        let schema = ["/usr/share/openvswitch/vswitch.ovsschema"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .context("the Open vSwitch schema is missing (apt-get install openvswitch-switch)")?;
        checked(
            Command::new("ovsdb-tool")
                .arg("create")
                .arg(&conf)
                .arg(schema),
            "ovsdb-tool create",
        )?;
        let opt = |k: &str, f: &str| format!("--{k}={}", d.join(f).display());
        let spawn = |cmd: &mut Command| -> Result<Child> {
            cmd.env("OVS_RUNDIR", &d)
                .env("OVS_DBDIR", &d)
                .env("OVS_LOGDIR", &d)
                .env("OVS_SYSCONFDIR", &d)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting Open vSwitch")
        };
        ovs.procs.push(spawn(
            Command::new("ovsdb-server")
                .arg(&conf)
                .arg(format!("--remote=punix:{}", ovs.db.display()))
                .arg(opt("unixctl", "ovsdb.ctl"))
                .arg(opt("log-file", "ovsdb.log")),
        )?);
        let t = Instant::now();
        while !ovs.db.exists() {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("ovsdb-server did not open {} within 10 s", ovs.db.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        ovs.vsctl(&["--no-wait", "init"])?;
        ovs.procs.push(spawn(
            Command::new("ip")
                .args(["netns", "exec", host_ns, "ovs-vswitchd"])
                .arg(format!("unix:{}", ovs.db.display()))
                .arg(opt("unixctl", "vswitchd.ctl"))
                .arg(opt("log-file", "vswitchd.log")),
        )?);
        Ok(ovs)
    }

    /// Runs `ovs-vsctl` against this switch.
    pub fn vsctl(&self, args: &[&str]) -> Result<()> {
        checked(
            Command::new("ovs-vsctl")
                .arg(format!("--db=unix:{}", self.db.display()))
                .arg("--timeout=20")
                .args(args)
                .env("OVS_RUNDIR", &self.dir),
            &format!("ovs-vsctl {}", args.join(" ")),
        )
        .map(drop)
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().rev() {
            terminate(c);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
