//! The interposed entry points: each turns the C arguments into safe values, asks `ops` or
//! `event` (which answer `None` for a call that is not DockNet's), and otherwise calls libc's
//! own function with the arguments unchanged. No panic crosses this boundary: a panic in the
//! safe code becomes EIO. `fcntl` and `ioctl` are variadic in C; they are defined here with
//! their third argument as a machine word, which the x86-64 and AArch64 Linux calling
//! conventions pass exactly as a variadic one.

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use crate::event;
use crate::ops::{self, OptVal, TABLE};
use crate::sys::{self, real, Errno, R};
use libc::{c_int, c_uint, c_ulong, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let _ = catch_unwind(|| {
        sys::real();
        ops::init();
        docknet_pipe::wake::set_sleep_hook(crate::sig::sleep_hook);
    });
}

/// Runs `f`, a call of the program into the library (the program's signal handlers wait for
/// its sleeps or its end: `sig::within`); a panic becomes EIO.
fn guard<T>(f: impl FnOnce() -> Option<R<T>>) -> Option<R<T>> {
    crate::sig::within(|| catch_unwind(AssertUnwindSafe(f)).unwrap_or(Some(Err(libc::EIO))))
}

/// Runs `f`, a call of the program into the library, as [`guard`] does; a panic is caught.
fn shelter<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    crate::sig::within(|| catch_unwind(AssertUnwindSafe(f)))
}

fn ret(r: R<c_int>) -> c_int {
    match r {
        Ok(v) => v,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    }
}

fn retl(r: R<usize>) -> ssize_t {
    match r {
        Ok(v) => v as ssize_t,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    }
}

macro_rules! real {
    ($name:ident) => {
        real()
            .$name
            .expect(concat!("libc has no ", stringify!($name)))
    };
}

/// An AF_INET address at `p` (`Some(None)`: AF_UNSPEC; `None`: another family or too short).
///
/// # Safety
/// `p` is null or points to `len` readable bytes.
unsafe fn addr_in(
    p: *const sockaddr,
    len: socklen_t,
) -> Result<Option<Option<SocketAddrV4>>, Errno> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least the family field is readable (checked above); read unaligned.
    let fam = unsafe { std::ptr::read_unaligned(p as *const libc::sa_family_t) };
    match fam as c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: a whole sockaddr_in is readable.
            let a = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in) };
            Ok(Some(Some(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ))))
        }
        libc::AF_INET => Err(libc::EINVAL),
        libc::AF_UNSPEC => Ok(Some(None)),
        _ => Ok(None),
    }
}

/// Writes `a` to a caller's (sockaddr, length) pair, truncated to its room, as the kernel does.
///
/// # Safety
/// `p` is null or points to `*len` writable bytes; `len` is null or valid.
unsafe fn put_addr(a: SocketAddrV4, p: *mut sockaddr, len: *mut socklen_t) {
    if p.is_null() || len.is_null() {
        return;
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let full = std::mem::size_of::<libc::sockaddr_in>();
    // SAFETY: `len` is valid (checked non-null; the caller's contract).
    let room = unsafe { *len } as usize;
    // SAFETY: copies at most `room` bytes into the caller's buffer of that size.
    unsafe {
        std::ptr::copy_nonoverlapping(&sin as *const _ as *const u8, p as *mut u8, room.min(full));
        *len = full as socklen_t;
    }
}

/// # Safety
/// `p` is null or points to `n` writable bytes.
unsafe fn buf_mut<'a>(p: *mut c_void, n: size_t) -> Result<&'a mut [u8], Errno> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) })
}

/// # Safety
/// `p` is null or points to `n` readable bytes.
unsafe fn buf<'a>(p: *const c_void, n: size_t) -> Result<&'a [u8], Errno> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n) })
}

