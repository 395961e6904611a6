//! The container's walls, built by its init before the command starts: a root of its own, a
//! private `/dev`, masked `/proc`, a user of its own (or `--user`'s), no capabilities,
//! `no_new_privs`, a seccomp filter.
//!
//! The root is a fresh tmpfs holding read-only binds of the host's system directories (or of
//! `--rootfs DIR`), the command's own directory, and `--bind` directories; nothing else of the
//! host is reachable: no run directory, no control socket, no host Unix socket outside those
//! directories, no host device. Secrets that live in `/etc` are covered. `/proc` is the
//! container's own (its PID namespace), with the kernel's knobs read-only and the rest masked
//! the way OCI runtimes mask them; `/sys` is read-only and shows the container's network
//! namespace; `/tmp` and `/run` are private and writable. Binds are not recursive, so no mount
//! under a shown directory comes along (and none can stay writable under a read-only bind).

use anyhow::{bail, Context, Result};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Host directories the root shows read-only (those that exist; symlinks are recreated).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// Host files under `/etc` that must not be readable by root in a container.
const SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/sudoers",
];
/// Host directories under `/etc` covered by an empty tmpfs (private keys).
const SECRET_DIRS: &[&str] = &["/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d"];
/// Device nodes a container gets (bound from the host's).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];
/// `/proc` entries masked with `/dev/null` (files) as OCI runtimes do.
const PROC_MASKED: &[&str] = &[
    "kcore",
    "keys",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "kallsyms",
    "interrupts",
];
/// `/proc` directories hidden under an empty read-only tmpfs.
const PROC_HIDDEN: &[&str] = &["acpi", "asound", "scsi"];
/// `/sys` directories hidden under an empty read-only tmpfs (firmware tables, power limits).
const SYS_HIDDEN: &[&str] = &["firmware", "devices/virtual/powercap"];
/// `/proc` entries made read-only.
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// What the container's root is made of.
#[derive(Debug, Clone, Default)]
pub struct Walls {
    /// A root filesystem to use instead of the host's system directories.
    pub rootfs: Option<PathBuf>,
    /// More host directories to show read-only (at the same path).
    pub binds: Vec<PathBuf>,
    /// Who the command runs as (it owns the private `/run`).
    pub user: User,
    /// The container's own `/etc/resolv.conf` (`--dns`), instead of the one its `/etc` shows.
    pub resolv: Option<String>,
}

/// Who a container's command runs as (numeric ids on the host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// The first of the uids (and gids) containers get by default, one per container. Above the
/// range systemd leaves to containers' user namespaces (524288-1879048191), below its range for
/// foreign ids (0x7FFE0000) in every realistic case, and never -1.
pub const OWN_ID_BASE: u32 = 0x7000_0000;

/// Where the kernel numbers the inodes of namespaces it creates (`PROC_DYNAMIC_FIRST`).
const NS_INODE_FIRST: u64 = 0xF000_0000;

impl User {
    /// A container's own user and group: [`OWN_ID_BASE`] plus the number of its network
    /// namespace's inode (`ns_inode`, counted from where the kernel starts numbering them).
    /// The kernel gives no two live namespaces one number, on the whole host, and a network
    /// namespace lives at least as long as any process in it; so no two containers that have
    /// a process between them share the id, whichever PID namespace each `docknet run` was
    /// started from, and the kernel's limits per user are each container's own. An id used
    /// again, after its container ended, finds nothing of that container: its processes ended
    /// with its PID namespace, and it could write nowhere that outlives it (its writable places
    /// are private tmpfs).
    pub fn own(ns_inode: u64) -> Result<User> {
        let n = ns_inode
            .checked_sub(NS_INODE_FIRST)
            .filter(|n| *n < 0x0FFE_0000)
            .with_context(|| {
                format!("the network namespace's inode {ns_inode:#x} is not one the kernel numbers")
            })?;
        let id = OWN_ID_BASE + n as u32;
        Ok(User { uid: id, gid: id })
    }

