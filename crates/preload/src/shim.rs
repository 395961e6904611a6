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
    });
}

/// Runs `f`; a panic becomes EIO.
fn guard<T>(f: impl FnOnce() -> Option<R<T>>) -> Option<R<T>> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Some(Err(libc::EIO)))
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
        let _ = catch_unwind(|| ops::socket_created(fd, domain, ty, proto));
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
    if TABLE.maybe(fd) && ops::is_docknet(fd) {
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
        let _ = catch_unwind(|| ops::closing(fd));
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
/// process cannot drive, so the passing is refused rather than handing over a dead socket.
///
/// # Safety
/// `msg` is null or the caller's valid msghdr, its control buffer `msg_controllen` bytes.
unsafe fn passes_docknet_socket(msg: *const libc::msghdr) -> bool {
    // SAFETY: null or the caller's valid msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return false;
    };
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return false;
    }
    // SAFETY: the kernel's cmsg walk over the caller's control buffer, bounded by
    // msg_controllen (CMSG_NXTHDR returns null past its end).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const c_int;
                let head = data as usize - c as usize;
                let n =
                    ((*c).cmsg_len as usize).saturating_sub(head) / std::mem::size_of::<c_int>();
                for k in 0..n {
                    let fd = std::ptr::read_unaligned(data.add(k));
                    if TABLE.maybe(fd) && ops::is_docknet(fd) {
                        return true;
                    }
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    false
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's msghdr, as sendmsg takes it.
    if ops::active() && unsafe { passes_docknet_socket(msg) } {
        ops::log_once(
            "passing a DockNet socket to another process (SCM_RIGHTS) is not supported: its \
             connection lives in this process's DockNet stack",
        );
        return retl(Err(libc::EOPNOTSUPP));
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

/// `getaddrinfo`: a name whose name server is on the pipe's network is resolved over DockNet
/// ([`crate::resolve`]: glibc's own resolver would ask through the kernel), and its addresses
/// are given to libc's `getaddrinfo` as numbers (ports, socket types and the list's memory stay
/// libc's, so `freeaddrinfo` is libc's). With a pipe attached, `AI_ADDRCONFIG` counts the
/// pipe's IPv4 address: the kernel, which sees only `lo`, would have said the container has no
/// address and returned nothing.
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const libc::c_char,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    // glibc's defaults without hints: any family, AI_V4MAPPED | AI_ADDRCONFIG
    // SAFETY: null or the caller's valid addrinfo.
    let mut h: libc::addrinfo = match unsafe { hints.as_ref() } {
        Some(h) => *h,
        None => {
            // SAFETY: addrinfo is plain data; all zero is "any".
            let mut h: libc::addrinfo = unsafe { std::mem::zeroed() };
            h.ai_flags = libc::AI_V4MAPPED | libc::AI_ADDRCONFIG;
            h
        }
    };
    let attached = ops::active() && ops::stack().is_some();
    if attached && h.ai_flags & libc::AI_ADDRCONFIG != 0 {
        // the container's addresses: the pipe's IPv4 one (its IPv6 sockets are the kernel's)
        h.ai_flags &= !libc::AI_ADDRCONFIG;
        if h.ai_family == libc::AF_UNSPEC {
            h.ai_family = libc::AF_INET;
        }
    }
    let name = if node.is_null() {
        None
    } else {
        // SAFETY: the caller's NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(node) }.to_str().ok()
    };
    let looked = match (attached, name) {
        (true, Some(n)) if crate::resolve::wants(n, h.ai_family, h.ai_flags) => guard(|| {
            let st = ops::stack()?;
            let ours = |a| crate::sock::route_for(st, a) == crate::sock::Route::DockNet;
            Some(Ok(crate::resolve::lookup(
                n,
                ours,
                crate::resolve::OverDockNet(st),
            )))
        }),
        _ => None,
    };
    let real = real!(getaddrinfo);
    let (addrs, canon) = match looked {
        Some(Ok(crate::resolve::Lookup::Found(a, c))) => (a, c),
        Some(Ok(crate::resolve::Lookup::Error(e))) => return e,
        Some(Err(_)) => return libc::EAI_SYSTEM,
        // SAFETY: libc's getaddrinfo with the caller's arguments (hints as adjusted above).
        _ => return unsafe { real(node, service, &h, res) },
    };
    if res.is_null() {
        return libc::EAI_SYSTEM;
    }
    // every address found, as a number, through libc: one list, in the server's order
    let mut numeric = h;
    numeric.ai_family = libc::AF_INET;
    numeric.ai_flags =
        (h.ai_flags | libc::AI_NUMERICHOST) & !(libc::AI_CANONNAME | libc::AI_ADDRCONFIG);
    let mut head: *mut libc::addrinfo = std::ptr::null_mut();
    let mut tail: *mut libc::addrinfo = std::ptr::null_mut();
    for a in addrs.iter().take(32) {
        let Ok(num) = std::ffi::CString::new(a.to_string()) else {
            continue;
        };
        let mut list: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: libc's getaddrinfo on a numeric address, with the caller's service.
        let rc = unsafe { real(num.as_ptr(), service, &numeric, &mut list) };
        if rc != 0 {
            if !head.is_null() {
                // SAFETY: the list libc made above.
                unsafe { real!(freeaddrinfo)(head) };
            }
            return rc;
        }
        if head.is_null() {
            head = list;
        } else {
            // SAFETY: `tail` is the last node of the list built so far (libc's memory).
            unsafe { (*tail).ai_next = list };
        }
        tail = list;
        // SAFETY: walking libc's list to its end.
        while unsafe { !(*tail).ai_next.is_null() } {
            // SAFETY: as above.
            tail = unsafe { (*tail).ai_next };
        }
    }
    if head.is_null() {
        return libc::EAI_NONAME;
    }
    if h.ai_flags & libc::AI_CANONNAME != 0 {
        if let Ok(c) = std::ffi::CString::new(canon) {
            // SAFETY: the first node is libc's; its canonical name is freed by freeaddrinfo
            // with free(), so it is made with strdup (malloc).
            unsafe { (*head).ai_canonname = libc::strdup(c.as_ptr()) };
        }
    }
    // SAFETY: the caller's result pointer, checked non-null above.
    unsafe { *res = head };
    0
}

// ---------------------------------------------------------------------------------------
// the gethostbyname family: IPv4 names whose name server is DockNet's, as for getaddrinfo

extern "C" {
    fn __h_errno_location() -> *mut c_int;
}

/// h_errno values (netdb.h).
const HOST_NOT_FOUND: c_int = 1;
const TRY_AGAIN: c_int = 2;
const NO_DATA: c_int = 4;

/// The IPv4 addresses of `name` and its canonical name when the library answers for it (see
/// [`getaddrinfo`]), `Err(h_errno)` when it answers that there are none, `None` when libc does.
fn host_lookup(
    name: *const libc::c_char,
) -> Option<Result<(Vec<std::net::Ipv4Addr>, String), c_int>> {
    if name.is_null() || !ops::active() {
        return None;
    }
    // SAFETY: the caller's NUL-terminated name.
    let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_str().ok()?;
    if !crate::resolve::wants(n, libc::AF_INET, 0) {
        return None;
    }
    let r = guard(|| {
        let st = ops::stack()?;
        let ours = |a| crate::sock::route_for(st, a) == crate::sock::Route::DockNet;
        Some(Ok(crate::resolve::lookup(
            n,
            ours,
            crate::resolve::OverDockNet(st),
        )))
    });
    match r? {
        Ok(crate::resolve::Lookup::Found(a, c)) => Some(Ok((a, c))),
        Ok(crate::resolve::Lookup::Error(e)) => Some(Err(match e {
            libc::EAI_AGAIN => TRY_AGAIN,
            libc::EAI_NODATA => NO_DATA,
            _ => HOST_NOT_FOUND,
        })),
        Ok(crate::resolve::Lookup::NotOurs) => None,
        Err(_) => Some(Err(TRY_AGAIN)),
    }
}

/// `gethostbyname_r` for the library's names (`None`: libc's), with glibc's returns: 0 and the
/// entry; 0, no entry and `h_errno` when there is none; `EAGAIN` (`TRY_AGAIN`) when no server
/// answered; `ERANGE` when the buffer is too small.
///
/// # Safety
/// As `gethostbyname_r`'s arguments.
unsafe fn host_r(
    name: *const libc::c_char,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: size_t,
    result: *mut *mut libc::hostent,
    h_err: *mut c_int,
) -> Option<c_int> {
    let found = host_lookup(name)?;
    let (rc, entry, code) = match found {
        // SAFETY: the caller's hostent and buffer of `len` bytes.
        Ok((addrs, canon)) => match unsafe { sys::fill_hostent(&canon, &addrs, ret, buf, len) } {
            Ok(()) => (0, ret, 0),
            Err(e) => (e, std::ptr::null_mut(), -1),
        },
        Err(TRY_AGAIN) => (libc::EAGAIN, std::ptr::null_mut(), TRY_AGAIN),
        Err(code) => (0, std::ptr::null_mut(), code),
    };
    // SAFETY: the caller's result and h_errno pointers (null tolerated).
    unsafe {
        if let Some(r) = result.as_mut() {
            *r = entry;
        }
        if let Some(h) = h_err.as_mut() {
            *h = code;
        }
    }
    Some(rc)
}

/// The non-reentrant forms' result: one entry per thread, as glibc keeps one per process.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn host_static(name: *const libc::c_char) -> Option<*mut libc::hostent> {
    thread_local! {
        static ENTRY: std::cell::UnsafeCell<(libc::hostent, [u64; 512])> =
            // SAFETY: hostent and the buffer are plain data; all zero is valid.
            const { std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }) };
    }
    let mut result: *mut libc::hostent = std::ptr::null_mut();
    let mut code: c_int = 0;
    ENTRY.with(|e| {
        let e = e.get();
        // SAFETY: this thread's entry, used by no one else until the next call on this thread.
        unsafe {
            host_r(
                name,
                &mut (*e).0,
                (*e).1.as_mut_ptr() as *mut libc::c_char,
                std::mem::size_of_val(&(*e).1),
                &mut result,
                &mut code,
            )
        }
    })?;
    if result.is_null() {
        // SAFETY: this thread's h_errno.
        unsafe { *__h_errno_location() = code };
    }
    Some(result)
}

