//! `docknet-natlb`: DockNet's NAT load balancer, a DockLib container that spreads TCP
//! connections to its own address (the VIP) over backend containers reached by fast channels.
//!
//! Layers, bottom up (only the binary does I/O):
//!
//! - [`packet`]: a checked view of TCP/IPv4 frames, the address rewrite with incremental
//!   checksum updates (RFC 1624), MSS clamping, RST and probe frames;
//! - [`table`]: the connection table, indexed by client and by balancer port, bounded, with
//!   expiry and port quarantine;
//! - [`backend`]: backends, their health (passive SYN deadlines, active probes, backoff) and the
//!   spreading policies;
//! - [`balancer`]: the full-NAT state machine over those, sending through a [`balancer::Tx`];
//! - [`stats`]: its counters as JSON; [`config`]: the command line's backends and ports.
//!
//! How it fits DockNet, and why full NAT: `docs/design.md`, "NAT load balancer".

#![deny(unsafe_code)]

pub mod backend;
pub mod balancer;
pub mod config;
pub mod packet;
pub mod stats;
pub mod table;

pub use backend::Policy;
pub use balancer::{Balancer, Config, Dest, Sent, Tx};