    /// The user of the network namespace this process is in (made for the container).
    /// Refused where the id cannot be taken: inside a user namespace whose map does not
    /// cover it (rootless runtimes map about 65536 ids), `--user` has to choose one.
    pub fn own_here() -> Result<User> {
        use std::os::unix::fs::MetadataExt;
        let ino = fs::metadata("/proc/self/ns/net")
            .context("reading the container's network namespace")?
            .ino();
        let u = User::own(ino)?;
        for (map, id) in [("/proc/self/uid_map", u.uid), ("/proc/self/gid_map", u.gid)] {
            let text = fs::read_to_string(map).with_context(|| format!("reading {map}"))?;
            if !id_in_ranges(&text, id, map_range) {
                bail!(
                    "the container's own id {id} is not mapped in this user namespace ({map}): choose one with --user"
                );
            }
        }
        Ok(u)
    }
}

/// Whether `id` lies in one of the ranges (first id, count) that `range` reads from the lines
/// of `text` (lines it cannot read are skipped).
fn id_in_ranges(text: &str, id: u32, range: impl Fn(&str) -> Option<(u64, u64)>) -> bool {
    text.lines()
        .filter_map(range)
        .any(|(first, count)| (first..first.saturating_add(count)).contains(&u64::from(id)))
}

/// The id map line `first-inside first-outside count` (`/proc/PID/uid_map`) as the range
/// of ids inside.
fn map_range(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace().map(str::parse::<u64>);
    match (f.next(), f.next(), f.next()) {
        (Some(Ok(inside)), Some(Ok(_)), Some(Ok(count))) => Some((inside, count)),
        _ => None,
    }
}

/// The subordinate-id file line `name:first:count` as a range.
fn subid_range(line: &str) -> Option<(u64, u64)> {
    let mut f = line.trim().splitn(3, ':').skip(1).map(str::parse::<u64>);
    match (f.next(), f.next()) {
        (Some(Ok(first)), Some(Ok(count))) => Some((first, count)),
        _ => None,
    }
}

/// Refuses an own id `u` that a host account has (a directory service can map people's ids
/// into this range), since the container would own that person's files. The accounts are
/// looked up in the host's network namespace (`host`), where a directory service is
/// reachable; this process returns to its own network namespace after.
pub fn no_account_has(u: User, host: &File) -> Result<()> {
    use nix::sched::{setns, CloneFlags};
    let own =
        File::open("/proc/self/ns/net").context("opening the container's network namespace")?;
    setns(host, CloneFlags::CLONE_NEWNET)
        .context("entering the host's network namespace to look up accounts")?;
    // a look-up that fails (a directory service that does not answer) is not taken for "no
    // such account": the container does not start
    let taken_u = nix::unistd::User::from_uid(u.uid.into());
    let taken_g = nix::unistd::Group::from_gid(u.gid.into());
    setns(&own, CloneFlags::CLONE_NEWNET)
        .context("returning to the container's network namespace")?;
    let taken_u = taken_u.with_context(|| {
        format!("looking up whether a host account has the container's own id {} (choose one with --user)", u.uid)
    })?;
    let taken_g = taken_g.with_context(|| {
        format!("looking up whether a host group has the container's own id {} (choose one with --user)", u.gid)
    })?;
    if let Some(name) = taken_u
        .map(|p| format!("user {}", p.name))
        .or(taken_g.map(|g| format!("group {}", g.name)))
    {
        bail!(
            "the container's own id {} is the host's {name}: choose one with --user",
            u.uid
        );
    }
    // ids handed to users' own user namespaces (rootless containers) belong to them too
    for (file, id) in [(SUBUID, u.uid), (SUBGID, u.gid)] {
        match fs::read_to_string(file) {
            Ok(text) if id_in_ranges(&text, id, subid_range) => bail!(
                "the container's own id {id} lies in a range {file} gives a host user: choose one with --user"
            ),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {file}")),
        }
    }
    Ok(())
}

