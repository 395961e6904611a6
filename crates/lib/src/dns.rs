//! Host names over DockNet: DNS questions for A records to a name server reached through the
//! pipe (a cluster's DNS Service, say), with the resolver's rules for `/etc/resolv.conf`'s
//! `search`, `ndots`, `timeout` and `attempts`, names in `/etc/hosts` left to the C library.
//! [`lookup`] does it all on a [`Stack`]; the pieces are public for tests and fuzzing.
//!
//! The preload library answers `getaddrinfo` and the `gethostbyname` family with it: glibc's
//! resolver (inside libc itself since 2.34) opens and drives its UDP sockets through libc's
//! internal entry points, which `LD_PRELOAD` does not interpose, so its questions to a name
//! server on the pipe's network went to the kernel, which has no route there in a container
//! whose only network is the pipe. Only A records are asked for: DockNet's preloaded sockets
//! are IPv4. A truncated answer is a failure of that server (no TCP retry).
//!
//! Everything read from a name server is untrusted: an answer must carry the question's id and
//! name and come from the server asked; it is parsed by `simple-dns`, and a CNAME chain is
//! followed at most [`MAX_CHAIN`] links.

use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, QTYPE, RCODE, TYPE};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use crate::{Stack, TcpStream, UdpSocket};

/// CNAME links followed within one answer.
pub const MAX_CHAIN: usize = 8;
/// Name servers asked, as glibc reads at most three.
pub const MAX_SERVERS: usize = 3;
/// Search domains used.
pub const MAX_SEARCH: usize = 6;

/// What `/etc/resolv.conf` says, for the part the resolver uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    /// IPv4 name servers, in order (IPv6 ones are skipped: the library's sockets are IPv4).
    pub servers: Vec<Ipv4Addr>,
    /// Whether an IPv6 server came before every IPv4 one (the first server is then not ours).
    pub v6_first: bool,
    /// Search domains, in order.
    pub search: Vec<String>,
    /// Dots a name needs to be tried as it is before the search domains.
    pub ndots: usize,
    /// Wait per question.
    pub timeout: Duration,
    /// Rounds over the servers.
    pub attempts: u32,
}

impl Default for Conf {
    fn default() -> Conf {
        Conf {
            servers: Vec::new(),
            v6_first: false,
            search: Vec::new(),
            ndots: 1,
            timeout: Duration::from_secs(5),
            attempts: 2,
        }
    }
}

