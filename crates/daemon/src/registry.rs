//! The daemon's control-plane state: pipes, fast channels, their files, and `state.json`.
//!
//! Run directory:
//! ```text
//! <run-dir>/            0700
//!   lock                flock held by the running daemon
//!   state.json          pipes and channels, rewritten atomically after every change
//!   pipes/<name>/       0700, bind-mounted into the container at /run/docknet/pipe
//!     dp.map            0600, the pipe region
//!     fc/<peer>.map     0600, a fast-channel region, hard-linked into both partners' dirs
//! ```
//! Every operation checks all its inputs before it touches a file, so a refused request
//! changes nothing.

use crate::proto::{ApiError, ErrorCode, FcInfo, PipeInfo};
use crate::switch::{fmt_mac, mac_for, FlowTable, Port};
use docknet_pipe::layout::{self, Identity, Kind, RegionInfo, RingParams};
use docknet_pipe::Region;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

macro_rules! counters {
    ($($variant:ident => $name:literal: $doc:literal,)*) => {
        /// Per-pipe counters, in the order they are mirrored into the region header.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $(#[doc = $doc] $variant,)* }
        /// Counter names, as reported by `pipe show`.
        pub const COUNTER_NAMES: &[&str] = &[$($name,)*];
    };
}

counters! {
    TxPackets => "tx_packets": "Frames taken from the pipe's tx ring (valid descriptors).",
    TxBytes => "tx_bytes": "Bytes of those frames.",
    RxPackets => "rx_packets": "Frames delivered into the pipe's rx ring.",
    RxBytes => "rx_bytes": "Bytes of those frames.",
    DropRxFull => "drop_rx_full": "Frames for this pipe dropped because its rx ring was full.",
    DropNoRoute => "drop_no_route": "Frames from this pipe to an address no pipe owns.",
    DropSpoofed => "drop_spoofed": "Frames from this pipe with a source address not its own.",
    DropMalformed => "drop_malformed": "Frames from this pipe whose headers do not parse.",
    DropUnsupported => "drop_unsupported": "Frames from this pipe of a protocol not forwarded.",
    DropTooBig => "drop_too_big": "Frames for this pipe longer than its frame size.",
    BadDesc => "bad_desc": "Descriptors on the tx ring outside the frame area or empty.",
    Oversize => "oversize": "Descriptors on the tx ring longer than the frame size.",
    RingOverrun => "ring_overrun": "Impossible ring indices written by the container.",
    ArpReplies => "arp_replies": "ARP requests answered by the daemon.",
    Flooded => "flooded": "Broadcast or multicast frames from this pipe copied to others.",
    Kicks => "kicks": "Futex wake-ups sent to the container's sleeping consumer.",
}

/// Number of counters.
pub const NCOUNTERS: usize = COUNTER_NAMES.len();

/// Counters the master thread publishes and the control plane reads.
#[derive(Debug, Default)]
pub struct Counters([AtomicU64; NCOUNTERS]);

impl Counters {
    /// Publishes the master's private values.
    pub fn store_all(&self, v: &[u64; NCOUNTERS]) {
        for (a, x) in self.0.iter().zip(v) {
            a.store(*x, Ordering::Relaxed);
        }
    }
    /// Reads all values.
    pub fn load_all(&self) -> [u64; NCOUNTERS] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// A live pipe.
#[derive(Debug)]
pub struct Pipe {
    /// Unique within this daemon's lifetime (for carrying master state across snapshots).
    pub id: u64,
    /// Name.
    pub name: String,
    /// Address.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// MAC assigned by the daemon.
    pub mac: [u8; 6],
    /// MTU.
    pub mtu: u32,
    /// Directory holding dp.map (and fc/).
    pub dir: PathBuf,
    /// The mapped region.
    pub region: Region,
    /// Its checked layout.
    pub info: RegionInfo,
    /// Counters published by the master thread.
    pub counters: Counters,
}

/// What the master thread works from: an immutable view, swapped whole on every change.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Pipes; port `i` of the table is `pipes[i]`.
    pub pipes: Vec<Arc<Pipe>>,
    /// Flow table over the same indices.
    pub table: FlowTable,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PipeRec {
    name: String,
    ip: Ipv4Addr,
    prefix: u8,
    mtu: u32,
    ring_depth: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FcRec {
    a: String,
    b: String,
    mtu: u32,
    ring_depth: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    pipes: Vec<PipeRec>,
    fcs: Vec<FcRec>,
}

/// Pipes and channels of one daemon, with their files.
#[derive(Debug)]
pub struct Registry {
    run_dir: PathBuf,
    pipes: BTreeMap<String, Arc<Pipe>>,
    depth: BTreeMap<String, u32>,
    fcs: BTreeMap<(String, String), FcRec>,
    next_id: u64,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ApiError {
    ApiError::new(code, msg)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    err(ErrorCode::Internal, format!("{what}: {e}"))
}

/// Checks a pipe name: 1–32 of `[A-Za-z0-9_.-]`, not starting with `.` or `-`.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadName,
            format!("invalid pipe name {name:?}: use 1-32 of A-Z a-z 0-9 _ . - (not starting with . or -)"),
        ))
    }
}