/// The host's subordinate user and group ids (shadow-utils), as `name:first:count` lines.
const SUBUID: &str = "/etc/subuid";
const SUBGID: &str = "/etc/subgid";

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// `UID[:GID]`, numbers or the host's names. A user alone takes its group from the host's
/// `/etc/passwd`, or, as a number without an entry there, the same number; a group of 0 (root)
/// that comes that way for a user other than root is refused (say it, `UID:0`, if it is
/// meant). The id -1 (4294967295) is refused: to the kernel it means "leave unchanged".
pub fn parse_user(s: &str) -> std::result::Result<User, String> {
    use nix::unistd::{Group, User as Passwd};
    let (u, g) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let id = |n: u32, what: &str| {
        if n == u32::MAX {
            Err(format!("{what} {n} means \"unchanged\" to the kernel"))
        } else {
            Ok(n)
        }
    };
    let group = |g: &str| match g.parse::<u32>() {
        Ok(n) => id(n, "group"),
        Err(_) => match Group::from_name(g) {
            Ok(Some(gr)) => Ok(gr.gid.as_raw()),
            _ => Err(format!(
                "no group {g:?} (a number, or a name in /etc/group)"
            )),
        },
    };
    // numbers alone need no look-up in the user database
    let (uid, named_group) = match u.parse::<u32>() {
        Ok(n) => (id(n, "user")?, None),
        Err(_) => match Passwd::from_name(u) {
            Ok(Some(p)) => (p.uid.as_raw(), Some(p.gid.as_raw())),
            _ => {
                return Err(format!(
                    "no user {u:?} (a number, or a name in /etc/passwd)"
                ))
            }
        },
    };
    let gid = match g {
        Some(g) => group(g)?,
        None => {
            let primary = named_group.unwrap_or_else(|| {
                Passwd::from_uid(uid.into())
                    .ok()
                    .flatten()
                    .map_or(uid, |p| p.gid.as_raw())
            });
            if primary == 0 && uid != 0 {
                return Err(format!(
                    "user {u:?}'s group is 0 (root): name the group (--user {u}:GROUP)"
                ));
            }
            id(primary, "group")?
        }
    };
    Ok(User { uid, gid })
}

/// Whether `u` may read `p` and search every directory above it, by the mode bits (owner,
/// group or others, as the kernel picks them; no access lists).
pub fn reachable_by(p: &Path, u: User) -> bool {
    use std::os::unix::fs::MetadataExt;
    let allows = |m: &fs::Metadata, bit: u32| {
        let shift = if m.uid() == u.uid {
            6
        } else if m.gid() == u.gid {
            3
        } else {
            0
        };
        u.uid == 0 || m.mode() & (bit << shift) != 0
    };
    fs::metadata(p).is_ok_and(|m| allows(&m, 0o4))
        && p.ancestors()
            .skip(1)
            .all(|d| fs::metadata(d).is_ok_and(|m| allows(&m, 0o1)))
}

/// Makes this process `u` (root too): no supplementary groups, then the group, then the
/// user, checked; then no capability left in any set. Called by the init after the walls are
/// up and the bounding set is empty.
pub fn become_user(u: User) -> Result<()> {
    use nix::unistd::{getgroups, getresgid, getresuid, setgroups, setresgid, setresuid};
    use nix::unistd::{Gid, Uid};
    setgroups(&[]).context("dropping supplementary groups")?;
    let g = Gid::from_raw(u.gid);
    setresgid(g, g, g).with_context(|| format!("becoming group {}", u.gid))?;
    let id = Uid::from_raw(u.uid);
    setresuid(id, id, id).with_context(|| format!("becoming user {}", u.uid))?;
    let (r, gr) = (getresuid()?, getresgid()?);
    if [r.real, r.effective, r.saved] != [id; 3]
        || [gr.real, gr.effective, gr.saved] != [g; 3]
        || !getgroups()?.iter().all(|x| *x == g)
    {
        bail!("the change of user to {u} did not hold");
    }
    caps::clear(None, caps::CapSet::Effective).context("clearing effective capabilities")?;
    caps::clear(None, caps::CapSet::Permitted).context("clearing permitted capabilities")?;
    Ok(())
}

fn mnt(
    src: Option<&str>,
    at: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    mount(src, at, fstype, flags, data).with_context(|| {
        format!(
            "mounting {} on {}",
            src.or(fstype).unwrap_or("?"),
            at.display()
        )
    })
}

/// Binds `src` (an open file or directory, by fd) onto `at`, read-only and nosuid. Not
/// recursive: mounts under `src` are not carried over, so none of them can stay writable under
/// a read-only bind.
fn bind_fd(src: &File, at: &Path, node: Node) -> Result<()> {
    let s = format!("/proc/self/fd/{}", src.as_raw_fd());
    mnt(Some(&s), at, None, MsFlags::MS_BIND, None)?;
    // the remount sets the bind's flags anew: what is not said here is cleared, so the source
    // mount's noexec is carried over, and device nodes in a tree shown from the host (an image
    // with its own /dev, say) cannot be opened
    let mut ro = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID;
    if node == Node::Tree {
        ro |= MsFlags::MS_NODEV;
    }
    let noexec = nix::sys::statvfs::fstatvfs(src)
        .with_context(|| format!("the mount behind {}", at.display()))?
        .flags()
        .contains(nix::sys::statvfs::FsFlags::ST_NOEXEC);
    if noexec {
        ro |= MsFlags::MS_NOEXEC;
    }
    mnt(None, at, None, ro, None)
}

