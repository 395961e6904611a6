//! HTTP over DockNet and over the kernel, written once: `docknet-httpd` ([`server`]),
//! `docknet-forward` ([`forward`]) and `docknet-load` ([`client`]), both event loops over the [`io::Io`] trait, which kernel
//! sockets (`poll(2)`) and DockLib sockets ([`docknet_lib::Stack::wait`]) implement.

#![deny(unsafe_code)]

pub mod client;
pub mod forward;
pub mod io;
pub mod server;