/// Parses `A.B.C.D/LEN` and refuses addresses a pipe cannot own.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), ApiError> {
    let bad = |why: &str| err(ErrorCode::BadIp, format!("invalid address {s:?}: {why}"));
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| bad("expected A.B.C.D/LEN"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| bad("prefix length must be 1..=32"))?;
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(bad("not a unicast host address"));
    }
    if len <= 30 {
        let mask = u32::MAX << (32 - u32::from(len));
        let host = u32::from(ip) & !mask;
        if host == 0 || host == !mask {
            return Err(bad("network or broadcast address of its subnet"));
        }
    }
    Ok((ip, len))
}

fn mkdir_private(p: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(p) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// Creates a zeroed region file of `size` at `path` (0600, via a temporary name and rename).
fn create_region(path: &Path, size: usize) -> io::Result<(File, Region)> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.set_len(size as u64)?;
    let r = Region::map_file(&f)?;
    fs::rename(&tmp, path)?;
    Ok((f, r))
}

fn open_region(path: &Path) -> io::Result<Region> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    Region::map_file(&f)
}

impl Registry {
    /// Opens (creating if needed) the run directory and adopts the pipes and channels recorded
    /// in `state.json` whose files are still there and valid. Returns the registry and
    /// warnings about anything that could not be adopted.
    pub fn open(run_dir: &Path) -> io::Result<(Registry, Vec<String>)> {
        fs::create_dir_all(run_dir)?;
        fs::set_permissions(run_dir, fs::Permissions::from_mode(0o700))?;
        mkdir_private(&run_dir.join("pipes"))?;
        let mut reg = Registry {
            run_dir: run_dir.to_path_buf(),
            pipes: BTreeMap::new(),
            depth: BTreeMap::new(),
            fcs: BTreeMap::new(),
            next_id: 1,
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
        for p in state.pipes {
            match reg.adopt_pipe(&p) {
                Ok(pipe) => {
                    reg.depth.insert(p.name.clone(), p.ring_depth);
                    reg.pipes.insert(p.name.clone(), pipe);
                }
                Err(e) => warnings.push(format!("pipe {} not adopted: {e}", p.name)),
            }
        }
        for f in state.fcs {
            let ok = reg.pipes.contains_key(&f.a)
                && reg.pipes.contains_key(&f.b)
                && reg.fc_path(&f.a, &f.b).exists()
                && reg.fc_path(&f.b, &f.a).exists();
            if ok {
                reg.fcs.insert(fc_key(&f.a, &f.b), f);
            } else {
                warnings.push(format!("fast channel {}<->{} not adopted", f.a, f.b));
            }
        }
        reg.save()?;
        Ok((reg, warnings))
    }

    fn state_path(&self) -> PathBuf {
        self.run_dir.join("state.json")
    }

    /// Directory of pipe `name`.
    pub fn pipe_dir(&self, name: &str) -> PathBuf {
        self.run_dir.join("pipes").join(name)
    }

    fn fc_path(&self, owner: &str, peer: &str) -> PathBuf {
        self.pipe_dir(owner).join("fc").join(format!("{peer}.map"))
    }

    fn adopt_pipe(&mut self, rec: &PipeRec) -> Result<Arc<Pipe>, String> {
        validate_name(&rec.name).map_err(|e| e.message)?;
        let dir = self.pipe_dir(&rec.name);
        let region = open_region(&dir.join("dp.map")).map_err(|e| e.to_string())?;
        let info = RegionInfo::parse(&region, Kind::Pipe).map_err(|e| e.to_string())?;
        if info.id.ip_a != rec.ip || info.id.mtu != rec.mtu {
            return Err("region does not match the recorded address or MTU".into());
        }
        Ok(self.wrap(rec, dir, region, info))
    }

    fn wrap(&mut self, rec: &PipeRec, dir: PathBuf, region: Region, info: RegionInfo) -> Arc<Pipe> {
        let id = self.next_id;
        self.next_id += 1;
        Arc::new(Pipe {
            id,
            name: rec.name.clone(),
            ip: rec.ip,
            prefix: rec.prefix,
            mac: mac_for(rec.ip),
            mtu: rec.mtu,
            dir,
            region,
            info,
            counters: Counters::default(),
        })
    }

    /// Writes `state.json` atomically.
    pub fn save(&self) -> io::Result<()> {
        let st = StateFile {
            version: 1,
            pipes: self
                .pipes
                .values()
                .map(|p| PipeRec {
                    name: p.name.clone(),
                    ip: p.ip,
                    prefix: p.prefix,
                    mtu: p.mtu,
                    ring_depth: self.depth.get(&p.name).copied().unwrap_or(0),
                })
                .collect(),
            fcs: self.fcs.values().cloned().collect(),
        };
        let tmp = self.run_dir.join("state.json.tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&st).map_err(io::Error::other)?)?;
        f.sync_all()?;
        fs::rename(tmp, self.state_path())
    }

    /// The pipe called `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<Pipe>, ApiError> {
        self.pipes
            .get(name)
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no pipe named {name:?}")))
    }

    /// Creates a pipe: checks everything, then creates its directory and region.
    pub fn create_pipe(
        &mut self,
        name: &str,
        ip: &str,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
    ) -> Result<Arc<Pipe>, ApiError> {
        validate_name(name)?;
        let (ip, prefix) = parse_cidr(ip)?;
        if self.pipes.contains_key(name) {
            return Err(err(
                ErrorCode::Exists,
                format!("pipe {name:?} already exists"),
            ));
        }
        if let Some(other) = self.pipes.values().find(|p| p.ip == ip) {
            return Err(err(
                ErrorCode::IpInUse,
                format!("address {ip} is already used by pipe {:?}", other.name),
            ));
        }
        let mtu = mtu.unwrap_or(1500);
        let params = RingParams::for_mtu(mtu, ring_depth)
            .map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        let (rings, size) =
            layout::plan([params, params]).map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        let dir = self.pipe_dir(name);
        let made = (|| -> io::Result<(Region, RegionInfo)> {
            let _ = fs::remove_dir_all(&dir); // leftovers of a pipe not in the state
            mkdir_private(&dir)?;
            mkdir_private(&dir.join("fc"))?;
            let (_f, region) = create_region(&dir.join("dp.map"), size)?;
            let id = Identity {
                ip_a: ip,
                ip_b_or_prefix: u32::from(prefix),
                mac_a: mac_for(ip),
                mac_b: [0; 6],
                mtu,
            };
            layout::init(&region, Kind::Pipe, id, rings, size).map_err(io::Error::other)?;
            let info = RegionInfo::parse(&region, Kind::Pipe).map_err(io::Error::other)?;
            Ok((region, info))
        })();
        let (region, info) = match made {
            Ok(x) => x,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(internal("creating the pipe region", e));
            }
        };
        let rec = PipeRec {
            name: name.into(),
            ip,
            prefix,
            mtu,
            ring_depth: params.depth,
        };
        let pipe = self.wrap(&rec, dir.clone(), region, info);
        self.pipes.insert(name.into(), pipe.clone());
        self.depth.insert(name.into(), params.depth);
        if let Err(e) = self.save() {
            self.pipes.remove(name);
            self.depth.remove(name);
            let _ = fs::remove_dir_all(&dir);
            return Err(internal("saving state", e));
        }
        Ok(pipe)
    }