/// What a bind shows: a tree (no device node in it opens) or a device node (the container's
/// `/dev`, and `/dev/null` over what is masked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Tree,
    Device,
}

fn open_path(p: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(p)
        .with_context(|| format!("opening {}", p.display()))
}

/// A mount point for `src` under `root`: a directory, or an empty file for a file.
fn mountpoint(root: &Path, path: &Path, dir: bool) -> Result<PathBuf> {
    let at = root.join(path.strip_prefix("/").unwrap_or(path));
    if dir {
        fs::create_dir_all(&at)?;
    } else {
        if let Some(p) = at.parent() {
            fs::create_dir_all(p)?;
        }
        File::create(&at)?;
    }
    Ok(at)
}

/// Builds the container's root and moves into it. Runs in the container's init, in a mount
/// namespace of its own, before anything of the command runs.
pub fn build_root(w: &Walls) -> Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("a mount namespace for the root")?;
    mnt(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;
    // what the root shows, opened now: the staging tmpfs below may hide its paths
    let mut sources: Vec<(PathBuf, File)> = Vec::new();
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    let system: Vec<PathBuf> = match &w.rootfs {
        Some(r) => vec![r.clone()],
        None => SYSTEM.iter().map(PathBuf::from).collect(),
    };
    for p in system.iter().chain(w.binds.iter()) {
        match fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() && w.rootfs.is_none() => {
                links.push((p.clone(), fs::read_link(p)?));
            }
            Ok(_) => sources.push((p.clone(), open_path(p)?)),
            Err(_) if w.binds.contains(p) => bail!("--bind {}: no such directory", p.display()),
            Err(_) => {}
        }
    }
    let devnull = open_path(Path::new("/dev/null"))?;
    let devices: Vec<(&str, File)> = DEVICES
        .iter()
        .filter_map(|d| Some((*d, open_path(&Path::new("/dev").join(d)).ok()?)))
        .collect();

    let stage = Path::new("/run");
    let tmpfs = |at: &Path, opts: &str, extra: MsFlags| {
        mnt(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra,
            Some(opts),
        )
    };
    tmpfs(stage, "mode=0755,size=64k", MsFlags::empty())?;
    let root = stage.join("root");
    fs::create_dir(&root)?;
    tmpfs(&root, "mode=0755,size=4m", MsFlags::empty())?;
    // the private /tmp and /run first, so a directory shown from under the host's /tmp (a
    // checkout there, say) is bound on top of them rather than hidden by them
    let run_opts = format!("mode=0755,size=16m,uid={},gid={}", w.user.uid, w.user.gid);
    for (d, opts) in [("/tmp", "mode=1777,size=256m"), ("/run", run_opts.as_str())] {
        tmpfs(
            &mountpoint(&root, Path::new(d), true)?,
            opts,
            MsFlags::empty(),
        )?;
    }

    for (p, f) in &sources {
        let target = if w.rootfs.as_ref() == Some(p) {
            PathBuf::from("/")
        } else {
            p.clone()
        };
        let dir = fs::metadata(p).map(|m| m.is_dir()).unwrap_or(true);
        let at = mountpoint(&root, &target, dir)?;
        bind_fd(f, &at, Node::Tree)?;
    }
    for (p, to) in &links {
        let at = root.join(p.strip_prefix("/").unwrap_or(p));
        std::os::unix::fs::symlink(to, at)?;
    }
    if w.rootfs.is_none() {
        for s in SECRETS.iter().map(Path::new).filter(|s| s.exists()) {
            let at = root.join(s.strip_prefix("/")?);
            bind_fd(&devnull, &at, Node::Device)?;
        }
        for d in SECRET_DIRS.iter().map(Path::new).filter(|d| d.is_dir()) {
            tmpfs(
                &root.join(d.strip_prefix("/")?),
                "mode=0700,size=4k",
                MsFlags::MS_RDONLY,
            )?;
        }
    }
    if let Some(text) = &w.resolv {
        put_resolv(&root, stage, text)?;
    }
    make_dev(&root, &devices, &tmpfs)?;
    make_proc(&root, &devnull, &tmpfs)?;
    let sys = mountpoint(&root, Path::new("/sys"), true)?;
    let ro = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY;
    mnt(Some("sysfs"), &sys, Some("sysfs"), ro, None)?;
    for h in SYS_HIDDEN
        .iter()
        .map(|h| sys.join(h))
        .filter(|h| h.is_dir())
    {
        tmpfs(&h, "mode=0555,size=4k", MsFlags::MS_RDONLY)?;
    }
    let old = root.join(".old");
    fs::create_dir(&old)?;
    nix::unistd::pivot_root(&root, &old).context("pivot_root into the container's root")?;
    std::env::set_current_dir("/")?;
    umount2("/.old", MntFlags::MNT_DETACH).context("detaching the host's root")?;
    fs::remove_dir("/.old")?;
    let ro_root = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID;
    mnt(None, Path::new("/"), None, ro_root, None)
}

