//! The free checks and parsers of request fields: pipe names, labels, addresses, socket names.

use super::err;
use crate::proto::{ApiError, ErrorCode};
use docknet_pipe::delivery;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Checks a pipe name: 1–128 ([`delivery::MAX_NAME`]) of `[A-Za-z0-9_.-]`, not starting with
/// `.` or `-`.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=delivery::MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadName,
            format!(
                "invalid pipe name {name:?}: use 1-{} of A-Z a-z 0-9 _ . - (not starting with . or -)",
                delivery::MAX_NAME
            ),
        ))
    }
}

/// Most labels on one pipe.
pub const MAX_LABELS: usize = 16;
/// Longest label key.
pub const MAX_LABEL_KEY: usize = 128;
/// Longest label value.
pub const MAX_LABEL_VALUE: usize = 1024;

/// Checks a pipe's labels (what a creator such as the CNI plugin records with it, e.g. its
/// owner): at most [`MAX_LABELS`]; keys 1-128 of `[A-Za-z0-9_./-]` starting with a letter or
/// digit; values up to 1024 printable ASCII characters.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |why: String| err(ErrorCode::BadParams, format!("invalid labels: {why}"));
    if labels.len() > MAX_LABELS {
        return Err(bad(format!(
            "{} labels, at most {MAX_LABELS}",
            labels.len()
        )));
    }
    for (k, v) in labels {
        let key_ok = (1..=MAX_LABEL_KEY).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-'))
            && k.as_bytes()[0].is_ascii_alphanumeric();
        if !key_ok {
            return Err(bad(format!(
                "key {k:?}: use 1-{MAX_LABEL_KEY} of A-Z a-z 0-9 _ . / - (starting with a letter or digit)"
            )));
        }
        if v.len() > MAX_LABEL_VALUE || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(bad(format!(
                "value of {k:?}: at most {MAX_LABEL_VALUE} printable ASCII characters"
            )));
        }
    }
    Ok(())
}

/// Splits `A.B.C.D/LEN` (a prefix length from `min_len` to 32); errors name the value as
/// `what` ("address", "network").
fn split_v4(s: &str, what: &str, min_len: u8) -> Result<(Ipv4Addr, u8), ApiError> {
    let bad = |why: &str| err(ErrorCode::BadIp, format!("invalid {what} {s:?}: {why}"));
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| bad("expected A.B.C.D/LEN"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (min_len..=32).contains(l))
        .ok_or_else(|| bad(&format!("prefix length must be {min_len}..=32")))?;
    Ok((ip, len))
}

/// Parses `A.B.C.D/LEN` as a network (0-32; `0.0.0.0/0` is the default route). Whether its
/// host bits are clear is the route table's check.
pub(super) fn parse_net(s: &str) -> Result<(Ipv4Addr, u8), ApiError> {
    split_v4(s, "network", 0)
}

/// Parses `A.B.C.D/LEN` and refuses addresses a pipe cannot own.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), ApiError> {
    let bad = |why: &str| err(ErrorCode::BadIp, format!("invalid address {s:?}: {why}"));
    let (ip, len) = split_v4(s, "address", 1)?;
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(bad("not a unicast host address"));
    }
    if len <= 30 {
        let mask = u32::MAX << (32 - u32::from(len));
        let host = u32::from(ip) & !mask;
        if host == 0 || host == !mask {
            return Err(bad("network or broadcast address of its subnet"));
        }
    }
    Ok((ip, len))
}

/// Parses `X::Y/LEN` and refuses IPv6 addresses a pipe cannot own: the unspecified, loopback,
/// multicast, link-local (a pipe's link-local address follows from its MAC) and IPv4-mapped
/// addresses.
pub fn parse_cidr6(s: &str) -> Result<(Ipv6Addr, u8), ApiError> {
    let bad = |why: &str| {
        err(
            ErrorCode::BadIp,
            format!("invalid IPv6 address {s:?}: {why}"),
        )
    };
    let (ip, len) = s.split_once('/').ok_or_else(|| bad("expected X::Y/LEN"))?;
    let ip: Ipv6Addr = ip.parse().map_err(|_| bad("not an IPv6 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=128).contains(l))
        .ok_or_else(|| bad("prefix length must be 1..=128"))?;
    let o = ip.octets();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return Err(bad("not a unicast host address"));
    }
    if o[0] == 0xfe && o[1] & 0xc0 == 0x80 {
        return Err(bad(
            "link-local (a pipe's link-local address is derived from its MAC)",
        ));
    }
    if ip.to_ipv4_mapped().is_some() {
        return Err(bad("an IPv4-mapped address (give IPv4 with --ip)"));
    }
    Ok((ip, len))
}

/// Checks an abstract socket name for an attachment: 1-64 of `[A-Za-z0-9/_.-]`.
pub fn validate_socket(name: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadParams,
            format!("invalid socket name {name:?}: use 1-64 of A-Z a-z 0-9 / _ . -"),
        ))
    }
}
