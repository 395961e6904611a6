//! `libdocknet_preload.so`: unmodified programs on DockNet.
//!
//! Loaded with `LD_PRELOAD` (`docknet run --pipe NAME --preload -- CMD`), it takes the POSIX
//! socket calls of AF_INET TCP and UDP sockets whose addresses are on the pipe's network and
//! serves them with DockLib; everything else (loopback, other networks, Unix sockets, files)
//! goes to libc unchanged. How and why: `docs/design.md` (section "The preload library") and
//! `docs/preload.md`.
//!
//! Layout: `shim` (the `extern "C"` entry points) and `sys` (libc's own functions, errno)
//! hold every `unsafe` block; `ops` (the socket calls), `opts` (options and control),
//! `event` (poll, select, epoll and the notifier), `epoll_set` (an epoll
//! instance's DockNet members and which of them a wait looks at), `sock` (a socket's state, routes, poll
//! bits), `family` (what fork, exec and exit do to the sockets), `relay` (connections a
//! forked child uses, served through the parent), `resolve` (host names over DockNet), `sig`
//! (signals and blocked calls), `table` (descriptor table) and `errno` are safe code.

#![deny(unsafe_code)]

pub mod epoll_set;
pub mod errno;
pub mod event;
pub mod family;
pub mod ops;
pub mod opts;
pub mod relay;
pub mod resolve;
pub mod share;
#[cfg(not(test))]
mod shim;
pub mod sig;
pub mod sock;
pub mod sys;
pub mod table;
