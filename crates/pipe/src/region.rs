//! A mapped shared-memory region and the only `unsafe` memory access of the crate.
//!
//! Everything else in this crate reaches shared memory through [`Region`]'s safe, bounds-checked
//! accessors. The other side of a region (a container, or the daemon) is another process that
//! may write any byte at any time, so:
//!
//! * words that carry synchronisation are only ever touched as atomics ([`Region::u32_at`]);
//! * frame bytes are copied in or out ([`Region::read`], [`Region::write`], [`copy_between`]);
//!   no `&[u8]` into shared memory is ever handed out, because the other process could change
//!   it under an immutable borrow. The exceptions, [`Region::lend_mut`] and [`Region::lend`],
//!   lend bytes of a pipe's own rings that only the daemon and the pipe's own container write
//!   (a room a producer reserved, a frame the daemon put in the receive ring and the reader has
//!   not released), never bytes another container can write; and [`Region::for_kernel`] names
//!   a range for a system call to copy from (the daemon's wire port), read by no code here;
//! * every offset is checked against the mapping's length, so a corrupted offset can at worst
//!   make an accessor return `None`, never touch memory outside the mapping.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A `MAP_SHARED` mapping of a file (or anonymous shared memory), unmapped on drop.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain shared memory. All access goes through atomics or through raw
// copies that tolerate concurrent modification (the bytes carry no Rust invariants), so sharing
// a `Region` between threads adds nothing that sharing it with another process does not.
unsafe impl Send for Region {}
// SAFETY: see `Send` above; no method takes `&mut self` for access to the mapping.
unsafe impl Sync for Region {}

