//! `state.json`'s records, and opening, adopting and persisting what they describe.

use super::{
    fc_holder_key, fc_key, internal, mtu_frame, parse_cidr, parse_cidr6, pipe_key, pipe_layout,
    sock_key, validate_labels, validate_name, validate_socket, Attachment, Channel, Registry,
};
use crate::holder::Keeper;
use crate::proto::ApiError;
use crate::rate::{Limit, Limits, Timers};
use crate::route::{Route, Routes};
use docknet_pipe::fdpass;
use docknet_pipe::layout::{self, RegionInfo};
use docknet_pipe::Region;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PipeRec {
    pub(super) name: String,
    pub(super) ip: Ipv4Addr,
    pub(super) prefix: u8,
    /// IPv6 address and prefix, `X::Y/LEN` (checked again on load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ip6: Option<String>,
    pub(super) mtu: u32,
    pub(super) ring_depth: u32,
    /// Rate limits (checked again on load).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub(super) limits: Limits,
    /// Labels from whoever created it (checked again on load).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FcRec {
    #[serde(default)]
    pub(super) id: u64,
    pub(super) a: String,
    pub(super) b: String,
    pub(super) mtu: u32,
    pub(super) ring_depth: u32,
    /// Made by the daemon for pipes that talk (removed when idle), not by `fc connect`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) auto: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AttachRec {
    pub(super) pipe: String,
    pub(super) socket: String,
    #[serde(default)]
    pub(super) netns: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(super) struct StateFile {
    pub(super) version: u32,
    pub(super) pipes: Vec<PipeRec>,
    pub(super) fcs: Vec<FcRec>,
    #[serde(default)]
    pub(super) attached: Vec<AttachRec>,
    #[serde(default)]
    pub(super) next_channel: u64,
    /// Routes to networks beyond the link (checked again on load).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) routes: Vec<Route>,
    /// Services (checked again on load).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) services: Vec<crate::proto::ServiceInfo>,
}

/// Checks a pipe record from `state.json` as strictly as a request.
fn check_pipe_rec(p: &PipeRec) -> Result<RegionInfo, String> {
    validate_name(&p.name).map_err(|e| e.message)?;
    validate_labels(&p.labels).map_err(|e| e.message)?;
    parse_cidr(&format!("{}/{}", p.ip, p.prefix)).map_err(|e| e.message)?;
    if let Some(a) = &p.ip6 {
        parse_cidr6(a).map_err(|e| e.message)?;
    }
    pipe_layout(p.ip, p.prefix, p.mtu, Some(p.ring_depth)).map_err(|e| e.message)
}

impl Registry {
    /// Opens (creating if needed) the run directory and adopts what `state.json` records and the
    /// holder still keeps, each record checked again. Returns the registry and warnings about
    /// anything not adopted. Without a holder (tests, in-process use) nothing can be adopted.
    pub fn open(
        run_dir: &Path,
        holder: Option<Box<dyn Keeper>>,
    ) -> io::Result<(Registry, Vec<String>)> {
        fs::create_dir_all(run_dir)?;
        fs::set_permissions(run_dir, fs::Permissions::from_mode(0o700))?;
        let mut kept = match &holder {
            Some(h) => h.list()?,
            None => BTreeMap::new(),
        };
        let mut reg = Registry {
            run_dir: run_dir.to_path_buf(),
            holder,
            pipes: BTreeMap::new(),
            depth: BTreeMap::new(),
            fcs: BTreeMap::new(),
            attached: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_id: 1,
            next_channel: 1,
            gateway: None,
            link_addr: None,
            host_link: false,
            limits: BTreeMap::new(),
            labels: BTreeMap::new(),
            timers: Timers::default(),
            pool: None,
            routes: Arc::default(),
            auto: Default::default(),
            services: Default::default(),
        };
        let mut warnings = Vec::new();
        let state: StateFile = match fs::read(reg.state_path()) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                warnings.push(format!("state.json unreadable ({e}); starting empty"));
                StateFile::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => StateFile::default(),
            Err(e) => return Err(e),
        };
        reg.next_channel = state.next_channel.max(1);
        for p in &state.pipes {
            match reg.adopt_pipe(p, &mut kept) {
                Ok(Some(w)) => warnings.push(format!("pipe {:?}: {w}", p.name)),
                Ok(None) => {}
                Err(e) => warnings.push(format!("pipe {:?} not adopted: {e}", p.name)),
            }
        }
        for f in &state.fcs {
            if let Err(e) = reg.adopt_fc(f, &mut kept) {
                warnings.push(format!(
                    "fast channel {:?}<->{:?} not adopted: {e}",
                    f.a, f.b
                ));
            }
        }
        for a in &state.attached {
            if let Err(e) = reg.adopt_attachment(a, &mut kept) {
                warnings.push(format!("attachment of {:?} not adopted: {e}", a.pipe));
            }
        }
        // each route checked as a request would be, against those adopted before it
        let mut routes = Routes::default();
        for r in state.routes.iter().take(crate::route::MAX_ROUTES + 1) {
            match routes.with(*r) {
                Ok(t) => routes = t,
                Err(e) => warnings.push(format!("route {r} not adopted: {e}")),
            }
        }
        reg.routes = Arc::new(routes);
        warnings.extend(reg.adopt_services(&state.services));
        // whatever the holder keeps that the state does not name is stale
        if let Some(h) = &reg.holder {
            for k in kept.keys() {
                let _ = h.drop_key(k);
            }
        }
        reg.save()?;
        // endpoints that were connected to the last daemon reconnect on this
        for p in reg.pipes.values() {
            layout::bump_generation(&p.region, &p.info.rings[1]);
        }
        Ok((reg, warnings))
    }

    /// Adopts a pipe the state names; `Ok(Some(warning))` when it came back without a part of
    /// its record that did not hold (its rate limits).
    fn adopt_pipe(
        &mut self,
        p: &PipeRec,
        kept: &mut BTreeMap<String, OwnedFd>,
    ) -> Result<Option<String>, String> {
        let info = check_pipe_rec(p)?;
        // limits are checked again as if set now (the file is not trusted)
        let frame = mtu_frame(&info);
        let check = |l: Option<Limit>| match l {
            Some(l) => Limit::new(l.rate_bps, Some(l.burst_bits), frame, self.timers.coarse)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        };
        let (mut rec, mut warning) = (p.clone(), None);
        match (check(p.limits.egress), check(p.limits.ingress)) {
            (Ok(e), Ok(i)) => {
                rec.limits = Limits {
                    egress: e,
                    ingress: i,
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                rec.limits = Limits::default();
                warning = Some(format!("rate limits dropped ({e})"));
            }
        }
        let p = &rec;
        let ip6 = p.ip6.as_deref().and_then(|a| parse_cidr6(a).ok());
        if self.pipes.contains_key(&p.name)
            || self.pipes.values().any(|x| x.ip == p.ip)
            || ip6.is_some_and(|a| self.pipes.values().any(|x| x.ip6.map(|b| b.0) == Some(a.0)))
        {
            return Err("duplicate name or address".into());
        }
        let fd = kept
            .remove(&pipe_key(&p.name))
            .ok_or("its region is gone (no fd holder kept it)")?;
        let region = Region::map_sealed(fd.as_fd(), info.size).map_err(|e| e.to_string())?;
        self.insert_pipe(p, fd, region, info);
        Ok(warning)
    }

    fn adopt_fc(&mut self, f: &FcRec, kept: &mut BTreeMap<String, OwnedFd>) -> Result<(), String> {
        let (pa, pb) = (self.get(&f.a), self.get(&f.b));
        if pa.is_err() || pb.is_err() || f.a == f.b || self.fcs.contains_key(&fc_key(&f.a, &f.b)) {
            return Err("its pipes are not both there, or it is a duplicate".into());
        }
        let (_, rings, size) =
            super::channels::channel_plan(f.mtu, Some(f.ring_depth)).map_err(|e| e.to_string())?;
        let lo = match (pa, pb) {
            (Ok(a), Ok(b)) if b.ip < a.ip => f.b.clone(),
            _ => f.a.clone(),
        };
        let fd = kept
            .remove(&fc_holder_key(f.id))
            .ok_or("its region is gone")?;
        let region = Region::map_sealed(fd.as_fd(), size).map_err(|e| e.to_string())?;
        self.next_channel = self.next_channel.max(f.id + 1);
        self.fcs.insert(
            fc_key(&f.a, &f.b),
            Channel {
                rec: f.clone(),
                memfd: fd,
                region,
                rings,
                lo,
                moved: None,
            },
        );
        Ok(())
    }

    fn adopt_attachment(
        &mut self,
        a: &AttachRec,
        kept: &mut BTreeMap<String, OwnedFd>,
    ) -> Result<(), String> {
        self.get(&a.pipe).map_err(|e| e.message)?;
        validate_socket(&a.socket).map_err(|e| e.message)?;
        let fd = kept
            .remove(&sock_key(&a.pipe))
            .ok_or("its socket is gone")?;
        let listening = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn)
            .unwrap_or(false);
        if !listening {
            return Err("the kept socket is not listening".into());
        }
        fdpass::set_nonblocking(fd.as_fd(), true).map_err(|e| e.to_string())?;
        self.attached.insert(
            a.pipe.clone(),
            Attachment {
                socket: a.socket.clone(),
                listener: Arc::new(fd),
                netns: a.netns,
            },
        );
        Ok(())
    }

    fn state_path(&self) -> PathBuf {
        self.run_dir.join("state.json")
    }

    /// The state as it stands.
    pub(super) fn state(&self) -> StateFile {
        StateFile {
            version: 2,
            pipes: self
                .pipes
                .values()
                .map(|p| PipeRec {
                    name: p.name.clone(),
                    ip: p.ip,
                    prefix: p.prefix,
                    ip6: p.ip6.map(|(a, l)| format!("{a}/{l}")),
                    mtu: p.mtu,
                    ring_depth: self.depth.get(&p.name).copied().unwrap_or(0),
                    limits: self.limits.get(&p.name).copied().unwrap_or_default(),
                    labels: self.labels.get(&p.name).cloned().unwrap_or_default(),
                })
                .collect(),
            fcs: self.fcs.values().map(|c| c.rec.clone()).collect(),
            attached: self
                .attached
                .iter()
                .map(|(p, a)| AttachRec {
                    pipe: p.clone(),
                    socket: a.socket.clone(),
                    netns: a.netns,
                })
                .collect(),
            next_channel: self.next_channel,
            routes: self.routes.list().to_vec(),
            services: self.services(),
        }
    }

    /// Writes `st` as `state.json`, atomically (temporary file, then rename), in one order
    /// whatever the order of changes that led to it (pipes by name, channels by partners), so
    /// the same state is always the same file.
    ///
    /// Not synced to disk: the state serves a daemon that restarts on a running host (the
    /// rename is atomic against its crash, and the page cache outlives it). After the host
    /// restarts, the fd holder and every namespace are gone and nothing of the state could be
    /// adopted anyway. An fsync cost each create, attach and detach 0.3 ms here, and 10-60 ms
    /// on a busy ext4.
    pub(super) fn write(&self, st: &StateFile) -> io::Result<()> {
        let sorted;
        let st = if st.pipes.is_sorted_by(|a, b| a.name <= b.name)
            && st
                .fcs
                .is_sorted_by(|x, y| fc_key(&x.a, &x.b) <= fc_key(&y.a, &y.b))
        {
            st
        } else {
            let mut c = st.clone();
            c.pipes.sort_by(|a, b| a.name.cmp(&b.name));
            c.fcs.sort_by_key(|f| fc_key(&f.a, &f.b));
            sorted = c;
            &sorted
        };
        let tmp = self.run_dir.join("state.json.tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(st).map_err(io::Error::other)?)?;
        fs::rename(tmp, self.state_path())
    }

    /// Writes the current state.
    pub fn save(&self) -> io::Result<()> {
        self.write(&self.state())
    }

    pub(super) fn hold(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), ApiError> {
        match &self.holder {
            Some(h) => h
                .put(key, fd)
                .map_err(|e| internal("keeping the region in the fd holder", e)),
            None => Ok(()),
        }
    }

    pub(super) fn unhold(&self, key: &str) {
        if let Some(h) = &self.holder {
            if let Err(e) = h.drop_key(key) {
                tracing::warn!("fd holder: dropping {key}: {e}");
            }
        }
    }
}
