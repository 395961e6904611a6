//! The kernel's side: libc's own functions (found with `dlsym(RTLD_NEXT)`, since calling
//! `libc::close` from here would call this library's `close` again), errno, and safe wrappers
//! for the few calls the safe modules make. Every `unsafe` block of the library outside the
//! interposed entry points (`shim/`) is here.

#![allow(unsafe_code)]

use libc::{c_char, c_int, c_uint, c_ulong, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::sync::OnceLock;

/// An errno value.
pub type Errno = c_int;
/// A result whose error is an errno value.
pub type R<T> = Result<T, Errno>;

macro_rules! real_fns {
    ($($name:ident : unsafe extern "C" fn($($a:ty),*) -> $r:ty;)*) => {
        /// libc's functions, as the next object after this library defines them.
        #[allow(missing_debug_implementations)]
        pub struct Real {
            $(#[doc = concat!("libc's `", stringify!($name), "`")]
              pub $name: Option<unsafe extern "C" fn($($a),*) -> $r>,)*
            /// libc's `fcntl` (variadic)
            pub fcntl: Option<unsafe extern "C" fn(c_int, c_int, ...) -> c_int>,
            /// libc's `ioctl` (variadic)
            pub ioctl: Option<unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int>,
        }

        fn resolve() -> Real {
            Real {
                $($name: {
                    let p = sym(concat!(stringify!($name), "\0"));
                    // SAFETY: `p` is null or libc's function of this name, whose C signature
                    // is the one declared; Option<fn> is null-optimised, so null maps to None.
                    unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($a),*) -> $r>>(p) }
                },)*
                // SAFETY: as above, for the variadic `fcntl`.
                fcntl: unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn(c_int, c_int, ...) -> c_int>>(sym("fcntl\0")) },
                // SAFETY: as above, for the variadic `ioctl`.
                ioctl: unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int>>(sym("ioctl\0")) },
            }
        }
    };
}

real_fns! {
    socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
    bind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: unsafe extern "C" fn(c_int, c_int) -> c_int;
    accept: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    accept4: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
    read: unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    writev: unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    pread: unsafe extern "C" fn(c_int, *mut c_void, size_t, libc::off_t) -> ssize_t;
    lseek: unsafe extern "C" fn(c_int, libc::off_t, c_int) -> libc::off_t;
    recv: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    send: unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    recvfrom: unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    sendto: unsafe extern "C" fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    recvmsg: unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> ssize_t;
    sendmsg: unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
    recvmmsg: unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int, *mut libc::timespec) -> c_int;
    sendmmsg: unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int) -> c_int;
    close: unsafe extern "C" fn(c_int) -> c_int;
    shutdown: unsafe extern "C" fn(c_int, c_int) -> c_int;
    setsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    getsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    poll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
    ppoll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int;
    select: unsafe extern "C" fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int;
    pselect: unsafe extern "C" fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const libc::timespec, *const libc::sigset_t) -> c_int;
    epoll_create: unsafe extern "C" fn(c_int) -> c_int;
    epoll_create1: unsafe extern "C" fn(c_int) -> c_int;
    epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    epoll_wait: unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
    epoll_pwait: unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int;
    dup: unsafe extern "C" fn(c_int) -> c_int;
    dup2: unsafe extern "C" fn(c_int, c_int) -> c_int;
    dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
    sendfile: unsafe extern "C" fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t;
    eventfd: unsafe extern "C" fn(c_uint, c_int) -> c_int;
    pthread_sigmask: unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;
    sigaction: unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    getaddrinfo: unsafe extern "C" fn(*const c_char, *const c_char, *const libc::addrinfo, *mut *mut libc::addrinfo) -> c_int;
    freeaddrinfo: unsafe extern "C" fn(*mut libc::addrinfo) -> ();
    gethostbyname: unsafe extern "C" fn(*const c_char) -> *mut libc::hostent;
    gethostbyname2: unsafe extern "C" fn(*const c_char, c_int) -> *mut libc::hostent;
    gethostbyname_r: unsafe extern "C" fn(*const c_char, *mut libc::hostent, *mut c_char, size_t, *mut *mut libc::hostent, *mut c_int) -> c_int;
    gethostbyname2_r: unsafe extern "C" fn(*const c_char, c_int, *mut libc::hostent, *mut c_char, size_t, *mut *mut libc::hostent, *mut c_int) -> c_int;
}

