//! Fast channels: building and removing them, telling their partners, and their traffic.

use super::state::FcRec;
use super::{err, fc_holder_key, fc_key, internal, Channel, Registry};
use crate::proto::{ApiError, ErrorCode, FcInfo};
use docknet_pipe::delivery::{ChannelDesc, Msg, Side};
use docknet_pipe::layout::{self, Identity, Kind};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;

/// A fast channel's traffic as its rings' producer indices tell it: frames each partner has
/// published, modulo 2^32. The partners write these words, so they say only what the
/// partners claim; the daemon never sees the frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcTraffic {
    /// The partner with the lower address.
    pub a: String,
    /// The other.
    pub b: String,
    /// The channel's MTU.
    pub mtu: u32,
    /// Frames `a` published to `b`.
    pub a_to_b: u32,
    /// Frames `b` published to `a`.
    pub b_to_a: u32,
}

/// A fast channel's rings at `mtu` (with `depth` slots each way, or the MTU's default): the
/// same both ways. Their parameters, layout, and the region's size.
pub(super) fn channel_plan(
    mtu: u32,
    depth: Option<u32>,
) -> Result<(layout::RingParams, [layout::RingLayout; 2], usize), layout::LayoutError> {
    let p = layout::RingParams::offload(mtu, depth)?;
    let (rings, size) = layout::plan([p, p])?;
    Ok((p, rings, size))
}

impl Registry {
    /// Builds a fast channel between `a` and `b`.
    pub fn connect_fc(&mut self, a: &str, b: &str, mtu: Option<u32>) -> Result<FcInfo, ApiError> {
        self.make_fc(a, b, mtu, false)
    }

    /// Builds a fast channel between `a` and `b`, by hand or automatically (`auto`).
    pub(super) fn make_fc(
        &mut self,
        a: &str,
        b: &str,
        mtu: Option<u32>,
        auto: bool,
    ) -> Result<FcInfo, ApiError> {
        let pa = self.get(a)?.clone();
        let pb = self.get(b)?.clone();
        if a == b {
            return Err(err(
                ErrorCode::BadParams,
                "a fast channel needs two different pipes",
            ));
        }
        if self.fcs.contains_key(&fc_key(a, b)) {
            return Err(err(
                ErrorCode::Exists,
                format!("fast channel {a}<->{b} already exists"),
            ));
        }
        // the pipes' MTU by default: TCP segments of up to 64 KiB pass either way
        let mtu = mtu.unwrap_or(pa.mtu.min(pb.mtu));
        let (params, rings, size) =
            channel_plan(mtu, None).map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        // Endpoint A is the lower address: ring 0 carries A -> B.
        let (lo, hi) = if pa.ip < pb.ip {
            (&pa, &pb)
        } else {
            (&pb, &pa)
        };
        let id = self.next_channel;
        let (fd, region) = self
            .region(&format!("docknet-fc-{id}"), size)
            .map_err(|e| internal("creating the fast channel", e))?;
        let ident = Identity {
            ip_a: lo.ip,
            ip_b_or_prefix: u32::from(hi.ip),
            mac_a: lo.mac,
            mac_b: hi.mac,
            mtu,
        };
        layout::init(&region, Kind::FastChannel, ident, rings, size)
            .map_err(|e| internal("writing the channel header", e))?;
        let lo_name = lo.name.clone();
        self.hold(&fc_holder_key(id), fd.as_fd())?;
        let rec = FcRec {
            id,
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
            auto,
        };
        let mut st = self.state();
        st.fcs.push(rec.clone());
        st.next_channel = id + 1;
        if let Err(e) = self.write(&st) {
            self.unhold(&fc_holder_key(id));
            return Err(internal("saving state", e));
        }
        self.next_channel = id + 1;
        self.fcs.insert(
            fc_key(a, b),
            Channel {
                rec,
                memfd: fd,
                region,
                rings,
                lo: lo_name,
                moved: None,
            },
        );
        for p in [a, b] {
            self.announce(p, &fc_key(a, b));
        }
        layout::bump_generation(&pa.region, &pa.info.rings[1]);
        layout::bump_generation(&pb.region, &pb.info.rings[1]);
        Ok(FcInfo {
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
            region_bytes: size,
            auto,
        })
    }

    /// Removes the fast channel between `a` and `b`.
    pub fn remove_fc(&mut self, a: &str, b: &str) -> Result<(), ApiError> {
        self.get(a)?;
        self.get(b)?;
        let key = fc_key(a, b);
        if !self.fcs.contains_key(&key) {
            return Err(err(
                ErrorCode::NotFound,
                format!("no fast channel {a}<->{b}"),
            ));
        }
        let mut st = self.state();
        st.fcs.retain(|f| fc_key(&f.a, &f.b) != key);
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.drop_channel(&key);
        Ok(())
    }

    /// Forgets a channel (already gone from the state): tells both partners, drops it from
    /// the holder.
    pub(super) fn drop_channel(&mut self, key: &(String, String)) {
        let Some(c) = self.fcs.remove(key) else {
            return;
        };
        let msg = Msg::Closed { id: c.rec.id }.encode();
        for p in [&c.rec.a, &c.rec.b] {
            self.send_all(p, &msg, None);
            if let Some(pipe) = self.pipes.get(p) {
                layout::bump_generation(&pipe.region, &pipe.info.rings[1]);
            }
        }
        self.unhold(&fc_holder_key(c.rec.id));
    }

    /// A channel as partner `me` is told about it.
    pub(super) fn channel_msg(&self, me: &str, c: &FcRec) -> Msg {
        let peer_name = if c.a == me { &c.b } else { &c.a };
        let (mine, peer) = (self.pipes.get(me), self.pipes.get(peer_name));
        let (my_ip, peer_ip, peer_mac, peer_ip6) = match (mine, peer) {
            (Some(m), Some(p)) => (m.ip, p.ip, p.mac, p.ip6.map(|x| x.0)),
            _ => (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED, [0; 6], None),
        };
        Msg::Channel(ChannelDesc {
            id: c.id,
            side: if my_ip < peer_ip { Side::A } else { Side::B },
            mtu: c.mtu,
            depth: c.ring_depth,
            peer: peer_name.clone(),
            peer_ip,
            peer_mac,
            peer_ip6,
        })
    }

    /// Tells pipe `me`'s connections about the channel at `key`.
    fn announce(&mut self, me: &str, key: &(String, String)) {
        let Some(c) = self.fcs.get(key) else { return };
        let msg = self.channel_msg(me, &c.rec).encode();
        let fd = c.memfd.try_clone().ok();
        self.send_all(me, &msg, fd.as_ref());
    }

    /// Every fast channel's traffic, by its producer indices.
    pub fn fc_traffic(&self) -> Vec<FcTraffic> {
        self.fcs
            .values()
            .map(|c| {
                let hi = if c.lo == c.rec.a {
                    c.rec.b.clone()
                } else {
                    c.rec.a.clone()
                };
                let (a_to_b, b_to_a) = c.producers();
                FcTraffic {
                    a: c.lo.clone(),
                    b: hi,
                    mtu: c.rec.mtu,
                    a_to_b,
                    b_to_a,
                }
            })
            .collect()
    }

    /// Peers pipe `name` has a fast channel with.
    pub fn fc_peers(&self, name: &str) -> Vec<String> {
        self.fcs
            .values()
            .filter_map(|c| {
                if c.rec.a == name {
                    Some(c.rec.b.clone())
                } else if c.rec.b == name {
                    Some(c.rec.a.clone())
                } else {
                    None
                }
            })
            .collect()
    }
}