/// Puts the container's own `/etc/resolv.conf` over the one its `/etc` shows: bound over it
/// (read-only) when that is a file; written where it points when it is a link into the
/// container's private `/run` or `/tmp` (systemd-resolved's stub link is one). `stage` is a
/// tmpfs of the init's own, which the container never sees.
fn put_resolv(root: &Path, stage: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let at = root.join("etc/resolv.conf");
    let write = |p: &Path| -> Result<()> {
        fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
        fs::set_permissions(p, fs::Permissions::from_mode(0o644))?;
        Ok(())
    };
    match fs::symlink_metadata(&at) {
        Ok(m) if m.file_type().is_file() => {
            let src = stage.join("resolv.conf");
            write(&src)?;
            bind_fd(&File::open(&src)?, &at, Node::Tree)
        }
        Ok(m) if m.file_type().is_symlink() => {
            let to = fs::read_link(&at)?;
            let inside = lexical(&Path::new("/etc").join(&to));
            if !(inside.starts_with("/run") || inside.starts_with("/tmp")) {
                bail!(
                    "--dns: the container's /etc/resolv.conf is a link to {}, outside its private /run and /tmp, and its /etc is read-only",
                    to.display()
                );
            }
            let dest = root.join(inside.strip_prefix("/")?);
            if let Some(d) = dest.parent() {
                fs::create_dir_all(d)?;
            }
            write(&dest)
        }
        _ => bail!(
            "--dns: the container's /etc has no resolv.conf to show the servers in, and it is read-only"
        ),
    }
}

/// `p` with `.` and `..` resolved by name (no link followed), from `/`.
fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// A private `/dev`: a tmpfs with the usual nodes bound read-only from the host's, the standard
/// symlinks, and a private `/dev/shm`.
fn make_dev(
    root: &Path,
    devices: &[(&str, File)],
    tmpfs: &dyn Fn(&Path, &str, MsFlags) -> Result<()>,
) -> Result<()> {
    let dev = mountpoint(root, Path::new("/dev"), true)?;
    tmpfs(&dev, "mode=0755,size=64k", MsFlags::MS_NOEXEC)?;
    for (name, f) in devices {
        let at = dev.join(name);
        File::create(&at)?;
        // read-only: the node is the host's inode, and root without capabilities still owns it
        // (a writable bind let `chmod 000 /dev/null` reach the host's). A device stays readable
        // and writable on a read-only mount: the kernel applies a mount's read-only flag to
        // files, directories and links, not to what a device node opens.
        bind_fd(f, &at, Node::Device)?;
    }
    for (l, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(l))?;
    }
    let shm = dev.join("shm");
    fs::create_dir(&shm)?;
    tmpfs(&shm, "mode=1777,size=64m", MsFlags::MS_NOEXEC)
}

/// The container's own `/proc`, with knobs read-only and kernel internals masked.
fn make_proc(
    root: &Path,
    devnull: &File,
    tmpfs: &dyn Fn(&Path, &str, MsFlags) -> Result<()>,
) -> Result<()> {
    let proc_ = mountpoint(root, Path::new("/proc"), true)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mnt(Some("proc"), &proc_, Some("proc"), flags, None)?;
    for m in PROC_MASKED
        .iter()
        .map(|m| proc_.join(m))
        .filter(|m| m.exists())
    {
        bind_fd(devnull, &m, Node::Device)?;
    }
    for h in PROC_HIDDEN
        .iter()
        .map(|h| proc_.join(h))
        .filter(|h| h.is_dir())
    {
        tmpfs(&h, "mode=0555,size=4k", MsFlags::MS_RDONLY)?;
    }
    for r in PROC_READONLY
        .iter()
        .map(|r| proc_.join(r))
        .filter(|r| r.exists())
    {
        let f = open_path(&r)?;
        bind_fd(&f, &r, Node::Tree)?;
    }
    Ok(())
}

