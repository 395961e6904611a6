//! Signals: the program's handlers run through a wrapper that wakes DockNet waits.

use super::*;

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
    // SAFETY: the kernel's siginfo for this delivery, live during the handler.
    let kept = || unsafe { info.as_ref() }.copied().unwrap_or(sys::NO_SIGINFO);
    if crate::sig::defer(n, kept) {
        return;
    }
    sys::call_handler(n, h, flags, info, ctx);
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
