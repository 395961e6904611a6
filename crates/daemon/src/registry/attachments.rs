//! Attachments (a pipe's socket in a container's namespace) and the connections made to it.

use super::state::AttachRec;
use super::{err, internal, sock_key, validate_socket, Attachment, Registry, MAX_CONNS};
use crate::proto::{ApiError, ErrorCode};
use docknet_pipe::delivery::{self, Msg, PipeDesc};
use docknet_pipe::fdpass;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Opens a network namespace file given by a trusted client (the control socket is root's) and
/// checks that it is one. `/proc/PID/ns/net` is a magic link, so links are followed; what is
/// opened must be a namespace (nsfs), whatever the path was.
fn open_netns(path: &str) -> Result<OwnedFd, ApiError> {
    let bad = |why: String| {
        err(
            ErrorCode::BadParams,
            format!("network namespace {path:?}: {why}"),
        )
    };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| bad(e.to_string()))?;
    let st = nix::sys::statfs::fstatfs(&f).map_err(|e| bad(e.to_string()))?;
    if st.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(bad("not a namespace file".into()));
    }
    Ok(OwnedFd::from(f))
}

/// Whether any process lives in the network namespace with inode `ino` (a scan of /proc: only
/// when an attachment is contested).
fn netns_in_use(ino: u64) -> bool {
    let want = format!("net:[{ino}]");
    fs::read_dir("/proc").is_ok_and(|rd| {
        rd.flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .any(|e| {
                fs::read_link(e.path().join("ns/net"))
                    .is_ok_and(|l| l.as_os_str() == std::ffi::OsStr::new(&want))
            })
    })
}

/// A listening socket bound to the abstract name `socket` inside the network namespace `ns`:
/// a short-lived thread enters the namespace, binds, and ends.
fn bind_in_netns(ns: &OwnedFd, socket: &str) -> io::Result<OwnedFd> {
    let ns = ns.try_clone()?;
    let socket = socket.to_string();
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        fdpass::listen_abstract(&socket)
    })
    .join()
    .map_err(|_| io::Error::other("the binding thread panicked"))?
}

