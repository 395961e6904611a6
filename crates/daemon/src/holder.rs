//! The fd holder: a small process that keeps the daemon's regions (sealed memfds) and the
//! listening sockets it bound inside containers' namespaces alive while the daemon is gone, and
//! hands them back to the next daemon. Without it a killed daemon would lose every region it
//! created, and getting them back from containers would mean trusting them.
//!
//! The daemon starts it (`docknet __holder --socket RUN_DIR/holder.sock`, a new session, its
//! pid in `RUN_DIR/holder.pid`) or finds it already running. They speak over a
//! `SOCK_SEQPACKET` socket in the daemon's private run directory, one connection at a time:
//!
//! ```text
//!  P<key> + fd   keep fd under key (replacing one kept there)   -> K
//!  D<key>        drop the fd kept under key                     -> K
//!  L             list                                           -> I<key> + fd ... E
//!  S             what it keeps, for `docknet status`             -> S<count> <secs left>
//! ```
//!
//! The holder exits once the daemon has hung up and it keeps nothing. While no daemon is
//! connected it also exits when its socket is gone from the run directory (the directory was
//! removed, or another holder took the path), and after the grace period (`--holder-grace`) with
//! no daemon: a daemon that is stopped for good, in a directory nobody removes, does not leave
//! its regions' memory held forever. A daemon that comes back within the grace adopts every pipe.

use docknet_pipe::fdpass;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest key (`sock/` + the longest pipe name, with room).
const MAX_KEY: usize = 200;
/// Most fds kept (a generous bound on pipes + channels + sockets).
const MAX_KEPT: usize = 65536;

/// The holder's socket in a run directory.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join("holder.sock")
}

/// The holder's pid file in a run directory.
pub fn pid_path(run_dir: &Path) -> PathBuf {
    run_dir.join("holder.pid")
}

/// How often (ms) a holder without a daemon looks for its socket.
const CHECK_EVERY_MS: u16 = 500;

/// A grace period: how long a holder keeps regions with no daemon (`None`: without limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace(pub Option<Duration>);

/// Parses a grace period: seconds (`300`), with a unit (`90s`, `10m`, `2h`), or `forever`.
pub fn parse_grace(s: &str) -> Result<Grace, String> {
    if s == "forever" {
        return Ok(Grace(None));
    }
    let bad = || format!("{s:?}: use seconds (300), 90s, 10m, 2h or forever");
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(bad()),
    };
    Ok(Grace(Some(Duration::from_secs(secs))))
}

/// Whether `sock` is still the socket this holder bound (its inode), so a removed run
/// directory, or a new holder on the same path, ends this one.
fn still_ours(sock: &Path, ino: u64) -> bool {
    std::fs::symlink_metadata(sock).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ino)
}

/// Runs the holder on `sock` until the daemon has hung up with nothing kept, the socket is gone
/// from its directory, or `grace` (`None`: no limit) has passed with no daemon connected.
pub fn serve(sock: &Path, grace: Option<Duration>) -> io::Result<()> {
    // a session of its own: a terminal's Ctrl-C or hang-up does not reach it
    let _ = nix::unistd::setsid();
    // the daemon waits for each answer: under load a holder at the containers' priority made
    // building a channel wait for tens of milliseconds
    crate::raise_control_plane();
    let _ = std::fs::remove_file(sock);
    let listener = fdpass::listen_path(sock)?;
    std::fs::set_permissions(sock, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::symlink_metadata(sock)?);
    let me = nix::unistd::Uid::effective().as_raw();
    let mut kept: BTreeMap<String, OwnedFd> = BTreeMap::new();
    // the daemon that started this holder connects at once; the grace runs from each hang-up
    let mut since = Instant::now();
    loop {
        if !kept.is_empty() {
            if !still_ours(sock, ino) {
                return Ok(());
            }
            if grace.is_some_and(|g| since.elapsed() >= g) {
                let _ = std::fs::remove_file(sock);
                return Ok(());
            }
        }
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, CHECK_EVERY_MS) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let conn = match fdpass::accept_blocking(listener.as_fd()) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // only the daemon (same user) may talk to it
        match fdpass::peer_cred(conn.as_fd()) {
            Ok((_, uid, _)) if uid == me || uid == 0 => {}
            _ => continue,
        }
        let left = grace.map(|g| g.saturating_sub(since.elapsed()));
        if session(&conn, &mut kept, left) {
            since = Instant::now();
        }
        if kept.is_empty() {
            let _ = std::fs::remove_file(sock);
            return Ok(());
        }
    }
}