/// Drops every capability from the bounding, inheritable and ambient sets (the command, as
/// root or as its own user, then starts with none), and sets `no_new_privs`.
pub fn drop_privileges() -> Result<()> {
    // capabilities this kernel does not know cannot be in any set: skip them
    let known = caps::runtime::procfs_all_supported(None).unwrap_or_else(|_| caps::all());
    for cap in known {
        caps::drop(None, caps::CapSet::Bounding, cap)
            .with_context(|| format!("dropping {cap} from the bounding set"))?;
    }
    caps::clear(None, caps::CapSet::Inheritable).context("clearing inheritable capabilities")?;
    caps::clear(None, caps::CapSet::Ambient).context("clearing ambient capabilities")?;
    nix::sys::prctl::set_no_new_privs().context("setting no_new_privs")?;
    Ok(())
}

/// System calls a network application in a container has no business making: they fail
/// with EPERM (or ENOSYS for clone3, so C libraries fall back to clone, whose namespace flags
/// are refused).
const DENIED: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_fanotify_init,
    libc::SYS_vhangup,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_iopl,
    libc::SYS_ioperm,
];

/// Namespace flags `clone` may not carry.
const CLONE_NS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

fn sc<T, E: std::fmt::Debug>(r: std::result::Result<T, E>) -> Result<T> {
    r.map_err(|e| anyhow::anyhow!("building the seccomp filter: {e:?}"))
}

/// The default seccomp filters, as BPF programs: the denied calls, `clone` with a namespace
/// flag, and `clone3` (whose flags live in memory a filter cannot read: ENOSYS, so C libraries
/// fall back to `clone`).
pub fn seccomp_programs() -> Result<Vec<seccompiler::BpfProgram>> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    let arch: seccompiler::TargetArch = sc(std::env::consts::ARCH.try_into())?;
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|s| (*s, Vec::new())).collect();
    // clone matches (is refused) when any namespace flag is set: one rule per flag
    let mut clone_rules = Vec::new();
    for f in (0..64).map(|b| 1u64 << b).filter(|f| CLONE_NS & f != 0) {
        let c = sc(SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(f),
            f,
        ))?;
        clone_rules.push(sc(SeccompRule::new(vec![c]))?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let denied = sc(SeccompFilter::new(rules, SeccompAction::Allow, eperm, arch))?;
    let clone3 = sc(SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    ))?;
    Ok(vec![sc(denied.try_into())?, sc(clone3.try_into())?])
}