impl Region {
    /// Maps all of `file` read-write and shared. The file's length is the region's length.
    pub fn map_file(file: &File) -> io::Result<Region> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "region too large"))?;
        Self::map(len, libc::MAP_SHARED, file.as_raw_fd())
    }

    /// A region in a new memfd of `len` bytes, every page allocated now (so a full tmpfs or a
    /// memory limit cannot fail a later touch), sealed against shrinking, growing and further
    /// seals: whoever receives the fd can scribble on the bytes but never take them away
    /// (no SIGBUS for anyone mapping it). Returns the fd (to hand out) and the mapping.
    pub fn create_sealed(name: &str, len: usize) -> io::Result<(OwnedFd, Region)> {
        let fd = Self::sealed_memfd(name, len)?;
        let r = Self::map_own(&fd, len)?;
        Ok((fd, r))
    }

    /// The memfd of [`Region::create_sealed`], not mapped (whoever takes it maps it with
    /// [`Region::map_own`]): making one takes no lock of this process's address space.
    pub fn sealed_memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        use nix::sys::memfd::{memfd_create, MFdFlags};
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty region"));
        }
        // never executable (and no kernel warning about it); kernels before 6.3 lack the flag
        let noexec = MFdFlags::from_bits_retain(0x0008); // MFD_NOEXEC_SEAL
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd = memfd_create(name, flags | noexec).or_else(|_| memfd_create(name, flags))?;
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        nix::unistd::ftruncate(&fd, size)?;
        nix::fcntl::fallocate(&fd, nix::fcntl::FallocateFlags::empty(), 0, size)?;
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals))?;
        Ok(fd)
    }

    /// Maps `len` bytes of a memfd this process made ([`Region::sealed_memfd`]).
    pub fn map_own(fd: &OwnedFd, len: usize) -> io::Result<Region> {
        Self::map(len, libc::MAP_SHARED, fd.as_raw_fd())
    }

    /// Maps a region received as an fd, after checking that it is `len` bytes and sealed
    /// against shrinking and growing (so nobody holding it can make the mapping fault).
    pub fn map_sealed(fd: BorrowedFd<'_>, len: usize) -> io::Result<Region> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        let seals = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS)?);
        if !seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL)
        {
            return Err(bad(
                "region is not sealed against shrinking, growing and new seals",
            ));
        }
        if seals.intersects(SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_FUTURE_WRITE) {
            return Err(bad("region is sealed against writing"));
        }
        let fs = nix::sys::statfs::fstatfs(fd)?.filesystem_type();
        if fs != nix::sys::statfs::TMPFS_MAGIC && fs != nix::sys::statfs::HUGETLBFS_MAGIC {
            return Err(bad("region is not shared memory"));
        }
        let st = nix::sys::stat::fstat(fd)?;
        if usize::try_from(st.st_size).ok() != Some(len) {
            return Err(bad("region size differs from the one announced"));
        }
        Self::map(len, libc::MAP_SHARED, fd.as_fd().as_raw_fd())
    }

    /// Anonymous shared memory of `len` bytes, zeroed; shared with children after `fork`.
    /// Used by tests and by in-process benchmarks.
    pub fn anonymous(len: usize) -> io::Result<Region> {
        Self::map(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1)
    }

    fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty region"));
        }
        // SAFETY: a fresh mapping at an address of the kernel's choosing; it aliases no Rust
        // object. Failure is reported as MAP_FAILED and checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Region { ptr, len })
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an empty region cannot be mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, off: usize, len: usize, align: usize) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.len || !off.is_multiple_of(align) {
            return None;
        }
        // SAFETY: `off + len <= self.len`, so the pointer stays inside the mapping.
        Some(unsafe { self.ptr.as_ptr().add(off) })
    }

    /// The 32-bit word at `off` as an atomic, or `None` when `off` is out of bounds or unaligned.
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        let p = self.check(off, 4, 4)?;
        // SAFETY: in bounds and 4-aligned (checked); the mapping lives as long as `self`, and
        // any bit pattern is a valid u32. Other processes access it atomically or not at all
        // (a hostile one may not, which can only garble the value, not memory safety).
        Some(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    /// The 64-bit word at `off` as an atomic, or `None` when out of bounds or unaligned.
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        let p = self.check(off, 8, 8)?;
        // SAFETY: as for `u32_at`, with 8-byte size and alignment.
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Loads the 32-bit word at `off` (0 when out of bounds or unaligned: a corrupted offset
    /// reads as nothing, never as memory outside the mapping).
    pub fn load_u32(&self, off: usize, order: Ordering) -> u32 {
        self.u32_at(off).map_or(0, |a| a.load(order))
    }

    /// Stores the 32-bit word at `off` (nothing when out of bounds or unaligned).
    pub fn store_u32(&self, off: usize, v: u32, order: Ordering) {
        if let Some(a) = self.u32_at(off) {
            a.store(v, order);
        }
    }

    /// Loads the 64-bit word at `off` (0 when out of bounds or unaligned).
    pub fn load_u64(&self, off: usize, order: Ordering) -> u64 {
        self.u64_at(off).map_or(0, |a| a.load(order))
    }

    /// Stores the 64-bit word at `off` (nothing when out of bounds or unaligned).
    pub fn store_u64(&self, off: usize, v: u64, order: Ordering) {
        if let Some(a) = self.u64_at(off) {
            a.store(v, order);
        }
    }

    /// Copies `dst.len()` bytes from the region at `off` into `dst`. False when out of bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        let Some(p) = self.check(off, dst.len(), 1) else {
            return false;
        };
        // SAFETY: source range is inside the mapping (checked); `dst` is a distinct Rust buffer.
        // The source may change concurrently; we copy whatever bytes are there.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into the region at `off`. False when out of bounds.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        let Some(p) = self.check(off, src.len(), 1) else {
            return false;
        };
        // SAFETY: destination range is inside the mapping (checked); `src` is a Rust buffer
        // that cannot overlap a mapping we never lend out as a slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        true
    }

    /// Lends the `len` bytes at `off` to `f` as a slice to build a frame in, and returns what
    /// `f` returns (`Err(f)`, `f` not called, when out of bounds).
    ///
    /// Only for bytes no process outside the caller's trust writes while `f` runs: a producer's
    /// room reserved on a ring and not yet committed, on a ring whose consumer is the daemon
    /// (the pipe's transmit ring). Never for a ring another container reads: a fast channel's
    /// partner could change the bytes under the borrow, and code that reads back what it wrote
    /// (a header length, to slice the payload) could then be led out of its bounds.
    pub fn lend_mut<R, F: FnOnce(&mut [u8]) -> R>(
        &self,
        off: usize,
        len: usize,
        f: F,
    ) -> Result<R, F> {
        let Some(p) = self.check(off, len, 1) else {
            return Err(f);
        };
        // SAFETY: the range is inside the mapping (checked) and the mapping outlives the borrow.
        // Exclusive per the caller's contract: the room is reserved by this producer and not yet
        // committed (no consumer reads it), and only the caller's own container can write it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, len) };
        Ok(f(bytes))
    }

    /// Lends the `len` bytes at `off` to `f` to read in place, and returns what `f` returns
    /// (`Err(f)`, `f` not called, when out of bounds).
    ///
    /// Only for bytes no process outside the caller's trust writes while `f` runs: a frame the
    /// daemon put in a pipe's receive ring, taken by the reader and not yet released (the daemon
    /// writes a slot only once its consumer released it). Never for a ring another container
    /// writes: a fast channel's partner could change the bytes between a parser's bounds check
    /// and its use of them.
    pub fn lend<R, F: FnOnce(&[u8]) -> R>(&self, off: usize, len: usize, f: F) -> Result<R, F> {
        let Some(p) = self.check(off, len, 1) else {
            return Err(f);
        };
        // SAFETY: the range is inside the mapping (checked) and the mapping outlives the borrow.
        // Unchanging per the caller's contract: a taken, unreleased frame of the daemon's, which
        // no producer writes again until it is released, and no other container can write.
        let bytes = unsafe { std::slice::from_raw_parts(p, len) };
        Ok(f(bytes))
    }

    /// The `len` bytes at `off` as a source for the kernel to copy from (a `sendmsg`'s
    /// iovec), or `None` when out of bounds. This process never reads them: whatever the other
    /// side writes while the kernel copies is what leaves, which can only change the bytes it
    /// sends itself. The borrow keeps the mapping alive for as long as the range is held.
    pub fn for_kernel(&self, off: usize, len: usize) -> Option<KernelSrc<'_>> {
        let ptr = self.check(off, len, 1)?;
        Some(KernelSrc {
            ptr,
            len,
            _region: std::marker::PhantomData,
        })
    }

    /// Fills `len` bytes at `off` with `byte`. False when out of bounds.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> bool {
        let Some(p) = self.check(off, len, 1) else {
            return false;
        };
        // SAFETY: range inside the mapping (checked).
        unsafe { std::ptr::write_bytes(p, byte, len) };
        true
    }
}

