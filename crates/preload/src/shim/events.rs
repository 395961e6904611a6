//! Readiness: `poll`, `select`, `epoll`.

use super::*;

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
    let _ = shelter(|| ops::epoll_created(fd));
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: libc's epoll_create1 with the caller's argument.
    let fd = unsafe { real!(epoll_create1)(flags) };
    let _ = shelter(|| ops::epoll_created(fd));
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if ops::dormant_listener(fd) && !ops::inherited(epfd) {
        // a listener whose stack is another process's (a worker whose sibling took the stack
        // at the fork) never becomes ready here: watching it is watching nothing
        return 0;
    }
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