    /// Deletes a pipe and its fast channels; its files are marked closed and removed.
    pub fn remove_pipe(&mut self, name: &str) -> Result<(), ApiError> {
        self.get(name)?;
        let peers: Vec<(String, String)> = self
            .fcs
            .keys()
            .filter(|(a, b)| a == name || b == name)
            .cloned()
            .collect();
        for (a, b) in peers {
            self.remove_fc(&a, &b)?;
        }
        let pipe = self
            .pipes
            .remove(name)
            .ok_or_else(|| internal("remove", name))?;
        self.depth.remove(name);
        layout::set_flags(&pipe.region, layout::FLAG_CLOSED);
        let _ = fs::remove_dir_all(&pipe.dir);
        self.save().map_err(|e| internal("saving state", e))
    }

    /// Builds a fast channel between `a` and `b`.
    pub fn connect_fc(&mut self, a: &str, b: &str, mtu: Option<u32>) -> Result<FcInfo, ApiError> {
        let pa = self.get(a)?.clone();
        let pb = self.get(b)?.clone();
        if a == b {
            return Err(err(
                ErrorCode::BadParams,
                "a fast channel needs two different pipes",
            ));
        }
        if self.fcs.contains_key(&fc_key(a, b)) {
            return Err(err(
                ErrorCode::Exists,
                format!("fast channel {a}<->{b} already exists"),
            ));
        }
        let mtu = mtu.unwrap_or(65535);
        let params =
            RingParams::for_mtu(mtu, None).map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        let (rings, size) =
            layout::plan([params, params]).map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        // Endpoint A is the lower address: ring 0 carries A -> B.
        let (lo, hi) = if pa.ip < pb.ip {
            (&pa, &pb)
        } else {
            (&pb, &pa)
        };
        let path_a = self.fc_path(a, b);
        let path_b = self.fc_path(b, a);
        let made = (|| -> io::Result<()> {
            let (_f, region) = create_region(&path_a, size)?;
            let id = Identity {
                ip_a: lo.ip,
                ip_b_or_prefix: u32::from(hi.ip),
                mac_a: lo.mac,
                mac_b: hi.mac,
                mtu,
            };
            layout::init(&region, Kind::FastChannel, id, rings, size).map_err(io::Error::other)?;
            let _ = fs::remove_file(&path_b);
            fs::hard_link(&path_a, &path_b)
        })();
        if let Err(e) = made {
            let _ = fs::remove_file(&path_a);
            let _ = fs::remove_file(&path_b);
            return Err(internal("creating the fast channel", e));
        }
        let rec = FcRec {
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
        };
        self.fcs.insert(fc_key(a, b), rec);
        if let Err(e) = self.save() {
            self.fcs.remove(&fc_key(a, b));
            let _ = fs::remove_file(&path_a);
            let _ = fs::remove_file(&path_b);
            return Err(internal("saving state", e));
        }
        layout::bump_generation(&pa.region);
        layout::bump_generation(&pb.region);
        Ok(FcInfo {
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
            region_bytes: size,
        })
    }

