//! Host names: `getaddrinfo` and the `gethostbyname` family, answered over DockNet when the
//! name server is DockNet's ([`docknet_lib::dns`]).

use super::*;
use docknet_lib::dns::Lookup;

/// `getaddrinfo`: a name whose name server is on the pipe's network is resolved over DockNet
/// ([`docknet_lib::dns`]: glibc's own resolver would ask through the kernel), and its addresses
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
        (true, Some(n)) if crate::resolve::wants(n, h.ai_family, h.ai_flags) => look(n),
        _ => None,
    };
    let real = real!(getaddrinfo);
    let (addrs, canon) = match looked {
        Some(Ok(Lookup::Found(a, c))) => (a, c),
        Some(Ok(Lookup::Failed(f))) => return crate::resolve::eai(f),
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
    for a in addrs.iter().take(MAX_ADDRESSES) {
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

/// `h_errno`'s "try again" (netdb.h).
const TRY_AGAIN: c_int = 2;

/// Addresses of one name `getaddrinfo` returns, at most: an answer over TCP (a large headless
/// Service's) can carry thousands, and each address here costs a call of libc's own.
const MAX_ADDRESSES: usize = 256;

/// `name` looked up over DockNet ([`docknet_lib::dns::lookup`]) on the process's stack, when
/// one is attached; a panic is an error.
fn look(name: &str) -> Option<R<Lookup>> {
    guard(|| {
        let st = ops::stack()?;
        let ours = |a| crate::sock::route_for(st, a) == crate::sock::Route::DockNet;
        Some(Ok(docknet_lib::dns::lookup(st, name, ours)))
    })
}

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
    match look(n)? {
        Ok(Lookup::Found(a, c)) => Some(Ok((a, c))),
        Ok(Lookup::Failed(f)) => Some(Err(crate::resolve::h_errno(f))),
        Ok(Lookup::NotOurs) => None,
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