/// On x86_64, a filter that refuses (ENOSYS) every system call made through the x32 ABI:
/// their numbers carry bit 30 and would slip past the exact-number rules above on a kernel
/// built with x32. seccompiler has no rule for a bit test, so this one is four instructions.
fn x32_program() -> Option<seccompiler::BpfProgram> {
    use seccompiler::sock_filter;
    if std::env::consts::ARCH != "x86_64" {
        return None;
    }
    let ins = |code: u32, jt: u8, jf: u8, k: u32| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    Some(vec![
        // A = seccomp_data.nr
        ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        // if (A & __X32_SYSCALL_BIT) goto refuse
        ins(
            libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
            0,
            1,
            0x4000_0000,
        ),
        ins(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        ins(libc::BPF_RET | libc::BPF_K, 0, 0, SECCOMP_RET_ALLOW),
    ])
}

/// Installs the default seccomp filters on this thread (inherited by everything it starts).
pub fn install_seccomp() -> Result<()> {
    for p in seccomp_programs()?.into_iter().chain(x32_program()) {
        seccompiler::apply_filter(&p).context("installing the seccomp filter")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_links_target_is_read_from_slash_by_name() {
        let l = |p: &str| lexical(Path::new(p));
        assert_eq!(
            l("/etc/../run/systemd/resolve/stub-resolv.conf"),
            Path::new("/run/systemd/resolve/stub-resolv.conf")
        );
        assert_eq!(l("/etc/../../../tmp/./r"), Path::new("/tmp/r"));
        assert_eq!(l("/etc//resolv.conf"), Path::new("/etc/resolv.conf"));
    }

    #[test]
    fn an_own_id_a_host_account_has_is_refused() {
        if !nix::unistd::Uid::effective().is_root() {
            // setns needs root; where root tests are required (CI) this is a failure
            assert_ne!(
                std::env::var("DOCKNET_REQUIRE_ROOT_TESTS").as_deref(),
                Ok("1"),
                "an_own_id_a_host_account_has_is_refused needs root"
            );
            return;
        }
        let host = File::open("/proc/self/ns/net").unwrap();
        let root = User { uid: 0, gid: 0 };
        let e = no_account_has(root, &host).unwrap_err().to_string();
        assert!(e.contains("the host's user root"), "{e}");
        let free = User {
            uid: 0x7FFF_FFFD,
            gid: 0x7FFF_FFFD,
        };
        assert!(no_account_has(free, &host).is_ok());
    }

    #[test]
    fn subordinate_and_mapped_id_ranges_are_read() {
        let sub = "alice:100000:65536\n# comment\nbob:1879048192:10\nbad line\ncarol:x:1\n";
        assert!(id_in_ranges(sub, 100_000, subid_range));
        assert!(id_in_ranges(sub, 165_535, subid_range));
        assert!(!id_in_ranges(sub, 165_536, subid_range));
        assert!(id_in_ranges(sub, 0x7000_0009, subid_range));
        assert!(!id_in_ranges(sub, 0x7000_000A, subid_range));
        assert!(!id_in_ranges("", 0, subid_range));
        // uid_map: inside, outside, count; the initial namespace maps every id
        let all = "         0          0 4294967295\n";
        assert!(id_in_ranges(all, 0x7000_0001, map_range));
        assert!(!id_in_ranges("0 100000 65536\n", 0x7000_0001, map_range));
        assert!(id_in_ranges("0 100000 65536\n", 65_535, map_range));
    }

    #[test]
    fn a_container_s_own_user_is_numbered_by_its_network_namespace() {
        assert_eq!(
            User::own(0xF000_0001).unwrap(),
            User {
                uid: 0x7000_0001,
                gid: 0x7000_0001
            }
        );
        // the host's first namespaces have fixed numbers below the dynamic ones
        assert!(User::own(0xEFFF_FFFC).is_err());
        // never into systemd's foreign range, never -1
        let top = User::own(0xF000_0000 + 0x0FFD_FFFF).unwrap();
        assert!(top.uid < 0x7FFE_0000 && top.uid > 1_879_048_191, "{top}");
        assert!(User::own(0xFFFF_FFFF).is_err());
        assert!(User::own(u64::MAX).is_err());
        // a real one, from this process's own network namespace's inode
        use std::os::unix::fs::MetadataExt;
        let ino = fs::metadata("/proc/self/ns/net").unwrap().ino();
        if ino >= NS_INODE_FIRST {
            assert!(User::own(ino).is_ok());
        }
    }

    #[test]
    fn users_are_read_as_numbers_or_names() {
        let u = |uid, gid| Ok(User { uid, gid });
        assert_eq!(parse_user("65534:65534"), u(65534, 65534));
        assert_eq!(parse_user("0"), u(0, 0));
        assert_eq!(parse_user("root"), u(0, 0));
        assert_eq!(parse_user("root:root"), u(0, 0));
        assert_eq!(parse_user("1000:0"), u(1000, 0), "group 0 when it is said");
        // a number without an entry in /etc/passwd: the same number as its group
        assert_eq!(parse_user("54321"), u(54321, 54321));
        for bad in [
            "4294967295",
            "1:4294967295",
            "no-such-user",
            "0:no-such-group",
            "x:",
        ] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reachable_means_the_file_and_every_directory_above_it() {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("d");
        fs::create_dir(&dir).unwrap();
        let f = dir.join("lib.so");
        fs::write(&f, b"x").unwrap();
        set(top.path(), 0o755);
        set(&dir, 0o755);
        set(&f, 0o644);
        let nobody = User {
            uid: 65534,
            gid: 65534,
        };
        assert!(reachable_by(&f, nobody));
        set(&dir, 0o700);
        assert!(!reachable_by(&f, nobody), "a directory it cannot search");
        assert!(reachable_by(&f, User::default()), "root passes");
        set(&dir, 0o755);
        set(&f, 0o600);
        assert!(!reachable_by(&f, nobody), "a file it cannot read");
        assert!(!reachable_by(&dir.join("missing"), nobody));
    }
}
