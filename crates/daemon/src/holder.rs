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
//! ```
//!
//! The holder exits once the daemon has hung up and it keeps nothing.

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

/// Runs the holder on `sock` until the daemon has hung up with nothing kept.
pub fn serve(sock: &Path) -> io::Result<()> {
    // a session of its own: a terminal's Ctrl-C or hang-up does not reach it
    let _ = nix::unistd::setsid();
    let _ = std::fs::remove_file(sock);
    let listener = fdpass::listen_path(sock)?;
    std::fs::set_permissions(sock, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let me = nix::unistd::Uid::effective().as_raw();
    let mut kept: BTreeMap<String, OwnedFd> = BTreeMap::new();
    loop {
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
        session(&conn, &mut kept);
        if kept.is_empty() {
            let _ = std::fs::remove_file(sock);
            return Ok(());
        }
    }
}

/// Serves one daemon connection until it hangs up.
fn session(conn: &OwnedFd, kept: &mut BTreeMap<String, OwnedFd>) {
    let mut buf = [0u8; MAX_KEY + 1];
    loop {
        let (n, fd) = match fdpass::recv(conn.as_fd(), &mut buf) {
            Ok(Some(x)) => x,
            Ok(None) | Err(_) => return,
        };
        let (op, key) = (buf[0], String::from_utf8_lossy(&buf[1..n]).into_owned());
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
                        return;
                    }
                }
                b"E"
            }
            _ => b"?",
        };
        if fdpass::send(conn.as_fd(), reply, None).is_err() {
            return;
        }
    }
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
    /// Connects to the holder of `run_dir`, starting one (`exe __holder ...`) if none answers.
    pub fn connect_or_start(run_dir: &Path, exe: &Path) -> io::Result<Holder> {
        let sock = socket_path(run_dir);
        if let Ok(conn) = fdpass::connect_path(&sock) {
            return Ok(Holder { conn });
        }
        let child = std::process::Command::new(exe)
            .arg("__holder")
            .arg("--socket")
            .arg(&sock)
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
        let t = std::thread::spawn(move || serve(&s2).unwrap());
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
}