    /// Removes the fast channel between `a` and `b`.
    pub fn remove_fc(&mut self, a: &str, b: &str) -> Result<(), ApiError> {
        let pa = self.get(a)?.clone();
        let pb = self.get(b)?.clone();
        let key = fc_key(a, b);
        if !self.fcs.contains_key(&key) {
            return Err(err(
                ErrorCode::NotFound,
                format!("no fast channel {a}<->{b}"),
            ));
        }
        let path_a = self.fc_path(a, b);
        if let Ok(r) = open_region(&path_a) {
            layout::set_flags(&r, layout::FLAG_CLOSED);
        }
        let _ = fs::remove_file(&path_a);
        let _ = fs::remove_file(self.fc_path(b, a));
        self.fcs.remove(&key);
        layout::bump_generation(&pa.region);
        layout::bump_generation(&pb.region);
        self.save().map_err(|e| internal("saving state", e))
    }

    /// Peers pipe `name` has a fast channel with.
    pub fn fc_peers(&self, name: &str) -> Vec<String> {
        self.fcs
            .values()
            .filter_map(|f| {
                if f.a == name {
                    Some(f.b.clone())
                } else if f.b == name {
                    Some(f.a.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    /// All pipes, by name.
    pub fn pipes(&self) -> impl Iterator<Item = &Arc<Pipe>> {
        self.pipes.values()
    }

    /// The view the master thread forwards from.
    pub fn snapshot(&self) -> Snapshot {
        let pipes: Vec<Arc<Pipe>> = self.pipes.values().cloned().collect();
        let table = FlowTable::new(
            pipes
                .iter()
                .map(|p| Port {
                    ip: p.ip,
                    prefix: p.prefix,
                    mac: p.mac,
                })
                .collect(),
        );
        Snapshot { pipes, table }
    }

    /// How a pipe is reported to clients (with counters when `counters` is set).
    pub fn pipe_info(&self, p: &Pipe, counters: bool) -> PipeInfo {
        PipeInfo {
            name: p.name.clone(),
            ip: format!("{}/{}", p.ip, p.prefix),
            mac: fmt_mac(p.mac),
            mtu: p.mtu,
            ring_depth: p.info.rings[0].depth,
            frame_size: p.info.rings[0].frame_size,
            region_bytes: p.info.size,
            dir: p.dir.display().to_string(),
            map: p.dir.join("dp.map").display().to_string(),
            fast_channels: self.fc_peers(&p.name),
            counters: counters.then(|| {
                COUNTER_NAMES
                    .iter()
                    .zip(p.counters.load_all())
                    .map(|(n, x)| ((*n).to_string(), x))
                    .collect()
            }),
        }
    }
}

fn fc_key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.into(), b.into())
    } else {
        (b.into(), a.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        for ok in ["a", "web-1", "db_2.x", &"n".repeat(32)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a/b", "../x", "a b", &"n".repeat(33), "é"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_cidr("10.0.0.1/24").unwrap(),
            (Ipv4Addr::new(10, 0, 0, 1), 24)
        );
        assert!(parse_cidr("10.0.0.1/32").is_ok());
        for bad in [
            "10.0.0.1",
            "10.0.0.1/0",
            "10.0.0.1/33",
            "10.0.0.0/24",
            "10.0.0.255/24",
            "0.0.0.0/8",
            "127.0.0.1/8",
            "224.0.0.1/4",
            "x/24",
            "10.0.0.1/x",
        ] {
            assert_eq!(parse_cidr(bad).unwrap_err().code, ErrorCode::BadIp, "{bad}");
        }
    }

    #[test]
    fn create_refusals_change_nothing_and_state_survives_reopen() {
        let d = tempfile::tempdir().unwrap();
        let (mut r, w) = Registry::open(d.path()).unwrap();
        assert!(w.is_empty());
        r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
        r.create_pipe("b", "10.9.0.2/24", Some(9000), None).unwrap();
        let code = |e: ApiError| e.code;
        assert_eq!(
            code(r.create_pipe("a", "10.9.0.3/24", None, None).unwrap_err()),
            ErrorCode::Exists
        );
        assert_eq!(
            code(r.create_pipe("c", "10.9.0.1/24", None, None).unwrap_err()),
            ErrorCode::IpInUse
        );
        assert_eq!(
            code(
                r.create_pipe("c", "10.9.0.3/24", Some(10), None)
                    .unwrap_err()
            ),
            ErrorCode::BadParams
        );
        assert_eq!(
            code(
                r.create_pipe("c", "10.9.0.3/24", None, Some(3))
                    .unwrap_err()
            ),
            ErrorCode::BadParams
        );
        assert!(!r.pipe_dir("c").exists());
        r.connect_fc("a", "b", Some(9000)).unwrap();
        assert_eq!(
            code(r.connect_fc("b", "a", None).unwrap_err()),
            ErrorCode::Exists
        );
        assert_eq!(
            code(r.connect_fc("a", "a", None).unwrap_err()),
            ErrorCode::BadParams
        );
        assert_eq!(
            code(r.connect_fc("a", "zz", None).unwrap_err()),
            ErrorCode::NotFound
        );
        let fa = r.pipe_dir("a").join("fc/b.map");
        let fb = r.pipe_dir("b").join("fc/a.map");
        assert!(fa.exists() && fb.exists());
        let mode = fs::metadata(r.pipe_dir("a").join("dp.map"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(r);
        let (mut r, w) = Registry::open(d.path()).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(r.pipes().count(), 2);
        assert_eq!(r.fc_peers("a"), vec!["b".to_string()]);
        r.remove_pipe("b").unwrap();
        assert!(!fa.exists() && !fb.exists());
        assert!(r.fc_peers("a").is_empty());
        assert_eq!(code(r.remove_pipe("b").unwrap_err()), ErrorCode::NotFound);
    }
}