/// Whether a container connection is still open (no hang-up or error pending).
fn alive(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // hang-up and errors are always reported; a peer that closed leaves a SEQPACKET socket
    // hung up
    let mut p = [PollFd::new(fd.as_fd(), PollFlags::empty())];
    match poll(&mut p, PollTimeout::ZERO) {
        Ok(0) => true,
        Ok(_) => !p[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

impl Registry {
    /// Binds pipe `name`'s socket (abstract name `socket`) inside the network namespace at
    /// `netns` (a path from a trusted client: `/proc/PID/ns/net`, `/var/run/netns/NAME`).
    /// Returns the listening socket, for the caller to accept on. A pipe is handed to one
    /// container at a time; an attachment whose namespace no process lives in any more (its
    /// container died without detaching) is replaced.
    pub fn attach(
        &mut self,
        name: &str,
        netns: &str,
        socket: Option<&str>,
    ) -> Result<Arc<OwnedFd>, ApiError> {
        self.get(name)?;
        let socket = socket.unwrap_or(delivery::DEFAULT_SOCKET);
        validate_socket(socket)?;
        let ns = open_netns(netns)?;
        let ino = nix::sys::stat::fstat(&ns).map(|st| st.st_ino).unwrap_or(0);
        if let Some(old) = self.attached.get(name) {
            if old.netns != ino && (old.netns == 0 || netns_in_use(old.netns)) {
                return Err(err(
                    ErrorCode::Exists,
                    format!("pipe {name:?} is already attached to a running container (if it is gone: docknet pipe detach {name})"),
                ));
            }
            // the same namespace again, or one no process lives in: replace it
            self.detach(name)?;
        }
        let listener = bind_in_netns(&ns, socket).map_err(|e| {
            let code = if e.kind() == io::ErrorKind::AddrInUse {
                ErrorCode::Exists
            } else {
                ErrorCode::Internal
            };
            err(code, format!("binding @{socket} in {netns}: {e}"))
        })?;
        self.hold(&sock_key(name), listener.as_fd())?;
        let mut st = self.state();
        st.attached.push(AttachRec {
            pipe: name.into(),
            socket: socket.into(),
            netns: ino,
        });
        if let Err(e) = self.write(&st) {
            self.unhold(&sock_key(name));
            return Err(internal("saving state", e));
        }
        let listener = Arc::new(listener);
        self.attached.insert(
            name.into(),
            Attachment {
                socket: socket.into(),
                listener: listener.clone(),
                netns: ino,
            },
        );
        Ok(listener)
    }

    /// Closes pipe `name`'s socket in its container (connections already made stay).
    pub fn detach(&mut self, name: &str) -> Result<(), ApiError> {
        self.get(name)?;
        if !self.attached.contains_key(name) {
            return Err(err(
                ErrorCode::NotFound,
                format!("pipe {name:?} is not attached"),
            ));
        }
        let mut st = self.state();
        st.attached.retain(|a| a.pipe != name);
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.attached.remove(name);
        self.unhold(&sock_key(name));
        Ok(())
    }

    /// The attachments (pipe, listening socket), e.g. to accept on after a restart.
    pub fn attachments(&self) -> Vec<(String, Arc<OwnedFd>)> {
        self.attached
            .iter()
            .map(|(p, a)| (p.clone(), a.listener.clone()))
            .collect()
    }

    /// Whether `listener` is still pipe `name`'s socket.
    pub fn is_attached(&self, name: &str, listener: &Arc<OwnedFd>) -> bool {
        self.attached
            .get(name)
            .is_some_and(|a| Arc::ptr_eq(&a.listener, listener))
    }

    /// Hands pipe `name` to a new connection: its region, the gateway when the daemon drives a
    /// link, its channels, then `Synced`; the
    /// connection then gets every change of its channels. Refused (and counted) beyond
    /// [`MAX_CONNS`] live connections.
    pub fn add_conn(&mut self, name: &str, conn: OwnedFd) -> Result<(), ApiError> {
        let pipe = self.get(name)?.clone();
        let conns = self.conns.entry(name.into()).or_default();
        conns.retain(alive);
        if conns.len() >= MAX_CONNS {
            pipe.attach_refused.fetch_add(1, Ordering::Relaxed);
            return Err(err(
                ErrorCode::Busy,
                format!("pipe {name:?} has {MAX_CONNS} connections"),
            ));
        }
        let hello = Msg::Hello(PipeDesc {
            name: pipe.name.clone(),
            ip: pipe.ip,
            prefix: pipe.prefix,
            mac: pipe.mac,
            mtu: pipe.mtu,
            depth: pipe.info.rings[0].depth,
            ip6: pipe.ip6,
        });
        let mut msgs: Vec<(Vec<u8>, Option<&OwnedFd>)> = vec![(hello.encode(), Some(&pipe.memfd))];
        if self.gateway.is_some() {
            // frames beyond the pipe's network have a way out: the link
            let gw = Msg::Gateway {
                ip: docknet_pipe::delivery::GATEWAY,
            };
            msgs.push((gw.encode(), None));
        }
        for c in self
            .fcs
            .values()
            .filter(|c| c.rec.a == name || c.rec.b == name)
        {
            msgs.push((self.channel_msg(name, &c.rec).encode(), Some(&c.memfd)));
        }
        if let Some((m, fd)) = self.services_msg() {
            msgs.push((m, Some(fd)));
        }
        msgs.push((Msg::Synced.encode(), None));
        for (m, fd) in &msgs {
            fdpass::send(conn.as_fd(), m, fd.map(|f| f.as_fd()))
                .map_err(|e| internal("handing out the pipe", e))?;
        }
        self.conns.entry(name.into()).or_default().push(conn);
        Ok(())
    }

    /// Sends a message to every connection of `pipe`, dropping those that do not take it (gone,
    /// or not reading: a container's own loss).
    pub(super) fn send_all(&mut self, pipe: &str, msg: &[u8], fd: Option<&OwnedFd>) {
        if let Some(conns) = self.conns.get_mut(pipe) {
            conns.retain(|c| fdpass::send(c.as_fd(), msg, fd.map(|f| f.as_fd())).is_ok());
        }
    }

    /// Live connections of a pipe.
    pub fn connections(&mut self, name: &str) -> usize {
        self.conns.get_mut(name).map_or(0, |c| {
            c.retain(alive);
            c.len()
        })
    }

    /// An in-process connection to pipe `name` (tests, and programs that run the daemon's
    /// registry themselves): the other end of a socket pair handed to [`Registry::add_conn`].
    pub fn connect_local(&mut self, name: &str) -> Result<OwnedFd, ApiError> {
        let (mine, theirs) = fdpass::pair().map_err(|e| internal("socketpair", e))?;
        fdpass::set_nonblocking(mine.as_fd(), true).map_err(|e| internal("socketpair", e))?;
        self.add_conn(name, mine)?;
        Ok(theirs)
    }
}