fn sym(name: &str) -> *mut c_void {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT asks for the next definition after this
    // object's, i.e. libc's.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) }
}

static REAL: OnceLock<Real> = OnceLock::new();

/// libc's functions (resolved at load by the library's constructor, or at first use when
/// another library's constructor calls in earlier).
pub fn real() -> &'static Real {
    REAL.get_or_init(resolve)
}

/// Sets errno.
pub fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = e }
}

/// Reads errno.
pub fn errno() -> Errno {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

fn check(r: c_int) -> R<c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn checkl(r: ssize_t) -> R<usize> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

macro_rules! f {
    ($name:ident) => {
        real()
            .$name
            .expect(concat!("libc has no ", stringify!($name)))
    };
}

/// `close(2)` in the kernel.
pub fn close(fd: c_int) -> R<()> {
    // SAFETY: closing a descriptor number touches no memory of ours.
    check(unsafe { f!(close)(fd) }).map(|_| ())
}

/// A new eventfd: the kernel descriptor a DockNet socket is known by.
pub fn eventfd(cloexec: bool) -> R<c_int> {
    let flags = libc::EFD_NONBLOCK | if cloexec { libc::EFD_CLOEXEC } else { 0 };
    // SAFETY: plain syscall wrapper, no pointers.
    check(unsafe { f!(eventfd)(0, flags) })
}

/// `dup3(2)`.
pub fn dup3(old: c_int, new: c_int, cloexec: bool) -> R<c_int> {
    // SAFETY: plain syscall wrapper, no pointers.
    check(unsafe { f!(dup3)(old, new, if cloexec { libc::O_CLOEXEC } else { 0 }) })
}

/// Puts the descriptor `src` in the place of `fd` (`dup3`), `fd`'s close-on-exec kept, and
/// closes `src` whatever happens.
pub fn dup_over(src: c_int, fd: c_int) -> R<()> {
    let cloexec = fcntl_int(fd, libc::F_GETFD, 0).is_ok_and(|f| f & libc::FD_CLOEXEC != 0);
    let r = dup3(src, fd, cloexec).map(|_| ());
    let _ = close(src);
    r
}

/// `fcntl(fd, cmd, arg)` with an integer argument.
pub fn fcntl_int(fd: c_int, cmd: c_int, arg: c_int) -> R<c_int> {
    // SAFETY: the commands used with this wrapper take an int (or nothing).
    check(unsafe { f!(fcntl)(fd, cmd, arg) })
}

/// Adds 1 to an eventfd's counter (wakes whoever polls it).
pub fn eventfd_signal(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    let _ = unsafe { f!(write)(fd, &one as *const u64 as *const c_void, 8) };
}

/// Empties an eventfd's counter (non-blocking).
pub fn eventfd_drain(fd: c_int) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64.
    let _ = unsafe { f!(read)(fd, &mut v as *mut u64 as *mut c_void, 8) };
}

/// A kernel wait of `timeout_ms` (0: a look, which is no sleep), as a sleep where the
/// program's signal handlers run (`sig::asleep`); its result checked.
fn kernel_wait(timeout_ms: c_int, call: impl FnOnce() -> c_int) -> R<usize> {
    let r = if timeout_ms == 0 {
        call()
    } else {
        crate::sig::asleep(|_| call())
    };
    check(r).map(|n| n as usize)
}

/// `poll(2)` in the kernel; a wait (a timeout other than 0) is a sleep where the program's
/// signal handlers run (`sig::asleep`).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> R<usize> {
    // SAFETY: `fds` is a live slice of pollfd of the length passed.
    kernel_wait(timeout_ms, || unsafe {
        f!(poll)(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms)
    })
}

/// `epoll_wait(2)` in the kernel; a wait (a timeout other than 0) is a sleep where the
/// program's signal handlers run (`sig::asleep`).
pub fn epoll_wait(epfd: c_int, out: &mut [libc::epoll_event], timeout_ms: c_int) -> R<usize> {
    // SAFETY: `out` is a live slice of epoll_event of the length passed.
    kernel_wait(timeout_ms, || unsafe {
        f!(epoll_wait)(epfd, out.as_mut_ptr(), out.len() as c_int, timeout_ms)
    })
}