// ---------------------------------------------------------------------------------------
// sockets

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: libc's socket with the caller's arguments.
    let fd = unsafe { real!(socket)(domain, ty, proto) };
    if fd >= 0 && domain == libc::AF_INET {
        let e = sys::errno();
        let _ = shelter(|| ops::socket_created(fd, domain, ty, proto));
        sys::set_errno(e);
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's address of `len` bytes.
        let r = guard(|| match unsafe { addr_in(addr, len) } {
            Err(e) => Some(Err(e)),
            Ok(a) => ops::bind(fd, a.flatten()),
        });
        if let Some(r) = r {
            return ret(r.map(|_| 0));
        }
    }
    // SAFETY: libc's bind with the caller's arguments.
    unsafe { real!(bind)(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::listen(fd)) {
            return ret(r.map(|_| 0));
        }
    }
    // SAFETY: libc's listen with the caller's arguments.
    unsafe { real!(listen)(fd, backlog) }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's address of `len` bytes.
        let r = guard(|| match unsafe { addr_in(addr, len) } {
            Err(e) => Some(Err(e)),
            Ok(a) => ops::connect(fd, a),
        });
        if let Some(r) = r {
            return ret(r.map(|_| 0));
        }
    } else if ops::forked() {
        // (a worker whose sibling drives the stack: a connection to DockNet is made there)
        // SAFETY: the caller's address of `len` bytes.
        let r = guard(|| match unsafe { addr_in(addr, len) } {
            Err(_) => None,
            Ok(a) => ops::worker_connect(fd, a),
        });
        if let Some(r) = r {
            return ret(r.map(|_| 0));
        }
    }
    // SAFETY: libc's connect with the caller's arguments.
    unsafe { real!(connect)(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| {
            if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
                return Some(Err(libc::EINVAL));
            }
            ops::accept(fd, flags)
        }) {
            return ret(r.map(|(nfd, peer)| {
                // SAFETY: the caller's address buffer and its length.
                unsafe { put_addr(peer, addr, len) };
                nfd
            }));
        }
    }
    // SAFETY: libc's accept4 with the caller's arguments.
    unsafe { real!(accept4)(fd, addr, len, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if TABLE.maybe(fd) && (ops::is_docknet(fd) || ops::is_shared_listener(fd)) {
        // SAFETY: forwards the caller's arguments.
        return unsafe { accept4(fd, addr, len, 0) };
    }
    // SAFETY: libc's accept with the caller's arguments.
    unsafe { real!(accept)(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::local_name(fd)) {
            return ret(r.map(|a| {
                // SAFETY: the caller's address buffer and its length.
                unsafe { put_addr(a, addr, len) };
                0
            }));
        }
    }
    // SAFETY: libc's getsockname with the caller's arguments.
    unsafe { real!(getsockname)(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::peer_name(fd)) {
            return ret(r.map(|a| {
                // SAFETY: the caller's address buffer and its length.
                unsafe { put_addr(a, addr, len) };
                0
            }));
        }
    }
    // SAFETY: libc's getpeername with the caller's arguments.
    unsafe { real!(getpeername)(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::shutdown(fd, how)) {
            return ret(r.map(|_| 0));
        }
    }
    // SAFETY: libc's shutdown with the caller's arguments.
    unsafe { real!(shutdown)(fd, how) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if TABLE.maybe(fd) {
        let _ = shelter(|| ops::closing(fd));
    }
    // SAFETY: libc's close with the caller's argument.
    unsafe { real!(close)(fd) }
}

// ---------------------------------------------------------------------------------------
// data

fn recv_len(r: R<(usize, usize, Option<SocketAddrV4>)>, flags: c_int) -> R<usize> {
    r.map(|(n, whole, _)| {
        if flags & libc::MSG_TRUNC != 0 {
            whole
        } else {
            n
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        let r = guard(|| match unsafe { buf_mut(b, n) } {
            Ok(s) => ops::recv(fd, s, 0).map(|r| recv_len(r, 0)),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's read with the caller's arguments.
    unsafe { real!(read)(fd, b, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: forwards the caller's arguments (the size check is the compiler's own).
    unsafe { read(fd, b, n) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        let r = guard(|| match unsafe { buf(b, n) } {
            Ok(s) => ops::send(fd, s, 0, None),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's write with the caller's arguments.
    unsafe { real!(write)(fd, b, n) }
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, b: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        let r = guard(|| match unsafe { buf_mut(b, n) } {
            Ok(s) => ops::recv(fd, s, flags).map(|r| recv_len(r, flags)),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's recv with the caller's arguments.
    unsafe { real!(recv)(fd, b, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    _buflen: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: forwards the caller's arguments.
    unsafe { recv(fd, b, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, b: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        let r = guard(|| match unsafe { buf(b, n) } {
            Ok(s) => ops::send(fd, s, flags, None),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's send with the caller's arguments.
    unsafe { real!(send)(fd, b, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if TABLE.maybe(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        let r = guard(|| match unsafe { buf_mut(b, n) } {
            Ok(s) => ops::recv(fd, s, flags),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            if let Ok((_, _, Some(from))) = &r {
                // SAFETY: the caller's address buffer and its length.
                unsafe { put_addr(*from, addr, alen) };
            } else if r.is_ok() && !alen.is_null() {
                // a connection: no address (the kernel leaves a length of 0)
                // SAFETY: `alen` is the caller's valid length.
                unsafe { *alen = 0 };
            }
            return retl(recv_len(r, flags));
        }
    }
    // SAFETY: libc's recvfrom with the caller's arguments.
    unsafe { real!(recvfrom)(fd, b, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    _buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: forwards the caller's arguments.
    unsafe { recvfrom(fd, b, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    b: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    if TABLE.maybe(fd) {
        let r = guard(|| {
            // SAFETY: the caller's buffer of `n` bytes.
            let s = match unsafe { buf(b, n) } {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            let to = if addr.is_null() || ops::is_tcp(fd) {
                // TCP ignores a destination, as Linux does
                None
            } else {
                // SAFETY: the caller's address of `alen` bytes.
                match unsafe { addr_in(addr, alen) } {
                    Ok(Some(Some(a))) => Some(a),
                    Ok(_) if ops::is_docknet(fd) => return Some(Err(libc::EAFNOSUPPORT)),
                    Ok(_) => return None,
                    Err(e) => return Some(Err(e)),
                }
            };
            ops::send(fd, s, flags, to)
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's sendto with the caller's arguments.
    unsafe { real!(sendto)(fd, b, n, flags, addr, alen) }
}

/// The iovecs of a call as slices.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs whose buffers are valid.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], Errno> {
    if !(0..=1024).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

fn gather(v: &[libc::iovec]) -> Vec<u8> {
    let total: usize = v.iter().map(|x| x.iov_len).sum();
    let mut out = Vec::with_capacity(total);
    for x in v {
        if x.iov_len > 0 {
            // SAFETY: each iovec's buffer is readable for its length (the caller's contract,
            // checked in `iovecs`' safety section).
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(x.iov_base as *const u8, x.iov_len)
            });
        }
    }
    out
}

fn scatter(v: &[libc::iovec], data: &[u8]) {
    let mut off = 0;
    for x in v {
        if off >= data.len() {
            break;
        }
        let k = x.iov_len.min(data.len() - off);
        // SAFETY: each iovec's buffer is writable for its length (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(data[off..].as_ptr(), x.iov_base as *mut u8, k) };
        off += k;
    }
}

fn readv_inner(
    fd: c_int,
    v: &[libc::iovec],
    flags: c_int,
) -> Option<R<(usize, usize, Option<SocketAddrV4>)>> {
    let total: usize = v.iter().map(|x| x.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let r = ops::recv(fd, &mut tmp, flags)?;
    if let Ok((n, _, _)) = &r {
        scatter(v, &tmp[..*n]);
    }
    Some(r)
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if TABLE.maybe(fd) && ops::is_docknet(fd) {
        // SAFETY: the caller's iovecs.
        let r = guard(|| match unsafe { iovecs(iov, cnt) } {
            Ok(v) => readv_inner(fd, v, 0).map(|r| recv_len(r, 0)),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's readv with the caller's arguments.
    unsafe { real!(readv)(fd, iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if TABLE.maybe(fd) && ops::is_docknet(fd) {
        // SAFETY: the caller's iovecs.
        let r = guard(|| match unsafe { iovecs(iov, cnt) } {
            Ok(v) => ops::send(fd, &gather(v), 0, None),
            Err(e) => Some(Err(e)),
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's writev with the caller's arguments.
    unsafe { real!(writev)(fd, iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    if TABLE.maybe(fd) && ops::is_docknet(fd) {
        if msg.is_null() {
            return retl(Err(libc::EFAULT));
        }
        // SAFETY: `msg` is the caller's valid msghdr.
        let m = unsafe { &mut *msg };
        // SAFETY: its iovecs.
        let r = guard(
            || match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
                Ok(v) => readv_inner(fd, v, flags),
                Err(e) => Some(Err(e)),
            },
        );
        if let Some(r) = r {
            if let Ok((n, whole, from)) = &r {
                m.msg_controllen = 0;
                m.msg_flags = if whole > n { libc::MSG_TRUNC } else { 0 };
                match from {
                    Some(a) if !m.msg_name.is_null() => {
                        // SAFETY: the caller's name buffer of msg_namelen bytes.
                        unsafe { put_addr(*a, m.msg_name as *mut sockaddr, &mut m.msg_namelen) }
                    }
                    _ => m.msg_namelen = 0,
                }
            }
            return retl(recv_len(r, flags));
        }
    }
    // SAFETY: libc's recvmsg with the caller's arguments.
    unsafe { real!(recvmsg)(fd, msg, flags) }
}

/// Whether `msg` passes a DockNet socket's descriptor (`SCM_RIGHTS`). Such a descriptor is a
/// placeholder of the kernel's: the connection lives in this process's stack, which another
/// process cannot drive.
///
/// # Safety
/// `msg` is null or the caller's valid msghdr, its control buffer `msg_controllen` bytes.
unsafe fn passes_docknet_socket(msg: *const libc::msghdr) -> bool {
    let mut found = false;
    // SAFETY: as this function's.
    unsafe {
        walk_rights(msg, |fd| {
            found |= TABLE.maybe(fd) && ops::is_docknet(fd);
            fd
        })
    };
    found
}

/// Walks the descriptors `msg` passes (`SCM_RIGHTS`), replacing each with what `f` returns.
///
/// # Safety
/// `msg` is null or a valid msghdr whose control buffer of `msg_controllen` bytes is writable
/// where `f` changes a descriptor (a read-only walk returns every descriptor unchanged).
unsafe fn walk_rights(msg: *const libc::msghdr, mut f: impl FnMut(c_int) -> c_int) {
    // SAFETY: null or the caller's valid msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return;
    };
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return;
    }
    // SAFETY: the kernel's cmsg walk over the control buffer, bounded by msg_controllen
    // (CMSG_NXTHDR returns null past its end); a changed descriptor is written in place.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *mut c_int;
                let head = data as usize - c as usize;
                let n =
                    ((*c).cmsg_len as usize).saturating_sub(head) / std::mem::size_of::<c_int>();
                for k in 0..n {
                    let fd = std::ptr::read_unaligned(data.add(k));
                    let to = f(fd);
                    if to != fd {
                        std::ptr::write_unaligned(data.add(k), to);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
}

/// `sendmsg` of `msg`, which passes DockNet sockets: a copy of it passes, in each connection's
/// place, a Unix socket this process relays to the connection (`relay::pass`); anything else
/// of DockNet's (a listener, a UDP socket) refuses the whole message with one line.
///
/// # Safety
/// `msg` is the caller's valid msghdr, its control buffer `msg_controllen` bytes.
unsafe fn sendmsg_passing(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's valid msghdr (non-null: it passes a descriptor).
    let m = unsafe { *msg };
    // the control buffer copied, aligned as cmsghdr wants, so that the caller's is not changed
    let len = m.msg_controllen;
    let mut control = vec![0u64; len.div_ceil(8)];
    // SAFETY: copies `len` bytes from the caller's control buffer into ours of at least that.
    unsafe {
        std::ptr::copy_nonoverlapping(
            m.msg_control as *const u8,
            control.as_mut_ptr() as *mut u8,
            len,
        )
    };
    let mut copy = m;
    copy.msg_control = control.as_mut_ptr() as *mut c_void;
    let mut made: Vec<c_int> = Vec::new();
    let mut refused = false;
    // SAFETY: `copy`'s control buffer is ours and writable.
    unsafe {
        walk_rights(&copy, |d| {
            if refused || !(TABLE.maybe(d) && ops::is_docknet(d)) {
                return d;
            }
            // a forked child's inherited connection: claimed from its parent first, it is a
            // Unix socket already, passed as it is
            ops::before_dup(d);
            if !ops::is_docknet(d) {
                return d;
            }
            match TABLE
                .sock(d)
                .ok_or(libc::EBADF)
                .and_then(|s| crate::relay::pass(&s))
            {
                Ok(u) => {
                    made.push(u);
                    u
                }
                Err(_) => {
                    refused = true;
                    d
                }
            }
        })
    };
    let r = if refused {
        ops::log_once(
            "passing a DockNet listener or UDP socket to another process (SCM_RIGHTS) is not \
             supported: it lives in this process's DockNet stack (a connection can be passed)",
        );
        Err(libc::EOPNOTSUPP)
    } else {
        // SAFETY: libc's sendmsg with the caller's message but our control buffer.
        let n = unsafe { real!(sendmsg)(fd, &copy, flags) };
        if n < 0 {
            Err(sys::errno())
        } else {
            Ok(n as usize)
        }
    };
    // the message holds its own references to the sockets passed; ours go (a relay whose
    // socket was never passed sees its other end closed and ends)
    for u in made {
        let _ = sys::close(u);
    }
    retl(r)
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's msghdr, as sendmsg takes it.
    if ops::enabled() && unsafe { passes_docknet_socket(msg) } {
        // SAFETY: as above (non-null: it passes a descriptor).
        return shelter(|| unsafe { sendmsg_passing(fd, msg, flags) })
            .unwrap_or_else(|_| retl(Err(libc::EIO)));
    }
    if TABLE.maybe(fd) {
        if msg.is_null() {
            return retl(Err(libc::EFAULT));
        }
        // SAFETY: `msg` is the caller's valid msghdr.
        let m = unsafe { &*msg };
        let r = guard(|| {
            let to = if m.msg_name.is_null() || ops::is_tcp(fd) {
                None
            } else {
                // SAFETY: the caller's name of msg_namelen bytes.
                match unsafe { addr_in(m.msg_name as *const sockaddr, m.msg_namelen) } {
                    Ok(Some(Some(a))) => Some(a),
                    Ok(_) if ops::is_docknet(fd) => return Some(Err(libc::EAFNOSUPPORT)),
                    Ok(_) => return None,
                    Err(e) => return Some(Err(e)),
                }
            };
            // SAFETY: its iovecs.
            match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
                Ok(v) => {
                    if !ops::is_docknet(fd) && to.is_none() {
                        return None;
                    }
                    ops::send(fd, &gather(v), flags, to)
                }
                Err(e) => Some(Err(e)),
            }
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's sendmsg with the caller's arguments.
    unsafe { real!(sendmsg)(fd, msg, flags) }
}

/// Runs `one` on each of the caller's `n` messages in turn (at most `UIO_MAXIOV`), with its
/// index; `one` returns the byte count (or -1) and whether to go on. Returns how many succeeded,
/// or -1 (errno set by `one`) when the first failed, as `sendmmsg` and `recvmmsg` do; each
/// message's `msg_len` is set.
///
/// # Safety
/// `v` is valid for `n` entries.
unsafe fn per_message(
    v: *mut libc::mmsghdr,
    n: c_uint,
    mut one: impl FnMut(usize, &mut libc::mmsghdr) -> (ssize_t, bool),
) -> c_int {
    let n = n.min(libc::UIO_MAXIOV as c_uint) as usize;
    let mut done = 0usize;
    while done < n {
        // SAFETY: entry `done` of the caller's array of `n` mmsghdrs.
        let e = unsafe { &mut *v.add(done) };
        let (r, more) = one(done, e);
        if r < 0 {
            return if done == 0 { -1 } else { done as c_int };
        }
        e.msg_len = r as c_uint;
        done += 1;
        if !more {
            break;
        }
    }
    done as c_int
}

/// `recvmmsg` on a DockNet socket: `recvmsg` once per message, as Linux's does. The first
/// receive waits as the socket and `flags` say; after it, `MSG_WAITFORONE` makes the rest
/// non-blocking, and a `timeout` that has passed (looked at after each message, as Linux does)
/// ends the call. An error after the first message ends the call with what was received.
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    v: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
    t: *mut libc::timespec,
) -> c_int {
    if TABLE.maybe(fd) && ops::is_docknet(fd) {
        if v.is_null() && n > 0 {
            return ret(Err(libc::EFAULT));
        }
        // SAFETY: null or the caller's valid timespec.
        let until = match unsafe { t.as_ref() } {
            None => None,
            Some(ts) if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) => {
                return ret(Err(libc::EINVAL));
            }
            Some(ts) => Some(
                std::time::Instant::now()
                    + std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
            ),
        };
        let one = |k: usize, e: &mut libc::mmsghdr| {
            let f = if k > 0 && flags & libc::MSG_WAITFORONE != 0 {
                (flags & !libc::MSG_WAITFORONE) | libc::MSG_DONTWAIT
            } else {
                flags & !libc::MSG_WAITFORONE
            };
            // SAFETY: the caller's msghdr, as recvmsg takes it.
            let r = unsafe { recvmsg(fd, &mut e.msg_hdr, f) };
            // a timeout that has passed ends the call after this message
            (r, until.is_none_or(|u| std::time::Instant::now() < u))
        };
        // SAFETY: the caller's array of `n` messages (checked non-null when n > 0).
        return unsafe { per_message(v, n, one) };
    }
    // SAFETY: libc's recvmmsg with the caller's arguments.
    unsafe { real!(recvmmsg)(fd, v, n, flags, t) }
}

/// `sendmmsg` on a socket of the library's (DockNet's, or not decided yet: the first message's
/// address decides, as for `sendmsg`): `sendmsg` once per message, as Linux's does. It returns
/// how many were sent; an error on the first is the call's, a later one ends it early (the
/// caller sends the rest again and meets it then).
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    v: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
) -> c_int {
    if TABLE.maybe(fd) {
        if v.is_null() && n > 0 {
            return ret(Err(libc::EFAULT));
        }
        // SAFETY: the caller's array of `n` messages (checked non-null when n > 0), each
        // msghdr as sendmsg takes it.
        return unsafe { per_message(v, n, |_, e| (sendmsg(fd, &e.msg_hdr, flags), true)) };
    }
    // SAFETY: libc's sendmmsg with the caller's arguments.
    unsafe { real!(sendmmsg)(fd, v, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    if TABLE.maybe(out) || TABLE.maybe(inp) {
        let r = guard(|| {
            // SAFETY: `off` is null or the caller's valid offset.
            let o = unsafe { off.as_mut() };
            ops::sendfile(out, inp, o, count)
        });
        if let Some(r) = r {
            return retl(r);
        }
    }
    // SAFETY: libc's sendfile with the caller's arguments.
    unsafe { real!(sendfile)(out, inp, off, count) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: on 64-bit Linux sendfile64 is sendfile.
    unsafe { sendfile(out, inp, off, count) }
}

/// A timeval as a duration (negative fields count as zero, microseconds at most a second's).
fn tv_duration(tv: &libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64)
        + Duration::from_micros(tv.tv_usec.clamp(0, 999_999) as u64)
}

mod control;
mod events;
mod names;
mod signals;