/// Serves one connection until it hangs up; returns whether it was a daemon's (it kept,
/// dropped or listed), which restarts the grace. `left`: the grace that remains, for `S`.
fn session(conn: &OwnedFd, kept: &mut BTreeMap<String, OwnedFd>, left: Option<Duration>) -> bool {
    let mut daemon = false;
    let mut buf = [0u8; MAX_KEY + 1];
    loop {
        let (n, fd) = match fdpass::recv(conn.as_fd(), &mut buf) {
            Ok(Some(x)) if x.0 > 0 => x,
            Ok(_) | Err(_) => return daemon,
        };
        let (op, key) = (buf[0], String::from_utf8_lossy(&buf[1..n]).into_owned());
        daemon |= matches!(op, b'P' | b'D' | b'L');
        let state;
        let reply: &[u8] = match (op, fd) {
            (b'P', Some(fd))
                if !key.is_empty() && (kept.len() < MAX_KEPT || kept.contains_key(&key)) =>
            {
                kept.insert(key, fd);
                b"K"
            }
            (b'D', None) => {
                kept.remove(&key);
                b"K"
            }
            (b'L', None) => {
                for (k, fd) in kept.iter() {
                    let msg = [b"I", k.as_bytes()].concat();
                    if fdpass::send(conn.as_fd(), &msg, Some(fd.as_fd())).is_err() {
                        return daemon;
                    }
                }
                b"E"
            }
            (b'S', None) => {
                state = format!(
                    "S{} {}",
                    kept.len(),
                    left.map_or("forever".into(), |l| l.as_secs().to_string())
                );
                state.as_bytes()
            }
            _ => b"?",
        };
        if fdpass::send(conn.as_fd(), reply, None).is_err() {
            return daemon;
        }
    }
}

/// What a holder without a daemon keeps, as `docknet status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldState {
    /// The holder's pid (from `holder.pid`; 0 when unreadable).
    pub pid: u32,
    /// Regions and sockets it keeps.
    pub kept: usize,
    /// Seconds until it gives them up (`None`: it waits for a daemon without limit).
    pub seconds_left: Option<u64>,
}

/// Asks the holder of `run_dir`, if one answers, what it keeps. Only meaningful while no daemon
/// is connected (a holder serves one connection at a time; this gives up after 1 s).
pub fn held(run_dir: &Path) -> Option<HeldState> {
    let conn = fdpass::connect_path(&socket_path(run_dir)).ok()?;
    let t = nix::sys::time::TimeVal::new(1, 0);
    let _ = nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::ReceiveTimeout, &t);
    fdpass::send(conn.as_fd(), b"S", None).ok()?;
    let mut b = [0u8; 64];
    let (n, _) = fdpass::recv(conn.as_fd(), &mut b).ok()??;
    let text = std::str::from_utf8(b.get(1..n)?).ok()?;
    let (kept, left) = text.split_once(' ')?;
    let pid = std::fs::read_to_string(pid_path(run_dir))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    Some(HeldState {
        pid,
        kept: kept.parse().ok()?,
        seconds_left: left.parse().ok(),
    })
}

/// Where the registry keeps its fds so a later registry can have them back: the holder process
/// ([`Holder`]), or this process ([`MemoryKeeper`], for tests and fuzzing).
pub trait Keeper: std::fmt::Debug + Send {
    /// Keeps `fd` under `key` (replacing what was kept there).
    fn put(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()>;
    /// Drops what is kept under `key`.
    fn drop_key(&self, key: &str) -> io::Result<()>;
    /// Everything kept, by key (duplicates: the keeper still holds its own).
    fn list(&self) -> io::Result<BTreeMap<String, OwnedFd>>;
}

/// A keeper inside this process: what the holder does, without the process. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct MemoryKeeper(std::sync::Arc<std::sync::Mutex<BTreeMap<String, OwnedFd>>>);

impl Keeper for MemoryKeeper {
    fn put(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        let fd = fd.try_clone_to_owned()?;
        self.0
            .lock()
            .map_err(|_| io::Error::other("keeper poisoned"))?
            .insert(key.into(), fd);
        Ok(())
    }
    fn drop_key(&self, key: &str) -> io::Result<()> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("keeper poisoned"))?
            .remove(key);
        Ok(())
    }
    fn list(&self) -> io::Result<BTreeMap<String, OwnedFd>> {
        let kept = self
            .0
            .lock()
            .map_err(|_| io::Error::other("keeper poisoned"))?;
        kept.iter()
            .map(|(k, f)| Ok((k.clone(), f.try_clone()?)))
            .collect()
    }
}

/// The daemon's connection to its holder.
#[derive(Debug)]
pub struct Holder {
    conn: OwnedFd,
}