/// Parses `resolv.conf` text as glibc does for these keys: the last `search` or `domain` line
/// wins, options are `ndots:N` (at most 15), `timeout:N` (1-30 s) and `attempts:N` (1-5).
pub fn parse_conf(text: &str) -> Conf {
    let mut c = Conf::default();
    let mut any_v4 = false;
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut w = line.split_whitespace();
        match w.next() {
            Some("nameserver") => match w.next().map(str::parse::<std::net::IpAddr>) {
                Some(Ok(std::net::IpAddr::V4(a))) => {
                    if c.servers.len() < MAX_SERVERS {
                        c.servers.push(a);
                    }
                    any_v4 = true;
                }
                Some(Ok(std::net::IpAddr::V6(_))) if !any_v4 => c.v6_first = true,
                _ => {}
            },
            Some("search") | Some("domain") => {
                c.search = w
                    .take(MAX_SEARCH)
                    .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
                    .filter(|d| !d.is_empty())
                    .collect();
            }
            Some("options") => {
                for o in w {
                    let (k, v) = o.split_once(':').unwrap_or((o, ""));
                    let n = v.parse::<u64>().ok();
                    match (k, n) {
                        ("ndots", Some(n)) => c.ndots = n.min(15) as usize,
                        ("timeout", Some(n)) => c.timeout = Duration::from_secs(n.clamp(1, 30)),
                        ("attempts", Some(n)) => c.attempts = n.clamp(1, 5) as u32,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    c
}

/// Whether `/etc/hosts` text names `name` (libc then answers from the file, before any DNS).
pub fn in_hosts(text: &str, name: &str) -> bool {
    let name = name.trim_end_matches('.');
    text.lines().any(|l| {
        let l = l.split('#').next().unwrap_or("");
        l.split_whitespace()
            .skip(1)
            .any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(name))
    })
}

/// The names to ask for, in the resolver's order: a name ending in `.` as it is only; one with
/// at least `ndots` dots as it is first, then with each search domain; one with fewer, the
/// search domains first.
pub fn candidates(name: &str, c: &Conf) -> Vec<String> {
    if let Some(abs) = name.strip_suffix('.') {
        return vec![abs.to_string()];
    }
    let searched = c.search.iter().map(|d| format!("{name}.{d}"));
    if name.matches('.').count() >= c.ndots {
        std::iter::once(name.to_string()).chain(searched).collect()
    } else {
        searched.chain(std::iter::once(name.to_string())).collect()
    }
}

/// The question for the A records of `name` with id `id`, recursion desired.
pub fn question(id: u16, name: &str) -> Option<Vec<u8>> {
    let mut p = Packet::new_query(id);
    p.set_flags(PacketFlag::RECURSION_DESIRED);
    p.questions.push(Question::new(
        Name::new(name).ok()?,
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    p.build_bytes_vec().ok()
}

/// What one answer says about a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Its addresses, and the name that holds them (the end of a CNAME chain).
    Found(Vec<Ipv4Addr>, String),
    /// The name does not exist.
    NoName,
    /// It exists but has no IPv4 address.
    NoData,
    /// The server could not answer (failure, refusal): ask the next.
    Failed,
    /// The answer did not fit the datagram: ask the same server over TCP.
    Truncated,
}

/// Reads `bytes` as the answer to question `id` about `name`; `None` when it is not that
/// answer (another id or question, not a reply, not DNS): the caller keeps waiting.
pub fn answer(bytes: &[u8], id: u16, name: &str) -> Option<Answer> {
    let p = Packet::parse(bytes).ok()?;
    if p.id() != id || !p.has_flags(PacketFlag::RESPONSE) {
        return None;
    }
    let q = p.questions.first()?;
    if !same(&q.qname.to_string(), name) {
        return None;
    }
    if p.has_flags(PacketFlag::TRUNCATION) {
        return Some(Answer::Truncated);
    }
    match p.rcode() {
        RCODE::NoError => {}
        RCODE::NameError => return Some(Answer::NoName),
        _ => return Some(Answer::Failed),
    }
    let mut at = name.trim_end_matches('.').to_string();
    for _ in 0..=MAX_CHAIN {
        let here: Vec<Ipv4Addr> = p
            .answers
            .iter()
            .filter(|r| same(&r.name.to_string(), &at))
            .filter_map(|r| match &r.rdata {
                RData::A(a) => Some(Ipv4Addr::from(a.address)),
                _ => None,
            })
            .collect();
        if !here.is_empty() {
            return Some(Answer::Found(here, at));
        }
        let next = p.answers.iter().find_map(|r| match &r.rdata {
            RData::CNAME(c) if same(&r.name.to_string(), &at) => Some(c.0.to_string()),
            _ => None,
        });
        match next {
            Some(n) => at = n.trim_end_matches('.').to_string(),
            None => break,
        }
    }
    Some(Answer::NoData)
}

fn same(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

/// What [`lookup`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Not this module's question: libc's `getaddrinfo` answers it.
    NotOurs,
    /// The addresses and the canonical name.
    Found(Vec<Ipv4Addr>, String),
    /// None found, and why.
    Failed(Failure),
}

/// Why a look-up found no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No name of the candidates exists (`EAI_NONAME`).
    NoName,
    /// A name exists but has no IPv4 address (`EAI_NODATA`).
    NoData,
    /// No server answered for some candidate (`EAI_AGAIN`).
    Again,
}

/// Resolves `name` over `stack` when the first name server of `/etc/resolv.conf` is reached
/// through the pipe (`is_ours` says, for an address) and the name is not in `/etc/hosts`.
pub fn lookup(stack: &Stack, name: &str, is_ours: impl Fn(Ipv4Addr) -> bool) -> Lookup {
    let conf = parse_conf(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    plan(name, &conf, &hosts, is_ours, OverDockNet(stack))
}

/// Sends one question to a server and waits for its answer.
pub trait Ask {
    /// Sends `q` to `server` port 53 and returns what `check` accepts of the datagrams that
    /// come back from it within `wait` (`None`: nothing did).
    fn ask(
        &self,
        server: Ipv4Addr,
        q: &[u8],
        wait: Duration,
        check: &dyn Fn(&[u8]) -> Option<Answer>,
    ) -> Option<Answer>;

    /// The same over a TCP connection to `server` port 53 (after a truncated answer): what
    /// `check` says of the one answer that comes back within `wait`.
    fn ask_tcp(
        &self,
        server: Ipv4Addr,
        q: &[u8],
        wait: Duration,
        check: &dyn Fn(&[u8]) -> Option<Answer>,
    ) -> Option<Answer>;
}

/// [`lookup`] with its inputs given (tested without a network).
pub fn plan(
    name: &str,
    conf: &Conf,
    hosts: &str,
    is_ours: impl Fn(Ipv4Addr) -> bool,
    ask: impl Ask,
) -> Lookup {
    let Some(&first) = conf.servers.first() else {
        return Lookup::NotOurs;
    };
    if conf.v6_first || !is_ours(first) || in_hosts(hosts, name) {
        return Lookup::NotOurs;
    }
    let servers: Vec<Ipv4Addr> = conf
        .servers
        .iter()
        .copied()
        .filter(|s| is_ours(*s))
        .collect();
    let mut nodata = false;
    let mut failed = false;
    for cand in candidates(name, conf) {
        let id = next_id();
        let Some(q) = question(id, &cand) else {
            continue;
        };
        let check = |b: &[u8]| answer(b, id, &cand);
        let mut got = None;
        'ask: for _ in 0..conf.attempts {
            for &s in &servers {
                let a = match ask.ask(s, &q, conf.timeout, &check) {
                    Some(Answer::Truncated) => ask.ask_tcp(s, &q, conf.timeout, &check),
                    a => a,
                };
                match a {
                    Some(Answer::Failed | Answer::Truncated) | None => {}
                    Some(a) => {
                        got = Some(a);
                        break 'ask;
                    }
                }
            }
        }
        match got {
            Some(Answer::Found(a, canon)) => return Lookup::Found(a, canon),
            Some(Answer::NoData) => nodata = true,
            Some(Answer::NoName) => {}
            _ => failed = true,
        }
    }
    Lookup::Failed(if failed {
        Failure::Again
    } else if nodata {
        Failure::NoData
    } else {
        Failure::NoName
    })
}

fn next_id() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u16
}

/// Questions on a DockLib UDP socket of the process's stack.
#[derive(Debug)]
pub struct OverDockNet<'a>(pub &'a Stack);

impl Ask for OverDockNet<'_> {
    fn ask(
        &self,
        server: Ipv4Addr,
        q: &[u8],
        wait: Duration,
        check: &dyn Fn(&[u8]) -> Option<Answer>,
    ) -> Option<Answer> {
        let mut u = UdpSocket::bind(self.0, 0).ok()?;
        let to = SocketAddrV4::new(server, 53);
        u.send_to(q, to).ok()?;
        let end = Instant::now() + wait;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            u.set_read_timeout(Some(left));
            match u.recv_from(&mut buf) {
                Ok((n, SocketAddr::V4(from))) if from == to => {
                    if let Some(a) = check(&buf[..n]) {
                        return Some(a);
                    }
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    fn ask_tcp(
        &self,
        server: Ipv4Addr,
        q: &[u8],
        wait: Duration,
        check: &dyn Fn(&[u8]) -> Option<Answer>,
    ) -> Option<Answer> {
        let end = Instant::now() + wait;
        let mut s = TcpStream::connect_within(self.0, SocketAddrV4::new(server, 53), wait).ok()?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        // the question with its length in front (RFC 1035 4.2.2), in one write
        let mut msg = u16::try_from(q.len()).ok()?.to_be_bytes().to_vec();
        msg.extend_from_slice(q);
        s.set_write_timeout(Some(left));
        s.write_all(&msg).ok()?;
        let mut len = [0u8; 2];
        read_by(&mut s, &mut len, end)?;
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
        read_by(&mut s, &mut answer, end)?;
        check(&answer)
    }
}

/// Fills `buf` from `s` by `end` (a server that trickles its bytes gets no more time).
fn read_by(s: &mut TcpStream, buf: &mut [u8], end: Instant) -> Option<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left));
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return None,
            Ok(k) => got += k,
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn resolv_conf_is_read_as_the_resolver_reads_it() {
        let c = parse_conf(
            "# k8s\nnameserver 10.96.0.10\nnameserver fe80::1\nnameserver 10.0.0.2 # two\n\
             search default.svc.cluster.local svc.cluster.local cluster.local\n\
             options ndots:5 timeout:1 attempts:9 rotate\nnameserver 1.1.1.1\nnameserver 8.8.8.8\n",
        );
        assert_eq!(
            c.servers,
            ["10.96.0.10", "10.0.0.2", "1.1.1.1"].map(|s| s.parse::<Ipv4Addr>().unwrap())
        );
        assert!(!c.v6_first);
        assert_eq!(c.search.len(), 3);
        assert_eq!(
            (c.ndots, c.timeout, c.attempts),
            (5, Duration::from_secs(1), 5)
        );
        assert!(parse_conf("nameserver ::1\nnameserver 10.0.0.1\n").v6_first);
        assert_eq!(parse_conf("garbage\n\0\u{7f}options ndots:x").ndots, 1);
    }

    #[test]
    fn names_are_tried_in_the_resolvers_order() {
        let c = Conf {
            search: vec!["ns.svc.cluster.local".into(), "cluster.local".into()],
            ndots: 5,
            ..Conf::default()
        };
        assert_eq!(
            candidates("web", &c),
            ["web.ns.svc.cluster.local", "web.cluster.local", "web"]
        );
        assert_eq!(candidates("example.com.", &c), ["example.com"]);
        let one = Conf {
            ndots: 1,
            ..c.clone()
        };
        assert_eq!(candidates("a.b", &one)[0], "a.b");
        assert!(in_hosts(
            "127.0.0.1 localhost\n10.0.0.5 db db.local # x\n",
            "DB.local."
        ));
        assert!(!in_hosts("# 10.0.0.5 db\n", "db"));
    }

    /// An answer to `id` about `name` with `rcode` and records (owner, A address or CNAME
    /// target).
    fn reply(id: u16, name: &str, rcode: RCODE, recs: &[(&str, &str)]) -> Vec<u8> {
        let mut p = Packet::new_reply(id);
        *p.rcode_mut() = rcode;
        p.questions.push(Question::new(
            Name::new_unchecked(name),
            QTYPE::TYPE(TYPE::A),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        for (owner, v) in recs {
            let rdata = match v.parse::<Ipv4Addr>() {
                Ok(a) => RData::A(simple_dns::rdata::A {
                    address: u32::from(a),
                }),
                Err(_) => RData::CNAME(simple_dns::rdata::CNAME(Name::new_unchecked(v))),
            };
            p.answers.push(simple_dns::ResourceRecord::new(
                Name::new_unchecked(owner),
                CLASS::IN,
                30,
                rdata,
            ));
        }
        p.build_bytes_vec().unwrap()
    }

    #[test]
    fn answers_are_checked_and_cname_chains_followed_within_bounds() {
        let r = reply(7, "web.x", RCODE::NoError, &[("web.x", "10.0.0.9")]);
        assert_eq!(
            answer(&r, 7, "web.x"),
            Some(Answer::Found(
                vec!["10.0.0.9".parse().unwrap()],
                "web.x".into()
            ))
        );
        assert_eq!(answer(&r, 8, "web.x"), None, "another id");
        assert_eq!(answer(&r, 7, "db.x"), None, "another question");
        assert_eq!(
            answer(&question(7, "web.x").unwrap(), 7, "web.x"),
            None,
            "a query"
        );
        let chain = reply(
            1,
            "a.x",
            RCODE::NoError,
            &[
                ("a.x", "b.x"),
                ("b.x", "c.x"),
                ("c.x", "10.0.0.3"),
                ("z.x", "10.0.0.4"),
            ],
        );
        assert_eq!(
            answer(&chain, 1, "a.x"),
            Some(Answer::Found(
                vec!["10.0.0.3".parse().unwrap()],
                "c.x".into()
            ))
        );
        let lp = reply(1, "a.x", RCODE::NoError, &[("a.x", "b.x"), ("b.x", "a.x")]);
        assert_eq!(answer(&lp, 1, "a.x"), Some(Answer::NoData), "a loop ends");
        assert_eq!(
            answer(&reply(2, "n.x", RCODE::NameError, &[]), 2, "n.x"),
            Some(Answer::NoName)
        );
        assert_eq!(
            answer(&reply(2, "n.x", RCODE::ServerFailure, &[]), 2, "n.x"),
            Some(Answer::Failed)
        );
        for cut in 0..r.len() {
            let _ = answer(&r[..cut], 7, "web.x");
        }
        // a hostile server's bytes: every mutation is read or refused, never a panic
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut m = chain.clone();
            for _ in 0..1 + rnd() % 4 {
                let i = (rnd() as usize) % m.len();
                m[i] = rnd() as u8;
            }
            let _ = answer(&m, 1, "a.x");
        }
    }

    /// Answers from a table of (server, name) -> reply kind, recording what was asked. Names
    /// in `truncated` get a truncated datagram, and their answer over TCP where `tcp` serves.
    struct Table {
        asked: RefCell<Vec<(Ipv4Addr, String)>>,
        answers: Vec<(Ipv4Addr, &'static str, Option<&'static str>)>,
        truncated: Vec<&'static str>,
        tcp: bool,
        asked_tcp: RefCell<Vec<(Ipv4Addr, String)>>,
    }

    impl Table {
        fn new(answers: Vec<(Ipv4Addr, &'static str, Option<&'static str>)>) -> Table {
            Table {
                asked: RefCell::default(),
                answers,
                truncated: Vec::new(),
                tcp: true,
                asked_tcp: RefCell::default(),
            }
        }

        fn reply_to(&self, server: Ipv4Addr, q: &[u8]) -> Option<Vec<u8>> {
            let p = Packet::parse(q).unwrap();
            let name = p.questions[0].qname.to_string();
            let (_, _, kind) = self
                .answers
                .iter()
                .find(|(s, n, _)| *s == server && *n == name)?;
            Some(match kind {
                Some(addr) => reply(p.id(), &name, RCODE::NoError, &[(&name, addr)]),
                None => reply(p.id(), &name, RCODE::NameError, &[]),
            })
        }
    }

    impl Ask for &Table {
        fn ask(
            &self,
            server: Ipv4Addr,
            q: &[u8],
            _wait: Duration,
            check: &dyn Fn(&[u8]) -> Option<Answer>,
        ) -> Option<Answer> {
            let p = Packet::parse(q).unwrap();
            let name = p.questions[0].qname.to_string();
            self.asked.borrow_mut().push((server, name.clone()));
            if self.truncated.contains(&name.as_str()) {
                let mut r = Packet::new_reply(p.id());
                r.set_flags(PacketFlag::TRUNCATION);
                r.questions.push(p.questions[0].clone());
                return check(&r.build_bytes_vec().unwrap());
            }
            check(&self.reply_to(server, q)?)
        }

        fn ask_tcp(
            &self,
            server: Ipv4Addr,
            q: &[u8],
            _wait: Duration,
            check: &dyn Fn(&[u8]) -> Option<Answer>,
        ) -> Option<Answer> {
            let name = Packet::parse(q).unwrap().questions[0].qname.to_string();
            self.asked_tcp.borrow_mut().push((server, name));
            if !self.tcp {
                return None;
            }
            check(&self.reply_to(server, q)?)
        }
    }

    #[test]
    fn a_truncated_answer_is_asked_again_over_tcp_of_the_same_server() {
        let ours = |a: Ipv4Addr| a.octets()[0] == 10;
        let (one, two): (Ipv4Addr, Ipv4Addr) =
            ("10.96.0.10".parse().unwrap(), "10.96.0.11".parse().unwrap());
        let conf = Conf {
            servers: vec![one, two],
            timeout: Duration::from_millis(1),
            ..Conf::default()
        };
        let mut t = Table::new(vec![
            (one, "many.x", Some("10.1.0.1")),
            (two, "many.x", Some("10.1.0.2")),
        ]);
        t.truncated = vec!["many.x"];
        assert_eq!(
            plan("many.x", &conf, "", ours, &t),
            Lookup::Found(vec!["10.1.0.1".parse().unwrap()], "many.x".into())
        );
        assert_eq!(*t.asked_tcp.borrow(), vec![(one, "many.x".to_string())]);
        // no answer over TCP: the next server, then the next round, then a temporary failure
        t.tcp = false;
        t.asked.borrow_mut().clear();
        t.asked_tcp.borrow_mut().clear();
        assert_eq!(
            plan("many.x", &conf, "", ours, &t),
            Lookup::Failed(Failure::Again)
        );
        let tcp: Vec<Ipv4Addr> = t.asked_tcp.borrow().iter().map(|a| a.0).collect();
        assert_eq!(
            tcp,
            vec![one, two, one, two],
            "each truncation, once, of its server"
        );
        // an untruncated answer never opens a connection
        t.truncated.clear();
        t.asked_tcp.borrow_mut().clear();
        assert!(matches!(
            plan("many.x", &conf, "", ours, &t),
            Lookup::Found(..)
        ));
        assert!(t.asked_tcp.borrow().is_empty());
    }

    #[test]
    fn the_first_server_decides_and_the_search_list_is_walked() {
        let ours = |a: Ipv4Addr| a.octets()[0] == 10;
        let dns: Ipv4Addr = "10.96.0.10".parse().unwrap();
        let conf = Conf {
            servers: vec![dns],
            search: vec!["ns.svc".into(), "svc".into()],
            ndots: 2,
            timeout: Duration::from_millis(1),
            ..Conf::default()
        };
        let t = Table::new(vec![
            (dns, "web.ns.svc", None),
            (dns, "web.svc", Some("10.96.1.1")),
        ]);
        assert_eq!(
            plan("web", &conf, "", ours, &t),
            Lookup::Found(vec!["10.96.1.1".parse().unwrap()], "web.svc".into())
        );
        assert_eq!(t.asked.borrow().len(), 2);
        // a name nobody has: every candidate asked, then "no such name"
        assert_eq!(
            plan("nosuch", &conf, "", ours, &t),
            Lookup::Failed(Failure::Again),
            "unanswered questions are a temporary failure"
        );
        let t2 = Table::new(
            ["nosuch.ns.svc", "nosuch.svc", "nosuch"]
                .map(|n| (dns, n, None))
                .to_vec(),
        );
        assert_eq!(
            plan("nosuch", &conf, "", ours, &t2),
            Lookup::Failed(Failure::NoName)
        );
        // a kernel server first, a name in /etc/hosts, no server: libc's
        let kernel = Conf {
            servers: vec!["192.168.1.1".parse().unwrap(), dns],
            ..conf.clone()
        };
        assert_eq!(plan("web", &kernel, "", ours, &t), Lookup::NotOurs);
        assert_eq!(
            plan("web", &conf, "10.0.0.1 web\n", ours, &t),
            Lookup::NotOurs
        );
        assert_eq!(plan("web", &Conf::default(), "", ours, &t), Lookup::NotOurs);
    }
}
