//! Which host-name questions the library answers over DockNet ([`docknet_lib::dns`] asks
//! them), and how their failures read in the C library's terms.

use docknet_lib::dns::Failure;
use std::net::Ipv4Addr;

/// Whether `getaddrinfo` for `name`, for the family `family` with `flags`, is a question the
/// library may answer: a name (not a number), IPv4 wanted, numbers not demanded.
pub fn wants(name: &str, family: i32, flags: i32) -> bool {
    (family == libc::AF_UNSPEC || family == libc::AF_INET)
        && flags & libc::AI_NUMERICHOST == 0
        && !name.is_empty()
        && name.len() <= 253
        && name.parse::<std::net::IpAddr>().is_err()
        && name.parse::<Ipv4Addr>().is_err()
}

/// `getaddrinfo`'s error for a failed look-up.
pub fn eai(f: Failure) -> i32 {
    match f {
        Failure::NoName => libc::EAI_NONAME,
        Failure::NoData => libc::EAI_NODATA,
        Failure::Again => libc::EAI_AGAIN,
    }
}

/// `h_errno` for a failed look-up (netdb.h: `HOST_NOT_FOUND` 1, `TRY_AGAIN` 2, `NO_DATA` 4).
pub fn h_errno(f: Failure) -> i32 {
    match f {
        Failure::NoName => 1,
        Failure::Again => 2,
        Failure::NoData => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_not_numbers_and_ipv4_only() {
        assert!(wants("web", libc::AF_UNSPEC, 0));
        assert!(wants(
            "web.ns.svc.cluster.local.",
            libc::AF_INET,
            libc::AI_CANONNAME
        ));
        assert!(!wants("10.0.0.1", libc::AF_UNSPEC, 0));
        assert!(!wants("::1", libc::AF_UNSPEC, 0));
        assert!(!wants("web", libc::AF_INET6, 0));
        assert!(!wants("web", libc::AF_INET, libc::AI_NUMERICHOST));
        assert!(!wants(&"a".repeat(254), libc::AF_INET, 0));
        assert_eq!(eai(Failure::Again), libc::EAI_AGAIN);
        assert_eq!(h_errno(Failure::NoData), 4);
    }
}
