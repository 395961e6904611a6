//! Options and control: `setsockopt`, `getsockopt`, `fcntl`, `ioctl`, `dup`.

use super::*;

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
    if (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) && TABLE.maybe(fd) {
        let _ = shelter(|| ops::before_dup(fd));
    }
    // SAFETY: libc's fcntl with the caller's arguments (the third as the word it was).
    let r = unsafe { real!(fcntl)(fd, cmd, arg) };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) && TABLE.maybe(fd) {
        let _ = shelter(|| ops::duplicated(fd, r));
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
    if TABLE.maybe(fd) {
        let _ = shelter(|| ops::before_dup(fd));
    }
    // SAFETY: libc's dup with the caller's argument.
    let r = unsafe { real!(dup)(fd) };
    if r >= 0 && TABLE.maybe(fd) {
        let _ = shelter(|| ops::duplicated(fd, r));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if TABLE.maybe(old) {
        let _ = shelter(|| ops::before_dup(old));
    }
    // SAFETY: libc's dup2 with the caller's arguments.
    let r = unsafe { real!(dup2)(old, new) };
    if r >= 0 && (TABLE.maybe(old) || TABLE.maybe(new)) {
        let _ = shelter(|| ops::duplicated(old, new));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if TABLE.maybe(old) {
        let _ = shelter(|| ops::before_dup(old));
    }
    // SAFETY: libc's dup3 with the caller's arguments.
    let r = unsafe { real!(dup3)(old, new, flags) };
    if r >= 0 && (TABLE.maybe(old) || TABLE.maybe(new)) {
        let _ = shelter(|| ops::duplicated(old, new));
    }
    r
}