#[no_mangle]
pub unsafe extern "C" fn gethostbyname(name: *const libc::c_char) -> *mut libc::hostent {
    // SAFETY: the caller's name.
    match unsafe { host_static(name) } {
        Some(h) => h,
        // SAFETY: libc's gethostbyname with the caller's argument.
        None => unsafe { real!(gethostbyname)(name) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn gethostbyname2(
    name: *const libc::c_char,
    af: c_int,
) -> *mut libc::hostent {
    if af == libc::AF_INET {
        // SAFETY: the caller's name.
        if let Some(h) = unsafe { host_static(name) } {
            return h;
        }
    }
    // SAFETY: libc's gethostbyname2 with the caller's arguments.
    unsafe { real!(gethostbyname2)(name, af) }
}

#[no_mangle]
pub unsafe extern "C" fn gethostbyname_r(
    name: *const libc::c_char,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: size_t,
    result: *mut *mut libc::hostent,
    h_err: *mut c_int,
) -> c_int {
    // SAFETY: the caller's arguments, as gethostbyname_r takes them.
    match unsafe { host_r(name, ret, buf, len, result, h_err) } {
        Some(rc) => rc,
        // SAFETY: libc's gethostbyname_r with the caller's arguments.
        None => unsafe { real!(gethostbyname_r)(name, ret, buf, len, result, h_err) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn gethostbyname2_r(
    name: *const libc::c_char,
    af: c_int,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: size_t,
    result: *mut *mut libc::hostent,
    h_err: *mut c_int,
) -> c_int {
    if af == libc::AF_INET {
        // SAFETY: the caller's arguments, as gethostbyname2_r takes them.
        if let Some(rc) = unsafe { host_r(name, ret, buf, len, result, h_err) } {
            return rc;
        }
    }
    // SAFETY: libc's gethostbyname2_r with the caller's arguments.
    unsafe { real!(gethostbyname2_r)(name, af, ret, buf, len, result, h_err) }
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

// ---------------------------------------------------------------------------------------
// options and control

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if TABLE.maybe(fd) {
        let r = guard(|| {
            if val.is_null() && len > 0 {
                return Some(Err(libc::EFAULT));
            }
            let int = (len as usize >= 4 && !val.is_null())
                // SAFETY: at least 4 readable bytes.
                .then(|| unsafe { std::ptr::read_unaligned(val as *const c_int) });
            let time = (len as usize >= std::mem::size_of::<libc::timeval>() && !val.is_null())
                .then(|| {
                    // SAFETY: a whole timeval is readable.
                    let tv = unsafe { std::ptr::read_unaligned(val as *const libc::timeval) };
                    let d = tv_duration(&tv);
                    (!d.is_zero()).then_some(d)
                });
            let linger = (len as usize >= std::mem::size_of::<libc::linger>() && !val.is_null())
                .then(|| {
                    // SAFETY: a whole struct linger is readable.
                    let l = unsafe { std::ptr::read_unaligned(val as *const libc::linger) };
                    (l.l_onoff != 0, l.l_linger)
                });
            ops::setsockopt(fd, level, name, int, time, linger)
        });
        if let Some(r) = r {
            return ret(r.map(|_| 0));
        }
    }
    // SAFETY: libc's setsockopt with the caller's arguments.
    unsafe { real!(setsockopt)(fd, level, name, val, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::getsockopt(fd, level, name)) {
            let r = r.and_then(|v| {
                if val.is_null() || len.is_null() {
                    return Err(libc::EFAULT);
                }
                let bytes: Vec<u8> = match v {
                    OptVal::Int(i) => i.to_ne_bytes().to_vec(),
                    OptVal::Linger(on, s) => {
                        let l = libc::linger {
                            l_onoff: on as c_int,
                            l_linger: s,
                        };
                        // SAFETY: views a live struct linger as bytes.
                        unsafe {
                            std::slice::from_raw_parts(
                                &l as *const _ as *const u8,
                                std::mem::size_of::<libc::linger>(),
                            )
                        }
                        .to_vec()
                    }
                    OptVal::Time(t) => {
                        let t = t.unwrap_or_default();
                        let tv = libc::timeval {
                            tv_sec: t.as_secs() as libc::time_t,
                            tv_usec: t.subsec_micros() as libc::suseconds_t,
                        };
                        // SAFETY: views a live timeval as bytes.
                        unsafe {
                            std::slice::from_raw_parts(
                                &tv as *const _ as *const u8,
                                std::mem::size_of::<libc::timeval>(),
                            )
                        }
                        .to_vec()
                    }
                    OptVal::Bytes(b) => b,
                };
                // SAFETY: `len` is the caller's valid length; `val` has that many bytes.
                unsafe {
                    let room = (*len as usize).min(bytes.len());
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), val as *mut u8, room);
                    *len = room as socklen_t;
                }
                Ok(0)
            });
            return ret(r);
        }
    }
    // SAFETY: libc's getsockopt with the caller's arguments.
    unsafe { real!(getsockopt)(fd, level, name, val, len) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if TABLE.maybe(fd) {
        if let Some(r) = guard(|| ops::fcntl_flags(fd, cmd, arg as c_int)) {
            return ret(r);
        }
    }
    // SAFETY: libc's fcntl with the caller's arguments (the third as the word it was).
    let r = unsafe { real!(fcntl)(fd, cmd, arg) };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) && TABLE.maybe(fd) {
        let _ = catch_unwind(|| ops::duplicated(fd, r));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwards the caller's arguments; fcntl64 is fcntl on 64-bit Linux.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    if TABLE.maybe(fd) {
        let r = guard(|| {
            let int = (req == libc::FIONBIO && !arg.is_null())
                // SAFETY: FIONBIO's argument is a pointer to an int.
                .then(|| unsafe { std::ptr::read_unaligned(arg as *const c_int) });
            ops::ioctl(fd, req, int)
        });
        if let Some(r) = r {
            return ret(r.and_then(|out| {
                if let Some(v) = out {
                    if arg.is_null() {
                        return Err(libc::EFAULT);
                    }
                    // SAFETY: FIONREAD and SIOCOUTQ take a pointer to an int.
                    unsafe { std::ptr::write_unaligned(arg as *mut c_int, v) };
                }
                Ok(0)
            }));
        }
    }
    // SAFETY: libc's ioctl with the caller's arguments.
    unsafe { real!(ioctl)(fd, req, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: libc's dup with the caller's argument.
    let r = unsafe { real!(dup)(fd) };
    if r >= 0 && TABLE.maybe(fd) {
        let _ = catch_unwind(|| ops::duplicated(fd, r));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: libc's dup2 with the caller's arguments.
    let r = unsafe { real!(dup2)(old, new) };
    if r >= 0 && (TABLE.maybe(old) || TABLE.maybe(new)) {
        let _ = catch_unwind(|| ops::duplicated(old, new));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: libc's dup3 with the caller's arguments.
    let r = unsafe { real!(dup3)(old, new, flags) };
    if r >= 0 && (TABLE.maybe(old) || TABLE.maybe(new)) {
        let _ = catch_unwind(|| ops::duplicated(old, new));
    }
    r
}

// ---------------------------------------------------------------------------------------
// poll, select, epoll

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    if n > 0 && !fds.is_null() && n <= 65_536 {
        // SAFETY: the caller's array of `n` pollfds.
        let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        if s.iter().any(|p| TABLE.maybe(p.fd)) {
            if let Some(r) = guard(|| event::poll(s, timeout)) {
                return ret(r.map(|k| k as c_int));
            }
        }
    }
    // SAFETY: libc's poll with the caller's arguments.
    unsafe { real!(poll)(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    _len: size_t,
) -> c_int {
    // SAFETY: forwards the caller's arguments.
    unsafe { poll(fds, n, timeout) }
}

fn ts_ms(t: *const libc::timespec) -> c_int {
    if t.is_null() {
        return -1;
    }
    // SAFETY: a non-null timespec of the caller.
    let t = unsafe { std::ptr::read_unaligned(t) };
    let ms = t.tv_sec.max(0) as i128 * 1000 + (t.tv_nsec.max(0) as i128 + 999_999) / 1_000_000;
    ms.min(i32::MAX as i128) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if n > 0 && !fds.is_null() && n <= 65_536 {
        // SAFETY: the caller's array of `n` pollfds.
        let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        if s.iter().any(|p| ops::is_docknet(p.fd)) {
            // SAFETY: `mask` is null or the caller's sigset.
            let old = sys::sigmask_set(unsafe { mask.as_ref() });
            let r = guard(|| event::poll(s, ts_ms(t)));
            sys::sigmask_set(old.as_ref());
            if let Some(r) = r {
                return ret(r.map(|k| k as c_int));
            }
        }
    }
    // SAFETY: libc's ppoll with the caller's arguments.
    unsafe { real!(ppoll)(fds, n, t, mask) }
}

/// select over pollfds built from the sets; `None` when no DockNet socket is in them.
///
/// # Safety
/// The sets are null or valid for `nfds` descriptors.
unsafe fn select_inner(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ms: c_int,
    deadline: &mut Option<Option<std::time::Instant>>,
) -> Option<R<c_int>> {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return None;
    }
    let isset = |set: *mut libc::fd_set, fd: c_int| -> bool {
        // SAFETY: `set` is a valid fd_set and fd < FD_SETSIZE.
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut pfds: smallvec::SmallVec<[libc::pollfd; 16]> = smallvec::SmallVec::new();
    let mut any = false;
    for fd in 0..nfds {
        let mut ev = 0;
        if isset(r, fd) {
            ev |= libc::POLLIN;
        }
        if isset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if isset(e, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            // the lock-free bitmap only: `event::poll` looks the sockets up once, and answers
            // `None` (the kernel's select) when none of them is DockNet's
            any |= ops::TABLE.maybe(fd);
            pfds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    if !any {
        return None;
    }
    let res = guard(|| event::poll_timed(&mut pfds, ms, deadline))?;
    Some(res.and_then(|_| {
        let mut count = 0;
        for set in [r, w, e] {
            if !set.is_null() {
                // SAFETY: a valid fd_set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        for p in &pfds {
            if p.revents & libc::POLLNVAL != 0 {
                return Err(libc::EBADF);
            }
            let rd = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                && p.events & libc::POLLIN != 0;
            let wr =
                p.revents & (libc::POLLOUT | libc::POLLERR) != 0 && p.events & libc::POLLOUT != 0;
            let ex = p.revents & libc::POLLPRI != 0 && p.events & libc::POLLPRI != 0;
            for (on, set) in [(rd, r), (wr, w), (ex, e)] {
                if on {
                    // SAFETY: a valid fd_set, fd < FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    count += 1;
                }
            }
        }
        Ok(count)
    }))
}

/// A timeval as a duration (negative fields count as zero, microseconds at most a second's).
fn tv_duration(tv: &libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64)
        + Duration::from_micros(tv.tv_usec.clamp(0, 999_999) as u64)
}

#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's timeval, if any.
    let tv = (!t.is_null()).then(|| unsafe { std::ptr::read_unaligned(t) });
    let ms = tv.map_or(-1, |tv| {
        (tv.tv_sec.max(0) * 1000 + (tv.tv_usec.max(0) + 999) / 1000).min(i32::MAX as i64) as c_int
    });
    let mut deadline = None;
    // SAFETY: the caller's sets.
    if let Some(res) = unsafe { select_inner(nfds, r, w, e, ms, &mut deadline) } {
        // Linux writes back the time not slept; an answer that came at once (no deadline was
        // set) slept none, and the caller's timeval already says so
        if let (Some(tv), Some(Some(d))) = (tv, deadline) {
            // (the deadline is whole milliseconds, rounded up: never more than was asked)
            let left = d
                .saturating_duration_since(std::time::Instant::now())
                .min(tv_duration(&tv));
            // SAFETY: the caller's timeval.
            unsafe {
                (*t).tv_sec = left.as_secs() as libc::time_t;
                (*t).tv_usec = left.subsec_micros() as libc::suseconds_t;
            }
        }
        return ret(res);
    }
    // SAFETY: libc's select with the caller's arguments.
    unsafe { real!(select)(nfds, r, w, e, t) }
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: `mask` is null or the caller's sigset.
    let old = sys::sigmask_set(unsafe { mask.as_ref() });
    // SAFETY: the caller's sets.
    let res = unsafe { select_inner(nfds, r, w, e, ts_ms(t), &mut None) };
    sys::sigmask_set(old.as_ref());
    if let Some(res) = res {
        return ret(res);
    }
    // SAFETY: libc's pselect with the caller's arguments.
    unsafe { real!(pselect)(nfds, r, w, e, t, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: libc's epoll_create with the caller's argument.
    let fd = unsafe { real!(epoll_create)(size) };
    let _ = catch_unwind(|| ops::epoll_created(fd));
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: libc's epoll_create1 with the caller's argument.
    let fd = unsafe { real!(epoll_create1)(flags) };
    let _ = catch_unwind(|| ops::epoll_created(fd));
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if op != libc::EPOLL_CTL_DEL && (ops::inherited(fd) || ops::inherited(epfd)) {
        // a forked child's copy of a DockNet socket never becomes ready: refused, as epoll
        // refuses a descriptor it cannot watch
        let _ = ops::inherited_error();
        return ret(Err(libc::EPERM));
    }
    if TABLE.maybe(epfd) {
        if let Some(ep) = TABLE.epoll(epfd) {
            let e = (!ev.is_null()).then(|| {
                // SAFETY: the caller's epoll_event.
                let e = unsafe { std::ptr::read_unaligned(ev) };
                (e.events, e.u64)
            });
            if let Some(r) = guard(|| ep.ctl(op, fd, e)) {
                return ret(r.map(|_| 0));
            }
            // the kernel's: a kernel descriptor (or a socket not decided yet)
            // SAFETY: libc's epoll_ctl with the caller's arguments.
            let r = unsafe { real!(epoll_ctl)(epfd, op, fd, ev) };
            if r == 0 && TABLE.sock(fd).is_none() {
                use std::sync::atomic::Ordering;
                match op {
                    libc::EPOLL_CTL_ADD => {
                        ep.kernel_members.fetch_add(1, Ordering::Relaxed);
                    }
                    libc::EPOLL_CTL_DEL => {
                        let _ = ep.kernel_members.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |n| n.checked_sub(1),
                        );
                    }
                    _ => {}
                }
            }
            return r;
        }
    }
    // SAFETY: libc's epoll_ctl with the caller's arguments.
    unsafe { real!(epoll_ctl)(epfd, op, fd, ev) }
}

/// epoll_wait on an instance that has DockNet members; `None` when it has none.
fn epoll_wait_inner(
    epfd: c_int,
    out: &mut [libc::epoll_event],
    timeout: c_int,
) -> Option<R<usize>> {
    if ops::inherited(epfd) {
        // an epoll instance of the parent's with DockNet members: they are the parent's
        return Some(Err(ops::inherited_error()));
    }
    let ep = TABLE.epoll(epfd)?;
    let has = !ep.members.lock().map(|m| m.is_empty()).unwrap_or(true);
    if !has {
        return None;
    }
    guard(|| Some(ep.wait(out, timeout)))
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    if TABLE.maybe(epfd) && max > 0 && !ev.is_null() {
        // SAFETY: the caller's array of `max` events.
        let out = unsafe { std::slice::from_raw_parts_mut(ev, max as usize) };
        if let Some(r) = epoll_wait_inner(epfd, out, timeout) {
            return ret(r.map(|n| n as c_int));
        }
    }
    // SAFETY: libc's epoll_wait with the caller's arguments.
    unsafe { real!(epoll_wait)(epfd, ev, max, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if TABLE.maybe(epfd) && max > 0 && !ev.is_null() {
        // SAFETY: the caller's array of `max` events.
        let out = unsafe { std::slice::from_raw_parts_mut(ev, max as usize) };
        // SAFETY: `mask` is null or the caller's sigset.
        let old = sys::sigmask_set(unsafe { mask.as_ref() });
        let r = epoll_wait_inner(epfd, out, timeout);
        sys::sigmask_set(old.as_ref());
        if let Some(r) = r {
            return ret(r.map(|n| n as c_int));
        }
    }
    // SAFETY: libc's epoll_pwait with the caller's arguments.
    unsafe { real!(epoll_pwait)(epfd, ev, max, timeout, mask) }
}

// ---------------------------------------------------------------------------------------
// signals: the program's handlers run through a wrapper that wakes DockNet waits

extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let e = sys::errno();
    let n = sig as usize;
    if n < crate::sig::NSIG {
        crate::sig::note(n);
    }
    sys::set_errno(e);
    let (h, flags) = match (crate::sig::HANDLERS.get(n), crate::sig::FLAGS.get(n)) {
        (Some(h), Some(f)) => (
            h.load(std::sync::atomic::Ordering::Acquire),
            f.load(std::sync::atomic::Ordering::Acquire),
        ),
        _ => return,
    };
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: `h` is the program's SA_SIGINFO handler, stored by our `sigaction`.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: `h` is the program's one-argument handler, stored by our `sigaction`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    use std::sync::atomic::Ordering;
    let n = sig as usize;
    if !ops::active()
        || sig <= 0
        || n >= crate::sig::NSIG
        || sig == libc::SIGKILL
        || sig == libc::SIGSTOP
    {
        // SAFETY: libc's sigaction with the caller's arguments.
        return unsafe { real!(sigaction)(sig, act, old) };
    }
    let prev = (
        crate::sig::HANDLERS[n].load(Ordering::Acquire),
        crate::sig::FLAGS[n].load(Ordering::Acquire),
    );
    let tramp = trampoline as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize;
    let r = if act.is_null() {
        // SAFETY: libc's sigaction, querying only.
        unsafe { real!(sigaction)(sig, act, old) }
    } else {
        // SAFETY: `act` is the caller's valid sigaction.
        let mut a = unsafe { std::ptr::read(act) };
        if a.sa_sigaction == libc::SIG_DFL
            || a.sa_sigaction == libc::SIG_IGN
            || a.sa_sigaction == tramp
        {
            crate::sig::HANDLERS[n].store(0, Ordering::Release);
        } else {
            crate::sig::FLAGS[n].store(a.sa_flags, Ordering::Release);
            crate::sig::HANDLERS[n].store(a.sa_sigaction, Ordering::Release);
            a.sa_sigaction = tramp;
            a.sa_flags |= libc::SA_SIGINFO;
        }
        // SAFETY: libc's sigaction with a live copy of the caller's action.
        let r = unsafe { real!(sigaction)(sig, &a, old) };
        if r != 0 {
            crate::sig::HANDLERS[n].store(prev.0, Ordering::Release);
            crate::sig::FLAGS[n].store(prev.1, Ordering::Release);
        }
        r
    };
    if r == 0 && !old.is_null() {
        // SAFETY: the caller's `old`, just filled by libc.
        let o = unsafe { &mut *old };
        if o.sa_sigaction == tramp {
            // the program sees its own handler, never the wrapper
            o.sa_sigaction = prev.0;
            o.sa_flags = prev.1;
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // glibc's signal(): BSD semantics, i.e. SA_RESTART and the signal not blocked... as
    // sigaction with SA_RESTART
    // SAFETY: an all-zero sigaction is valid (empty mask, no flags).
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    a.sa_sigaction = handler;
    a.sa_flags = libc::SA_RESTART;
    // SAFETY: a zeroed sigaction for the old action.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: our sigaction with live structs.
    if unsafe { sigaction(sig, &a, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