impl Holder {
    /// Connects to the holder of `run_dir`, starting one (`exe __holder ...`, keeping regions
    /// for `grace` with no daemon; `None`: without limit) if none answers.
    pub fn connect_or_start(
        run_dir: &Path,
        exe: &Path,
        grace: Option<Duration>,
    ) -> io::Result<Holder> {
        let sock = socket_path(run_dir);
        if let Ok(conn) = fdpass::connect_path(&sock) {
            return Ok(Holder { conn });
        }
        let child = std::process::Command::new(exe)
            .arg("__holder")
            .arg("--socket")
            .arg(&sock)
            .arg("--grace")
            .arg(grace.map_or("forever".into(), |g| g.as_secs().to_string()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        std::fs::write(pid_path(run_dir), child.id().to_string())?;
        let t = Instant::now();
        loop {
            if let Ok(conn) = fdpass::connect_path(&sock) {
                return Ok(Holder { conn });
            }
            if t.elapsed() > Duration::from_secs(5) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the fd holder did not open its socket within 5 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn call(&self, msg: &[u8], fd: Option<std::os::fd::BorrowedFd<'_>>) -> io::Result<()> {
        fdpass::send(self.conn.as_fd(), msg, fd)?;
        let mut b = [0u8; 4];
        match fdpass::recv(self.conn.as_fd(), &mut b)? {
            Some((1, None)) if b[0] == b'K' => Ok(()),
            _ => Err(io::Error::other("the fd holder refused the request")),
        }
    }

    fn check_key(key: &str) -> io::Result<()> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad holder key",
            ));
        }
        Ok(())
    }
}

impl Keeper for Holder {
    fn put(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        Self::check_key(key)?;
        self.call(&[b"P", key.as_bytes()].concat(), Some(fd))
    }

    fn drop_key(&self, key: &str) -> io::Result<()> {
        Self::check_key(key)?;
        self.call(&[b"D", key.as_bytes()].concat(), None)
    }

    fn list(&self) -> io::Result<BTreeMap<String, OwnedFd>> {
        fdpass::send(self.conn.as_fd(), b"L", None)?;
        let mut out = BTreeMap::new();
        let mut buf = [0u8; MAX_KEY + 1];
        loop {
            match fdpass::recv(self.conn.as_fd(), &mut buf)? {
                Some((n, Some(fd))) if n > 1 && buf[0] == b'I' => {
                    out.insert(String::from_utf8_lossy(&buf[1..n]).into_owned(), fd);
                }
                Some((1, None)) if buf[0] == b'E' => return Ok(out),
                _ => return Err(io::Error::other("the fd holder sent a bad list")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_keeps_fds_across_connections_and_exits_when_empty() {
        let d = tempfile::tempdir().unwrap();
        let sock = socket_path(d.path());
        let s2 = sock.clone();
        let t = std::thread::spawn(move || serve(&s2, None).unwrap());
        let connect = || loop {
            if let Ok(conn) = fdpass::connect_path(&sock) {
                return Holder { conn };
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let h = connect();
        let f = tempfile::tempfile().unwrap();
        h.put("pipe/a", f.as_fd()).unwrap();
        h.put("pipe/b", f.as_fd()).unwrap();
        h.drop_key("pipe/b").unwrap();
        assert!(h.put("", f.as_fd()).is_err());
        drop(h); // the daemon dies
        let h = connect();
        let kept = h.list().unwrap();
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["pipe/a"]);
        h.drop_key("pipe/a").unwrap();
        drop(h);
        t.join().unwrap();
        assert!(
            !sock.exists(),
            "an empty holder exits and removes its socket"
        );
    }

    fn holder_with_one_fd(
        grace: Option<Duration>,
    ) -> (tempfile::TempDir, std::thread::JoinHandle<()>) {
        let d = tempfile::tempdir().unwrap();
        let sock = socket_path(d.path());
        let s2 = sock.clone();
        let t = std::thread::spawn(move || serve(&s2, grace).unwrap());
        let h = loop {
            if let Ok(conn) = fdpass::connect_path(&sock) {
                break Holder { conn };
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let f = tempfile::tempfile().unwrap();
        h.put("pipe/a", f.as_fd()).unwrap();
        drop(h);
        (d, t)
    }

    #[test]
    fn a_holder_without_a_daemon_ends_when_its_directory_goes_or_its_grace_passes() {
        // the directory removed: gone within a check or two
        let (d, t) = holder_with_one_fd(None);
        let state = super::held(d.path()).expect("a holder with no daemon answers S");
        assert_eq!((state.kept, state.seconds_left), (1, None));
        let at = Instant::now();
        drop(d);
        t.join().unwrap();
        assert!(at.elapsed() < Duration::from_secs(3), "{:?}", at.elapsed());
        // the grace passed (a status query does not restart it)
        let (d, t) = holder_with_one_fd(Some(Duration::from_secs(1)));
        let state = super::held(d.path()).unwrap();
        assert_eq!(state.kept, 1);
        assert!(state.seconds_left.is_some_and(|s| s <= 1), "{state:?}");
        t.join().unwrap();
        assert!(!socket_path(d.path()).exists());
    }

    #[test]
    fn grace_parses_seconds_units_and_forever() {
        let secs = |s| Ok(Grace(Some(Duration::from_secs(s))));
        assert_eq!(parse_grace("300"), secs(300));
        assert_eq!(parse_grace("90s"), secs(90));
        assert_eq!(parse_grace("10m"), secs(600));
        assert_eq!(parse_grace("2h"), secs(7200));
        assert_eq!(parse_grace("forever"), Ok(Grace(None)));
        for bad in ["", "m", "5d", "-1", "1.5m"] {
            assert!(parse_grace(bad).is_err(), "{bad}");
        }
    }
}
