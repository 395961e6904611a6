use super::*;

use crate::socket::tcp::Socket;

impl InterfaceInner {
    pub(crate) fn process_tcp<'frame>(
        &mut self,
        sockets: &mut SocketSet,
        handled_by_raw_socket: bool,
        ip_repr: IpRepr,
        ip_payload: &'frame [u8],
    ) -> Option<Packet<'frame>> {
        let (src_addr, dst_addr) = (ip_repr.src_addr(), ip_repr.dst_addr());

        // Per RFC 1122 §3.2.1.3, the unspecified address must never appear as a source
        // or destination in any IP datagram. Drop such TCP segments early to avoid
        // creating sockets with unspecified peers (which would later panic on egress).
        // This is not done at the iface level because it might be useful with
        // UDP or raw sockets, but it's definitely not useful for TCP.
        if src_addr.is_unspecified() || dst_addr.is_unspecified() {
            return None;
        }

        let tcp_packet = check!(TcpPacket::new_checked(ip_payload));
        let tcp_repr = check!(TcpRepr::parse(
            &tcp_packet,
            &src_addr,
            &dst_addr,
            &self.caps.checksum
        ));

        // DockNet patch: a segment only its connection's socket accepts goes to the socket
        // that last took its 4-tuple, if it still accepts it (SocketSet::set_tcp_lookup)
        let lookup = sockets.tcp_lookup_worth();
        let only_its_own =
            lookup && (tcp_repr.ack_number.is_some() || tcp_repr.control == TcpControl::Rst);
        let hash = if lookup {
            tuple_hash(&ip_repr, &tcp_repr)
        } else {
            0
        };
        let mut taker = match only_its_own.then(|| sockets.tcp_hint(hash)).flatten() {
            Some(h) => sockets.item_touch(h).and_then(|(item, _, _)| {
                Socket::downcast_mut(&mut item.socket)
                    .is_some_and(|t| t.accepts(self, &ip_repr, &tcp_repr))
                    .then_some(h)
            }),
            _ => None,
        };
        if taker.is_none() {
            let (items, _, _) = sockets.items_mut_all();
            for item in items {
                let Some(tcp_socket) = Socket::downcast_mut(&mut item.socket) else {
                    continue;
                };
                if tcp_socket.accepts(self, &ip_repr, &tcp_repr) {
                    taker = Some(item.meta.handle);
                    break;
                }
            }
            // (a SYN's taker too: should two sockets hold one 4-tuple, an old connection a
            // program never closed and a new one from the same port, the rest goes where the
            // SYN went)
            if let Some(h) = taker.filter(|_| lookup) {
                sockets.set_tcp_hint(hash, h);
            }
        }
        if let Some((item, touch, changes)) = taker.and_then(|h| sockets.item_touch(h)) {
            if let Some(tcp_socket) = Socket::downcast_mut(&mut item.socket) {
                // DockNet patch: what it took in may call for a segment (SocketSet::set_egress_scope)
                touch.touch(&mut item.meta);
                // DockNet patch: and may change what it is ready for (SocketSet::set_change_log)
                changes.note(&mut item.meta);
                return tcp_socket
                    .process(self, &ip_repr, &tcp_repr)
                    .map(|(ip, tcp)| Packet::new(ip, IpPayload::Tcp(tcp)));
            }
        }

        if tcp_repr.control == TcpControl::Rst
            || ip_repr.dst_addr().is_unspecified()
            || ip_repr.src_addr().is_unspecified()
            || handled_by_raw_socket
        {
            // Never reply to a TCP RST packet with another TCP RST packet.
            // Never send a TCP RST packet with unspecified addresses.
            // Never send a TCP RST when packet has been handled by raw socket.
            None
        } else {
            // The packet wasn't handled by a socket, send a TCP RST packet.
            let (ip, tcp) = tcp::Socket::rst_reply(&ip_repr, &tcp_repr);
            Some(Packet::new(ip, IpPayload::Tcp(tcp)))
        }
    }
}

/// DockNet patch: a hash of a segment's 4-tuple, for `SocketSet::tcp_hint`.
fn tuple_hash(ip_repr: &IpRepr, tcp_repr: &TcpRepr) -> usize {
    hash_of(
        ip_repr.src_addr(),
        ip_repr.dst_addr(),
        tcp_repr.src_port,
        tcp_repr.dst_port,
    )
}

/// DockNet patch: [`tuple_hash`] of a segment from `src` to `dst`.
pub(crate) fn endpoints_hash(src: IpEndpoint, dst: IpEndpoint) -> usize {
    hash_of(src.addr, dst.addr, src.port, dst.port)
}

fn hash_of(src: IpAddress, dst: IpAddress, src_port: u16, dst_port: u16) -> usize {
    fn fold(a: IpAddress) -> u64 {
        match a {
            #[cfg(feature = "proto-ipv4")]
            IpAddress::Ipv4(a) => u32::from_be_bytes(a.octets()) as u64,
            #[cfg(feature = "proto-ipv6")]
            IpAddress::Ipv6(a) => {
                let b = a.octets();
                let mut x = 0u64;
                for c in b.chunks(8) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(c);
                    x = x.rotate_left(17) ^ u64::from_be_bytes(w);
                }
                x
            }
        }
    }
    let mut x = fold(src).rotate_left(32) ^ fold(dst);
    x ^= ((src_port as u64) << 16) | dst_port as u64;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 32) as usize
}