/// `epoll_ctl(2)` in the kernel.
pub fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: Option<libc::epoll_event>) -> R<()> {
    let mut e = ev.unwrap_or(libc::epoll_event { events: 0, u64: 0 });
    let p = if ev.is_some() {
        &mut e as *mut libc::epoll_event
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: `p` is null or points to a live epoll_event.
    check(unsafe { f!(epoll_ctl)(epfd, op, fd, p) }).map(|_| ())
}

/// `socketpair(AF_UNIX, ty | SOCK_CLOEXEC)`.
pub fn socketpair(ty: c_int) -> R<(c_int, c_int)> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: writes two ints into the live array (socketpair is not interposed).
    check(unsafe {
        libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    })?;
    Ok((fds[0], fds[1]))
}

/// The address of the abstract Unix socket `name` (no file: scoped to the network namespace,
/// gone with its last descriptor).
fn abstract_addr(name: &str) -> (libc::sockaddr_un, socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays 0: the abstract namespace
    let n = name.len().min(a.sun_path.len() - 1);
    for (d, s) in a.sun_path[1..=n].iter_mut().zip(name.bytes()) {
        *d = s as c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as socklen_t)
}

/// A listening Unix stream socket (non-blocking, close-on-exec) at the abstract name `name`.
pub fn unix_listen_abstract(name: &str, backlog: c_int) -> R<c_int> {
    let (a, len) = abstract_addr(name);
    // SAFETY: plain syscall wrapper, no pointers.
    let fd = check(unsafe {
        f!(socket)(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })?;
    // SAFETY: `a` is a live sockaddr_un of which `len` bytes are passed.
    let r = check(unsafe { f!(bind)(fd, &a as *const libc::sockaddr_un as *const sockaddr, len) })
        // SAFETY: plain syscall wrapper, no pointers.
        .and_then(|_| check(unsafe { f!(listen)(fd, backlog) }));
    match r {
        Ok(_) => Ok(fd),
        Err(e) => {
            let _ = close(fd);
            Err(e)
        }
    }
}

/// A Unix stream socket (blocking, close-on-exec) connected to the abstract name `name`.
pub fn unix_connect_abstract(name: &str) -> R<c_int> {
    let (a, len) = abstract_addr(name);
    // SAFETY: plain syscall wrapper, no pointers.
    let fd =
        check(unsafe { f!(socket)(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `a` is a live sockaddr_un of which `len` bytes are passed.
    match check(unsafe { f!(connect)(fd, &a as *const libc::sockaddr_un as *const sockaddr, len) })
    {
        Ok(_) => Ok(fd),
        Err(e) => {
            let _ = close(fd);
            Err(e)
        }
    }
}

/// `accept4(2)` in the kernel of a connection to a Unix listener, non-blocking and
/// close-on-exec, with the user id of the process that connected (`SO_PEERCRED`).
pub fn unix_accept(fd: c_int) -> R<(c_int, u32)> {
    // SAFETY: no address asked for.
    let c = check(unsafe {
        f!(accept4)(
            fd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live `cred`.
    let r = check(unsafe {
        f!(getsockopt)(
            c,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut c_void,
            &mut len,
        )
    });
    match r {
        Ok(_) => Ok((c, cred.uid)),
        Err(e) => {
            let _ = close(c);
            Err(e)
        }
    }
}

/// Bytes sent on the Unix socket `fd` that its peer has not read yet (`SIOCOUTQ`).
pub fn unread_by_peer(fd: c_int) -> R<usize> {
    let mut n: c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into the live `n`.
    check(unsafe { f!(ioctl)(fd, libc::TIOCOUTQ as c_ulong, &mut n as *mut c_int) })?;
    Ok(n.max(0) as usize)
}

/// 8 random bytes from the kernel (`getrandom(2)`), `None` if it has none to give.
pub fn random_u64() -> Option<u64> {
    let mut v = [0u8; 8];
    // SAFETY: writes at most 8 bytes into the live array.
    let n = unsafe { libc::getrandom(v.as_mut_ptr() as *mut c_void, 8, 0) };
    (n == 8).then(|| u64::from_ne_bytes(v))
}

/// This thread's id.
pub fn gettid() -> i32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() }
}

/// The real user id of this process.
pub fn uid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getuid() }
}

/// `send(2)` in the kernel with `MSG_NOSIGNAL` (a peer gone is `EPIPE`, no signal); without
/// `wait`, also `MSG_DONTWAIT` (`EAGAIN` when the socket's buffer is full).
pub fn send_nosignal(fd: c_int, buf: &[u8], wait: bool) -> R<usize> {
    let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: `buf` is a live slice of the length passed.
    checkl(unsafe { f!(send)(fd, buf.as_ptr() as *const c_void, buf.len(), flags) })
}

/// `shutdown(2)` in the kernel.
pub fn shutdown(fd: c_int, how: c_int) -> R<()> {
    // SAFETY: plain syscall wrapper, no pointers.
    check(unsafe { f!(shutdown)(fd, how) }).map(|_| ())
}

/// Whether `fd` is a Unix stream socket (`SO_DOMAIN` AF_UNIX, `SO_TYPE` SOCK_STREAM).
pub fn is_unix_stream(fd: c_int) -> bool {
    let get = |opt| get_int_opt(fd, libc::SOL_SOCKET, opt).ok();
    get(libc::SO_DOMAIN) == Some(libc::AF_UNIX) && get(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
}

/// An integer socket option of the kernel's socket `fd` (the kernel's `getsockopt`, not the
/// library's).
pub fn get_int_opt(fd: c_int, level: c_int, name: c_int) -> R<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live int `v`.
    check(unsafe {
        f!(getsockopt)(
            fd,
            level,
            name,
            &mut v as *mut c_int as *mut c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// Whether the kernel's socket `fd` has a peer (`getpeername` succeeds).
pub fn has_peer(fd: c_int) -> bool {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut a: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live `a`.
    unsafe { f!(getpeername)(fd, (&mut a as *mut libc::sockaddr_storage).cast(), &mut len) == 0 }
}

/// Copies a socket option (at most 16 bytes: an int, a `timeval`, a `linger`) from the
/// kernel's socket `from` to `to`.
pub fn copy_opt(from: c_int, to: c_int, level: c_int, name: c_int) -> R<()> {
    let mut v = [0u8; 16];
    let mut len = v.len() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live buffer `v`.
    check(unsafe { f!(getsockopt)(from, level, name, v.as_mut_ptr().cast(), &mut len) })?;
    // SAFETY: reads `len` bytes of `v`, as the kernel wrote them.
    check(unsafe { f!(setsockopt)(to, level, name, v.as_ptr().cast(), len) }).map(|_| ())
}

/// Sets a socket's receive timeout (`SO_RCVTIMEO`; zero: none).
pub fn set_recv_timeout(fd: c_int, t: std::time::Duration) -> R<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: passes a live timeval of the size given.
    check(unsafe {
        f!(setsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const c_void,
            std::mem::size_of::<libc::timeval>() as socklen_t,
        )
    })
    .map(|_| ())
}

/// Sends `buf` as one message on the Unix socket `fd`, passing the descriptor `pass` with it.
pub fn send_with_fd(fd: c_int, buf: &[u8], pass: c_int) -> R<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // room for one SCM_RIGHTS message of one int, aligned as cmsghdr wants
    let mut space = [0u64; 4];
    // SAFETY: CMSG_SPACE is arithmetic.
    let clen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    // SAFETY: an all-zero msghdr is valid; the fields set point to live buffers above.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = space.as_mut_ptr() as *mut c_void;
    m.msg_controllen = clen;
    // SAFETY: `m` has a control buffer of `clen` bytes (at most `space`), so the first header
    // and its data lie inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut c_int, pass);
    }
    // SAFETY: `m` and everything it points to are live for the call.
    checkl(unsafe { f!(sendmsg)(fd, &m, libc::MSG_NOSIGNAL) })
}

/// Receives one message from the Unix socket `fd` into `buf`: its length and the first
/// descriptor passed with it (any others are closed; a truncated message's descriptors too).
pub fn recv_with_fd(fd: c_int, buf: &mut [u8]) -> R<(usize, Option<c_int>)> {
    recv_with_fd_flags(fd, buf, 0)
}

/// [`recv_with_fd`] with `flags` (`MSG_DONTWAIT`) added to `MSG_CMSG_CLOEXEC`.
pub fn recv_with_fd_flags(fd: c_int, buf: &mut [u8], flags: c_int) -> R<(usize, Option<c_int>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    let mut space = [0u64; 16];
    // SAFETY: an all-zero msghdr is valid; the fields set point to live buffers above.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = space.as_mut_ptr() as *mut c_void;
    m.msg_controllen = std::mem::size_of_val(&space);
    // SAFETY: `m` and everything it points to are live for the call.
    let n = checkl(unsafe { f!(recvmsg)(fd, &mut m, libc::MSG_CMSG_CLOEXEC | flags) })?;
    let mut first = None;
    // SAFETY: walks the control headers the kernel wrote within `space` (CMSG_NXTHDR stops
    // at `msg_controllen`); each SCM_RIGHTS header's data holds whole ints.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const c_int;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for k in 0..len / std::mem::size_of::<c_int>() {
                    let f = std::ptr::read_unaligned(data.add(k));
                    if first.is_none() && m.msg_flags & libc::MSG_TRUNC == 0 {
                        first = Some(f);
                    } else {
                        f!(close)(f);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
    }
    Ok((n, first))
}

/// `pread(2)` in the kernel.
pub fn pread(fd: c_int, buf: &mut [u8], off: i64) -> R<usize> {
    // SAFETY: `buf` is a live writable slice of the length passed.
    checkl(unsafe { f!(pread)(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), off) })
}

/// `read(2)` in the kernel.
pub fn read(fd: c_int, buf: &mut [u8]) -> R<usize> {
    // SAFETY: `buf` is a live writable slice of the length passed.
    checkl(unsafe { f!(read)(fd, buf.as_mut_ptr() as *mut c_void, buf.len()) })
}

/// `lseek(2)` in the kernel.
pub fn lseek(fd: c_int, off: i64, whence: c_int) -> R<i64> {
    // SAFETY: plain syscall wrapper, no pointers.
    let r = unsafe { f!(lseek)(fd, off, whence) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// Sets this thread's signal mask (`None`: leaves it), returning the old one.
pub fn sigmask_set(mask: Option<&libc::sigset_t>) -> Option<libc::sigset_t> {
    let m = mask?;
    // SAFETY: an all-zero sigset_t is a valid (empty) set.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live sigset_t values.
    unsafe { f!(pthread_sigmask)(libc::SIG_SETMASK, m, &mut old) };
    Some(old)
}

/// Raises SIGPIPE in this thread, as a write to a closed connection does.
pub fn raise_sigpipe() {
    // SAFETY: raise has no memory effects on our side.
    unsafe { libc::raise(libc::SIGPIPE) };
}

/// One line on stderr, written with libc's `write` (no allocation after formatting).
pub fn log_line(msg: &str) {
    let line = format!("docknet-preload: {msg}\n");
    // SAFETY: writes the bytes of a live String.
    let _ = unsafe { f!(write)(2, line.as_ptr() as *const c_void, line.len()) };
}

/// Registers the fork handlers (prepare, then in the parent and in the child after it).
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registers plain function pointers with no captured state.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Registers a handler run at `exit` (not at `_exit`).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a plain function pointer with no captured state.
    unsafe { libc::atexit(f) };
}

/// Waits until a signal handler runs on this thread; returns `EINTR` (a blocking call that
/// can never complete, ended only by a signal, as Linux's would be).
///
/// The wait is on the signal waker's word, not `pause(2)`: a signal that came between the
/// look at whether a handler ran and `pause` would have run its handler before the sleep
/// and left the thread asleep for good (a prefork worker whose sibling took the stack did
/// not end at its parent's SIGTERM). A token read before the look ends the wait at once.
/// A handler the library did not wrap (one a forked child installed before it took the
/// stack) ends the wait by interrupting the sleep, as it ended `pause`.
pub fn pause_for_signal() -> Errno {
    use crate::sig::SIG_WAKER;
    // (a signal delivered from here on moves the mark, even while its handler waits)
    let mut mark = crate::sig::mark();
    crate::sig::asleep(|ran| {
        // (a handler that waited for this sleep ran as it began: the call ends for it)
        if ran {
            return;
        }
        loop {
            let token = SIG_WAKER.token();
            if mark.take().is_some() {
                return;
            }
            #[cfg(test)]
            if let Some(f) = tests::BEFORE_SLEEP.with(|h| h.take()) {
                f();
            }
            if !SIG_WAKER.wait_or_signal(token) {
                // a handler the library did not wrap, which moved no mark
                return;
            }
        }
    });
    libc::EINTR
}

/// Calls the program's handler `h` (installed with `flags`: its address, as `sigaction`
/// stored it in `sig::HANDLERS`) for `sig`.
pub fn call_handler(
    sig: usize,
    h: usize,
    flags: c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut c_void,
) {
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: `h` is the program's SA_SIGINFO handler, stored by our `sigaction`.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig as c_int, info, ctx);
    } else {
        // SAFETY: `h` is the program's one-argument handler, stored by our `sigaction`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig as c_int);
    }
}

/// Runs the program's handler `h` for `sig` later than the signal came (`sig::within`): with
/// the `siginfo` kept then, and a context of zeroes (the interrupted instruction's is gone).
pub fn call_handler_later(sig: usize, h: usize, flags: c_int, mut info: libc::siginfo_t) {
    // SAFETY: an all-zero ucontext_t is a valid value to point to.
    let mut ctx: libc::ucontext_t = unsafe { std::mem::zeroed() };
    call_handler(
        sig,
        h,
        flags,
        &mut info,
        &mut ctx as *mut libc::ucontext_t as *mut c_void,
    );
}

/// A `siginfo_t` of zeroes (for a handler run later, whose own was not kept).
// SAFETY: siginfo_t is plain integers and padding: all zeroes is a valid value.
pub const NO_SIGINFO: libc::siginfo_t = unsafe { std::mem::MaybeUninit::zeroed().assume_init() };

/// Blocks in this thread what the kernel blocks while a handler of `sig` runs: the handler's
/// `sa_mask`, and `sig` itself when `itself`. The old mask, for [`sigmask_set`].
pub fn block_for_handler(sig: c_int, itself: bool) -> Option<libc::sigset_t> {
    // SAFETY: an all-zero sigaction is valid; the kernel fills it with the action now (the
    // program's mask and flags, with our wrapper as the handler).
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query into a live struct.
    unsafe { f!(sigaction)(sig, std::ptr::null(), &mut a) };
    if itself {
        // SAFETY: a live sigset_t.
        unsafe { libc::sigaddset(&mut a.sa_mask, sig) };
    }
    // SAFETY: an all-zero sigset_t is a valid (empty) set.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live sigset_t values.
    (unsafe { f!(pthread_sigmask)(libc::SIG_BLOCK, &a.sa_mask, &mut old) } == 0).then_some(old)
}

/// Blocks every signal in this thread (so threads it spawns never take the program's
/// signals), returning the old mask for [`sigmask_set`].
pub fn block_all_signals() -> Option<libc::sigset_t> {
    // SAFETY: an all-zero sigset_t is valid; sigfillset fills a live one.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a live sigset_t.
    unsafe { libc::sigfillset(&mut all) };
    sigmask_set(Some(&all))
}

/// Writes the hostent of `canon` and `addrs` into `*ret` and the caller's `buf` of `len` bytes:
/// the name, the addresses, then (pointer-aligned) an empty alias list and the address list.
/// `ERANGE` when they do not fit.
///
/// # Safety
/// `ret` is null or a valid hostent; `buf` is null or valid for `len` bytes.
pub unsafe fn fill_hostent(
    canon: &str,
    addrs: &[std::net::Ipv4Addr],
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: usize,
) -> Result<(), c_int> {
    let addrs = &addrs[..addrs.len().min(32)];
    let p = std::mem::size_of::<*mut libc::c_char>();
    let addr_off = canon.len() + 1;
    let end = (buf as usize).saturating_add(addr_off + 4 * addrs.len());
    let list_off = end.div_ceil(p).saturating_mul(p).wrapping_sub(buf as usize);
    if ret.is_null() || buf.is_null() || list_off.saturating_add(p * (addrs.len() + 2)) > len {
        return Err(libc::ERANGE);
    }
    // SAFETY: every write is within `buf[..len]` (checked above), the pointer arrays at a
    // pointer-aligned address; `ret` is the caller's hostent.
    unsafe {
        let b = buf as *mut u8;
        std::ptr::copy_nonoverlapping(canon.as_ptr(), b, canon.len());
        *b.add(canon.len()) = 0;
        let aliases = b.add(list_off) as *mut *mut libc::c_char;
        *aliases = std::ptr::null_mut();
        let list = aliases.add(1);
        for (k, a) in addrs.iter().enumerate() {
            let at = b.add(addr_off + 4 * k);
            std::ptr::copy_nonoverlapping(a.octets().as_ptr(), at, 4);
            *list.add(k) = at as *mut libc::c_char;
        }
        *list.add(addrs.len()) = std::ptr::null_mut();
        *ret = libc::hostent {
            h_name: buf,
            h_aliases: aliases,
            h_addrtype: libc::AF_INET,
            h_length: 4,
            h_addr_list: list,
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostent_is_laid_out_in_the_callers_buffer_or_refused() {
        let addrs: Vec<std::net::Ipv4Addr> =
            vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        // SAFETY: plain data, all zero is valid.
        let mut h: libc::hostent = unsafe { std::mem::zeroed() };
        let mut small = [0 as c_char; 20];
        // SAFETY: a hostent and a buffer of the given length.
        let r = unsafe { fill_hostent("web.x", &addrs, &mut h, small.as_mut_ptr(), small.len()) };
        assert_eq!(r, Err(libc::ERANGE));
        let mut buf = [0u64; 16];
        let len = std::mem::size_of_val(&buf);
        // odd start: the pointer arrays are aligned all the same
        let start = (buf.as_mut_ptr() as *mut c_char).wrapping_add(1);
        // SAFETY: as above, one byte less.
        unsafe { fill_hostent("web.x", &addrs, &mut h, start, len - 1) }.unwrap();
        // SAFETY: the entry just written, in `buf`.
        unsafe {
            assert_eq!(
                std::ffi::CStr::from_ptr(h.h_name).to_str().unwrap(),
                "web.x"
            );
            assert!((*h.h_aliases).is_null());
            assert_eq!((h.h_addrtype, h.h_length), (libc::AF_INET, 4));
            assert_eq!(
                h.h_addr_list as usize % std::mem::align_of::<*mut c_char>(),
                0
            );
            let a = std::slice::from_raw_parts(*h.h_addr_list.add(1) as *const u8, 4);
            assert_eq!(a, [10, 0, 0, 2]);
            assert!((*h.h_addr_list.add(2)).is_null());
        }
    }

    /// A real signal's handler, as the library's wrapper runs it outside a deferral.
    extern "C" fn noted(sig: libc::c_int) {
        crate::sig::note(sig as usize);
    }

    thread_local! {
        /// Run once by [`pause_for_signal`] after its last look and before it sleeps.
        pub static BEFORE_SLEEP: std::cell::Cell<Option<fn()>> = const { std::cell::Cell::new(None) };
    }

    /// The signal of [`a_wait_for_a_signal_ends_at_one_that_comes_as_it_falls_asleep`].
    const SIG: libc::c_int = 42;

    /// A call that waits only for a signal ends at one delivered at any moment after it began:
    /// in the gap between its last look and its sleep (where `pause(2)` after a look at the
    /// mark lost it, and the thread slept for good), and at moments spread around it.
    #[test]
    fn a_wait_for_a_signal_ends_at_one_that_comes_as_it_falls_asleep() {
        use std::os::unix::thread::JoinHandleExt;
        let sig = SIG;
        // SAFETY: installs a plain handler for a real-time signal no other test uses.
        unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            a.sa_sigaction = noted as extern "C" fn(libc::c_int) as usize;
            assert_eq!(libc::sigaction(sig, &a, std::ptr::null_mut()), 0);
        }
        // in the gap itself
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            BEFORE_SLEEP.with(|h| {
                // SAFETY: raises a signal whose handler is installed above, on this thread.
                h.set(Some(|| unsafe {
                    libc::raise(SIG);
                }))
            });
            let _ = tx.send(crate::sig::within(pause_for_signal));
        });
        let e = rx.recv_timeout(std::time::Duration::from_secs(5));
        assert_eq!(
            e,
            Ok(libc::EINTR),
            "a signal between the look and the sleep was lost"
        );
        for round in 0..200u32 {
            let (tx, rx) = std::sync::mpsc::channel();
            let entered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let e2 = entered.clone();
            let t = std::thread::spawn(move || {
                let e = crate::sig::within(|| {
                    e2.store(true, std::sync::atomic::Ordering::Release);
                    crate::sys::pause_for_signal()
                });
                let _ = tx.send(e);
            });
            while !entered.load(std::sync::atomic::Ordering::Acquire) {
                std::hint::spin_loop();
            }
            // (a different moment each round: before, as and after the sleep begins)
            for _ in 0..(round * 7919) % 3000 {
                std::hint::spin_loop();
            }
            // SAFETY: signals a live thread of this test (joined below).
            unsafe { libc::pthread_kill(t.as_pthread_t(), sig) };
            let e = rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("round {round}: the signal was lost to the wait"));
            assert_eq!(e, libc::EINTR);
            t.join().unwrap();
        }
    }
}