/// Bytes of a [`Region`] handed to the kernel to copy ([`Region::for_kernel`]); no safe code
/// can read them.
#[derive(Debug, Clone, Copy)]
pub struct KernelSrc<'r> {
    ptr: *mut u8,
    len: usize,
    _region: std::marker::PhantomData<&'r Region>,
}

impl KernelSrc<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The iovec that names it, for a system call made while `self` is held.
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr.cast(),
            iov_len: self.len,
        }
    }
}

/// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`, one copy, no bounce buffer.
/// False (and nothing copied) when either range is out of bounds. When `src` and `dst` are the
/// same region the ranges may overlap; the copy is then a `memmove`.
pub fn copy_between(
    src: &Region,
    src_off: usize,
    dst: &Region,
    dst_off: usize,
    len: usize,
) -> bool {
    let (Some(s), Some(d)) = (src.check(src_off, len, 1), dst.check(dst_off, len, 1)) else {
        return false;
    };
    // SAFETY: both ranges are inside their mappings (checked). `copy` tolerates overlap.
    unsafe { std::ptr::copy(s, d, len) };
    true
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; references handed out by the
        // accessors borrow `self`, so none outlive this call.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_are_bounds_checked() {
        let r = Region::anonymous(4096).unwrap();
        assert!(r.u32_at(4092).is_some());
        assert!(r.u32_at(4093).is_none(), "unaligned");
        assert!(r.u32_at(4096).is_none());
        assert!(r.u64_at(4088).is_some());
        assert!(r.u64_at(4092).is_none());
        assert!(r.u32_at(usize::MAX - 1).is_none(), "overflowing offset");
        let mut b = [0u8; 16];
        assert!(r.read(4080, &mut b));
        assert!(!r.read(4081, &mut b));
        assert!(!r.write(usize::MAX, &b));
        assert!(!r.fill(4000, 97, 0));
    }

    #[test]
    fn sealed_regions_cannot_shrink_or_grow_and_unsealed_ones_are_refused() {
        let (fd, r) = Region::create_sealed("test", 8192).unwrap();
        assert_eq!(r.len(), 8192);
        let f = File::from(fd.try_clone().unwrap());
        assert!(f.set_len(0).is_err(), "shrinking is sealed");
        assert!(f.set_len(1 << 20).is_err(), "growing is sealed");
        assert!(
            nix::fcntl::fcntl(
                &fd,
                nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::F_SEAL_WRITE)
            )
            .is_err(),
            "and no seal can be added (the other side could not be locked out of writing)"
        );
        let r2 = Region::map_sealed(fd.as_fd(), 8192).unwrap();
        r.u32_at(0).unwrap().store(5, Ordering::Release);
        assert_eq!(r2.u32_at(0).unwrap().load(Ordering::Acquire), 5);
        assert!(Region::map_sealed(fd.as_fd(), 4096).is_err(), "wrong size");
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(8192).unwrap();
        assert!(
            Region::map_sealed(plain.as_fd(), 8192).is_err(),
            "not sealed"
        );
    }

    #[test]
    fn anonymous_memory_is_shared_after_fork_style_remap() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(8192).unwrap();
        let a = Region::map_file(&f).unwrap();
        let b = Region::map_file(&f).unwrap();
        a.u32_at(64).unwrap().store(7, Ordering::Release);
        assert_eq!(b.u32_at(64).unwrap().load(Ordering::Acquire), 7);
        assert!(a.write(100, b"hello"));
        let mut out = [0u8; 5];
        assert!(b.read(100, &mut out));
        assert_eq!(&out, b"hello");
        assert!(copy_between(&a, 100, &b, 200, 5));
        assert!(a.read(200, &mut out));
        assert_eq!(&out, b"hello");
        assert!(!copy_between(&a, 8190, &b, 0, 5));
    }
}
