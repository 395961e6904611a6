//! DockPipe: the shared-memory interface between a container and DockDaemon.
//!
//! A DockPipe is one file on tmpfs (`<run-dir>/pipes/<name>/dp.map`) holding a header, two SPSC
//! descriptor rings (`tx`: container → daemon, `rx`: daemon → container) and their frame areas;
//! a fast channel is a second kind of region with two rings between two partner containers. See
//! [`layout`] for the byte layout, [`ring`] for the index protocol, and [`wake`] for sleeping.
//!
//! The peer across a region is untrusted: every index and descriptor it writes is checked before
//! use, refused ones are counted, and no accessor can reach outside the mapping. This crate does
//! no I/O beyond `mmap` and futexes; the `unsafe` lives in [`region`] and [`wake`] only.

#![deny(unsafe_code)]

pub mod delivery;
pub mod fdpass;
pub mod layout;
#[allow(unsafe_code)]
pub mod region;
pub mod ring;
pub mod services;
#[allow(unsafe_code)]
pub mod wake;

pub use layout::{Identity, Kind, LayoutError, RegionInfo, RingLayout, RingParams, ETH_HDR};
pub use region::{KernelSrc, Region};
pub use ring::{BadDescriptor, Consumer, Descriptor, Frame, Producer, PushError, RingStats, Slot};
pub use wake::{IdlePolicy, Idler, Woke};
