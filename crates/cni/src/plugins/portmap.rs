//! The `portmap` plugin: host ports forwarded to pod ports, on nftables.
//!
//! Mappings are data, not rules: table `inet podnet-portmap` holds maps keyed
//! by `[hostIP .] proto . port` whose values are `podIP . podPort`, so a
//! packet costs one lookup however many pods publish ports. `snat` (default
//! on) masquerades connections from localhost and hairpin connections (a pod
//! reaching a host port that leads back into its own subnet), without which
//! replies would bypass the reverse translation.
//!
//! What one attachment added is recorded in a small state file, so DEL and GC
//! remove exactly that even when the runtime sends no portMappings.
//!
//! The table is planned as a typed [`Table`] ([`table`], pure) and changed
//! over nf_tables netlink: ADD declares it (rules rewritten, nothing
//! replaced) and adds its elements in one transaction; DEL reads the maps
//! back and removes only the elements that still carry this attachment's
//! values, so a host port another pod has since taken stays with it.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use podnet_kernel::Handle;
use podnet_kernel::KernelError;
use podnet_nft::diff::{self, Change};
use podnet_nft::model::{
    Chain, ChainType, ElemData, Expr, Family, Field, Hook, KeyType, Proto, Rule, Set, Table,
    Value as NftValue, Verdict,
};
use podnet_nft::netlink::Conn;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CniError, Code};
use crate::skel::{CmdArgs, Plugin};
use crate::types::{self, get_ci, json_kind, runtime_key, Attachment, CniResult};

pub const TABLE: &str = "podnet-portmap";
const DEFAULT_STATE_DIR: &str = "/var/lib/cni/podnet-portmap";

#[derive(Debug, Deserialize)]
struct Conf {
    #[serde(default)]
    snat: Option<bool>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Value>,
    /// podnet extension: where per-attachment state lives.
    #[serde(rename = "stateDir", default)]
    state_dir: Option<String>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    valid_attachments: Option<Vec<Attachment>>,
}

/// One requested mapping, keys matched case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: String,
    pub host_ip: Option<IpAddr>,
}

pub fn parse_mappings(rc: &Option<Value>) -> Result<Vec<PortMapping>, CniError> {
    let Some(list) = runtime_key(rc, "portMappings") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| CniError::config("portmap: runtimeConfig.portMappings must be a list"))?;
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let port = |k: &str| -> Result<u16, CniError> {
            let v = get_ci(m, k).and_then(|v| v.as_u64()).ok_or_else(|| {
                CniError::config(format!("portmap: mapping {i}: missing or invalid {k}"))
            })?;
            if v == 0 || v > 65535 {
                return Err(CniError::config(format!(
                    "portmap: mapping {i}: {k} {v} out of range 1-65535"
                )));
            }
            Ok(v as u16)
        };
        // A string field, or absent (missing or null). Anything else is an
        // error: a hostIP ignored would map the port on every address.
        let string = |k: &str| -> Result<Option<&str>, CniError> {
            match get_ci(m, k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(v) => Err(CniError::config(format!(
                    "portmap: mapping {i}: {k} must be a string, not {}",
                    json_kind(v)
                ))),
            }
        };
        let protocol = string("protocol")?.unwrap_or("tcp").to_ascii_lowercase();
        if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
            return Err(CniError::config(format!(
                "portmap: mapping {i}: unknown protocol {protocol:?}"
            )));
        }
        let host_ip = match string("hostIP")?.filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(s.parse::<IpAddr>().map_err(|_| {
                CniError::config(format!("portmap: mapping {i}: invalid hostIP {s:?}"))
            })?),
        };
        out.push(PortMapping {
            host_port: port("hostPort")?,
            container_port: port("containerPort")?,
            protocol,
            host_ip: host_ip.filter(|ip| !ip.is_unspecified()),
        });
    }
    Ok(out)
}

/// One nft element this plugin owns: the set it lives in and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Element {
    pub set: String,
    pub key: String,
    pub value: Option<String>,
}

impl Element {
    fn full(&self) -> String {
        match &self.value {
            Some(v) => format!("{} : {}", self.key, v),
            None => self.key.clone(),
        }
    }
}

/// The pure plan: which elements realise these mappings for these pod IPs.
pub fn plan(maps: &[PortMapping], pod_ips: &[IpNet], snat: bool) -> Vec<Element> {
    let mut out = Vec::new();
    for ip in pod_ips {
        let v4 = ip.addr().is_ipv4();
        let fam = if v4 { "4" } else { "6" };
        let mut used = false;
        for m in maps {
            if let Some(h) = m.host_ip {
                if h.is_ipv4() != v4 {
                    continue;
                }
            }
            used = true;
            let value = Some(format!("{} . {}", ip.addr(), m.container_port));
            out.push(match m.host_ip {
                Some(h) => Element {
                    set: format!("hp{fam}"),
                    key: format!("{h} . {} . {}", m.protocol, m.host_port),
                    value,
                },
                None => Element {
                    set: format!("hp{fam}any"),
                    key: format!("{} . {}", m.protocol, m.host_port),
                    value,
                },
            });
        }
        if used && snat {
            out.push(Element {
                set: format!("snat{fam}"),
                key: ip.addr().to_string(),
                value: None,
            });
            out.push(Element {
                set: format!("hairpin{fam}"),
                key: format!("{} . {}", ip.trunc(), ip.addr()),
                value: None,
            });
        }
    }
    out
}

/// Table `inet podnet-portmap` without elements: host ports DNATed by map
/// lookup (from outside and from this host), and the masquerade of
/// localhost and hairpin connections.
pub fn table() -> Table {
    let mut t = Table::new(Family::Inet, TABLE);
    let nat = |hook, priority| Chain::base(ChainType::Nat, hook, priority);
    let to_hostports = || {
        vec![Rule::new(vec![
            Expr::FibDaddrLocal,
            Expr::Verdict(Verdict::Jump("hostports".into())),
        ])]
    };
    t.chains.insert(
        "prerouting".into(),
        nat(Hook::Prerouting, -100).with_rules(to_hostports()),
    );
    t.chains.insert(
        "output".into(),
        nat(Hook::Output, -100).with_rules(to_hostports()),
    );
    let (mut hostports, mut post) = (Vec::new(), Vec::new());
    for v6 in [false, true] {
        let fam = IpFamily::of(v6);
        fam.declare_sets(&mut t);
        hostports.extend(fam.dnat_rules());
        post.extend(fam.masquerade_rules());
    }
    t.chains.insert(
        "hostports".into(),
        Chain {
            base: None,
            rules: hostports,
        },
    );
    t.chains.insert(
        "postrouting".into(),
        nat(Hook::Postrouting, 100).with_rules(post),
    );
    t
}

/// One IP family's part of the table: its sets are suffixed `4` or `6`,
/// and its rules read that family's fields.
struct IpFamily {
    v6: bool,
    /// The sets' suffix.
    f: &'static str,
    addr: KeyType,
    saddr: Field,
    daddr: Field,
    /// The loopback prefix (connections from localhost are masqueraded).
    lo: &'static str,
    /// `meta nfproto` for this family.
    nfproto: u8,
}

impl IpFamily {
    fn of(v6: bool) -> IpFamily {
        if v6 {
            IpFamily {
                v6,
                f: "6",
                addr: KeyType::Ipv6Addr,
                saddr: Field::Ip6Saddr,
                daddr: Field::Ip6Daddr,
                lo: "::1/128",
                nfproto: 10,
            }
        } else {
            IpFamily {
                v6,
                f: "4",
                addr: KeyType::Ipv4Addr,
                saddr: Field::IpSaddr,
                daddr: Field::IpDaddr,
                lo: "127.0.0.0/8",
                nfproto: 2,
            }
        }
    }

    /// The host port maps (`hp`: with a host IP, `hpany`: any address) and
    /// the masquerade sets (`snat`: pods with host ports, `hairpin`: pod
    /// subnet . pod pairs).
    fn declare_sets(&self, t: &mut Table) {
        let (f, addr) = (self.f, self.addr);
        let svc = vec![KeyType::InetProto, KeyType::InetService];
        let target = vec![addr, KeyType::InetService];
        t.sets.insert(
            format!("hp{f}"),
            Set::data_map(
                vec![addr, KeyType::InetProto, KeyType::InetService],
                target.clone(),
            ),
        );
        t.sets
            .insert(format!("hp{f}any"), Set::data_map(svc, target));
        t.sets.insert(format!("snat{f}"), Set::new(vec![addr]));
        let mut hairpin = Set::new(vec![addr, addr]);
        hairpin.interval = true;
        t.sets.insert(format!("hairpin{f}"), hairpin);
    }

    /// `hostports`' rules: DNAT by the host IP map, then by the any-address
    /// map.
    fn dnat_rules(&self) -> [Rule; 2] {
        let (f, v6) = (self.f, self.v6);
        [
            Rule::new(vec![Expr::MapDnat {
                keys: vec![self.daddr, Field::L4Proto, Field::Dport],
                map: format!("hp{f}"),
                v6,
            }]),
            Rule::new(vec![
                Expr::Cmp {
                    field: Field::NfProto,
                    neg: false,
                    value: NftValue::U8(self.nfproto),
                },
                Expr::MapDnat {
                    keys: vec![Field::L4Proto, Field::Dport],
                    map: format!("hp{f}any"),
                    v6,
                },
            ]),
        ]
    }

    /// `postrouting`'s rules: masquerade DNATed connections from localhost
    /// and hairpin connections.
    fn masquerade_rules(&self) -> [Rule; 2] {
        let (f, saddr, daddr) = (self.f, self.saddr, self.daddr);
        let lo: IpNet = self.lo.parse().expect("prefix");
        let lo = if lo.prefix_len() == lo.max_prefix_len() {
            NftValue::Addr(lo.addr())
        } else {
            NftValue::Net(lo)
        };
        [
            Rule::new(vec![
                Expr::CtDnat,
                Expr::Cmp {
                    field: saddr,
                    neg: false,
                    value: lo,
                },
                Expr::InSet {
                    keys: vec![daddr],
                    set: format!("snat{f}"),
                    neg: false,
                },
                Expr::Masquerade {
                    fully_random: false,
                },
            ]),
            Rule::new(vec![
                Expr::CtDnat,
                Expr::InSet {
                    keys: vec![saddr, daddr],
                    set: format!("hairpin{f}"),
                    neg: false,
                },
                Expr::Masquerade {
                    fully_random: false,
                },
            ]),
        ]
    }
}

/// One value of an element in nft syntax: a protocol, a prefix, an
/// address or a port.
fn parse_value(s: &str) -> Option<NftValue> {
    Some(match s {
        "tcp" => NftValue::Proto(Proto::Tcp),
        "udp" => NftValue::Proto(Proto::Udp),
        "sctp" => NftValue::Proto(Proto::Sctp),
        s if s.contains('/') => {
            let n: IpNet = s.parse().ok()?;
            if n.prefix_len() == n.max_prefix_len() {
                NftValue::Addr(n.addr())
            } else {
                NftValue::Net(n)
            }
        }
        s => match s.parse::<IpAddr>() {
            Ok(a) => NftValue::Addr(a),
            Err(_) => NftValue::Port(s.parse().ok()?),
        },
    })
}

fn parse_values(s: &str) -> Option<Vec<NftValue>> {
    s.split(" . ").map(parse_value).collect()
}

impl Element {
    /// The element in the model: key and data (the state file keeps the
    /// nft syntax, as earlier versions wrote it).
    pub fn typed(&self) -> Option<(Vec<NftValue>, Option<ElemData>)> {
        let key = parse_values(&self.key)?;
        let data = match &self.value {
            Some(v) => Some(ElemData::Data(parse_values(v)?)),
            None => None,
        };
        Some((key, data))
    }
}

fn bad_element(e: &Element) -> KernelError {
    KernelError::Netlink {
        op: format!("port mapping {} in {}", e.full(), e.set),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        detail: Some("not an element of this table".into()),
    }
}

/// Elements of one set, in the model.
type SetElems = (String, Vec<(Vec<NftValue>, Option<ElemData>)>);

/// Groups typed elements by set (first-seen order).
fn by_set(els: &[Element]) -> Result<Vec<SetElems>, KernelError> {
    let mut out: Vec<(String, Vec<_>)> = Vec::new();
    for e in els {
        let typed = e.typed().ok_or_else(|| bad_element(e))?;
        match out.iter_mut().find(|(s, _)| *s == e.set) {
            Some((_, v)) => v.push(typed),
            None => out.push((e.set.clone(), vec![typed])),
        }
    }
    Ok(out)
}

/// The transaction that adds these elements (the table declared first).
pub fn add_changes(els: &[Element]) -> Result<Vec<Change>, KernelError> {
    let mut out = diff::ensure(&table());
    for (set, elems) in by_set(els)? {
        out.push(Change::AddElems { set, elems });
    }
    Ok(out)
}

/// Adds the mappings; a host port mapped to another pod fails with EEXIST.
pub fn add_elements(els: &[Element]) -> Result<(), KernelError> {
    Conn::open()?.apply(&table(), &add_changes(els)?)
}

/// The transaction that removes those of `els` that `have` (the kernel's
/// sets) still holds as they are: a map key now pointing at another pod is
/// left alone. Plain set elements are added then deleted, which cannot fail.
pub fn del_changes(els: &[Element], have: &Table) -> Result<Vec<Change>, KernelError> {
    let mut out = Vec::new();
    for (set, elems) in by_set(els)? {
        let held = have.sets.get(&set);
        let mut keys = Vec::new();
        let mut readd = Vec::new();
        for (k, d) in elems {
            match &d {
                None => {
                    readd.push((k.clone(), None));
                    keys.push(k);
                }
                Some(_) if held.and_then(|s| s.elements.get(&k)) == Some(&d) => keys.push(k),
                Some(_) => {}
            }
        }
        if !readd.is_empty() {
            out.push(Change::AddElems {
                set: set.clone(),
                elems: readd,
            });
        }
        if !keys.is_empty() {
            out.push(Change::DelElems { set, keys });
        }
    }
    Ok(out)
}

/// The table's sets as the kernel holds them (None: no table).
fn read_sets(conn: &mut Conn, sets: &[&str]) -> Result<Option<Table>, KernelError> {
    let want = table();
    let mut t = Table::new(Family::Inet, TABLE);
    for name in sets {
        let Some(decl) = want.sets.get(*name) else {
            continue;
        };
        match conn.elements(Family::Inet, TABLE, name, decl)? {
            Some(s) => {
                t.sets.insert(name.to_string(), s);
            }
            None if t.sets.is_empty() => return Ok(None),
            None => {}
        }
    }
    Ok(Some(t))
}

/// Removes the mappings this attachment still owns (missing is fine).
pub fn del_elements(els: &[Element]) -> Result<(), KernelError> {
    if els.is_empty() {
        return Ok(());
    }
    let mut sets: Vec<&str> = els.iter().map(|e| e.set.as_str()).collect();
    sets.sort();
    sets.dedup();
    let mut conn = Conn::open()?;
    // A second round covers an element another DEL removed in between.
    let mut last = None;
    for _ in 0..2 {
        let Some(have) = read_sets(&mut conn, &sets)? else {
            return Ok(());
        };
        let changes = del_changes(els, &have)?;
        if changes.is_empty() {
            return Ok(());
        }
        let mut all = diff::ensure(&table());
        all.extend(changes);
        match conn.apply(&table(), &all) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("a failed round"))
}

/// The first planned element the kernel does not hold as planned.
pub fn check_elements(els: &[Element]) -> Result<Option<String>, KernelError> {
    let mut sets: Vec<&str> = els.iter().map(|e| e.set.as_str()).collect();
    sets.sort();
    sets.dedup();
    let have = read_sets(&mut Conn::open()?, &sets)?.unwrap_or_else(table);
    for e in els {
        let (k, d) = e.typed().ok_or_else(|| bad_element(e))?;
        match have.sets.get(&e.set).and_then(|s| s.elements.get(&k)) {
            None => {
                return Ok(Some(format!(
                    "portmap: mapping {} missing from {}",
                    e.key, e.set
                )))
            }
            Some(got) if *got != d => {
                return Ok(Some(format!(
                    "portmap: mapping {} points elsewhere (want {})",
                    e.key,
                    e.value.as_deref().unwrap_or("")
                )))
            }
            Some(_) => {}
        }
    }
    Ok(None)
}

fn state_path(dir: &str, id: &str, ifname: &str) -> PathBuf {
    PathBuf::from(dir).join(format!("{id}-{ifname}.json"))
}

fn pod_ips(prev: &CniResult) -> Vec<IpNet> {
    prev.ips
        .iter()
        .filter(|ip| {
            ip.interface
                .and_then(|i| prev.interfaces.get(i))
                .map(|i| !i.sandbox.is_empty())
                .unwrap_or(true)
        })
        .map(|ip| ip.address)
        .collect()
}

/// Lets 127.0.0.1 be DNATed to a pod: route_localnet on the host interface
/// that faces the pod's subnet.
fn enable_localnet(ips: &[IpNet]) -> Result<(), CniError> {
    let mut h = Handle::new()?;
    let addrs = h.addrs(0)?;
    for ip in ips.iter().filter(|i| i.addr().is_ipv4()) {
        if let Some(a) = addrs
            .iter()
            .find(|a| a.net.contains(&ip.addr()) && a.net.addr() != ip.addr())
        {
            if let Some(l) = h.link_by_index(a.index)? {
                podnet_kernel::netns::write_sysctl(
                    &format!("net.ipv4.conf.{}.route_localnet", l.name),
                    "1",
                )?;
            }
        }
    }
    Ok(())
}

pub struct Portmap;

fn load(args: &CmdArgs) -> Result<(Conf, String), CniError> {
    let c: Conf = types::parse_conf(&args.stdin)?;
    let dir = c
        .state_dir
        .clone()
        .unwrap_or_else(|| DEFAULT_STATE_DIR.to_string());
    Ok((c, dir))
}

/// Parses a portmap configuration and its requested mappings without
/// touching any state.
pub fn parse_config(stdin: &[u8]) -> Result<Vec<PortMapping>, CniError> {
    let c: Conf = types::parse_conf(stdin)?;
    parse_mappings(&c.runtime_config)
}

fn read_state(path: &PathBuf) -> Option<Vec<Element>> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

impl Plugin for Portmap {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, CniError> {
        let (c, dir) = load(args)?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| {
                CniError::config("portmap: must be called as a chained plugin (prevResult missing)")
            })
            .and_then(CniResult::from_value)?;
        let maps = parse_mappings(&c.runtime_config)?;
        if maps.is_empty() {
            return Ok(prev);
        }
        let ips = pod_ips(&prev);
        if ips.is_empty() {
            return Err(CniError::config(
                "portmap: prevResult has no pod IP addresses",
            ));
        }
        let snat = c.snat.unwrap_or(true);
        let els = plan(&maps, &ips, snat);
        let path = state_path(&dir, &args.container_id, &args.ifname);
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&path, serde_json::to_vec(&els).expect("json")))
            .map_err(|e| {
                CniError::new(Code::Io, format!("portmap: writing {}", path.display()))
                    .with_details(e.to_string())
            })?;
        if let Err(e) = add_elements(&els) {
            let _ = std::fs::remove_file(&path);
            let msg = e.to_string();
            if e.is_exists() || e.errno() == Some(libc::EBUSY) {
                return Err(CniError::internal(format!(
                    "portmap: a host port in {} is already mapped to another pod",
                    maps.iter()
                        .map(|m| format!("{}/{}", m.host_port, m.protocol))
                        .collect::<Vec<_>>()
                        .join(",")
                ))
                .with_details(msg));
            }
            return Err(e.into());
        }
        if snat {
            enable_localnet(&ips)?;
        }
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, dir) = load(args)?;
        let path = state_path(&dir, &args.container_id, &args.ifname);
        let els = match read_state(&path) {
            Some(els) => els,
            None => {
                // No record (never added, or removed already): fall back to
                // what the runtime tells us, if anything.
                let maps = parse_mappings(&c.runtime_config)?;
                let prev = c
                    .prev_result
                    .as_ref()
                    .and_then(|v| CniResult::from_value(v).ok());
                match prev {
                    Some(p) if !maps.is_empty() => {
                        plan(&maps, &pod_ips(&p), c.snat.unwrap_or(true))
                    }
                    _ => Vec::new(),
                }
            }
        };
        del_elements(&els)?;
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, _) = load(args)?;
        let prev = c
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("portmap: required prevResult missing"))
            .and_then(CniResult::from_value)?;
        let maps = parse_mappings(&c.runtime_config)?;
        if let Some(problem) =
            check_elements(&plan(&maps, &pod_ips(&prev), c.snat.unwrap_or(true)))?
        {
            return Err(CniError::internal(problem));
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), CniError> {
        let (c, dir) = load(args)?;
        let valid: Vec<String> = c
            .valid_attachments
            .unwrap_or_default()
            .into_iter()
            .map(|a| format!("{}-{}.json", a.container_id, a.ifname))
            .collect();
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".json") || valid.contains(&name) {
                continue;
            }
            if let Some(els) = read_state(&ent.path()) {
                del_elements(&els)?;
            }
            let _ = std::fs::remove_file(ent.path());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podnet_nft::trace::{Packet, Tracer};
    use serde_json::json;

    #[test]
    fn mappings_accept_containerd_capitalised_keys() {
        let rc = Some(json!({"portMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "TCP", "HostIP": ""},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}
        ]}));
        let m = parse_mappings(&rc).unwrap();
        assert_eq!(
            m[0],
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: None
            }
        );
        assert_eq!(m[1].host_ip.unwrap().to_string(), "127.0.0.1");
    }

    #[test]
    fn bad_mappings_are_named() {
        let rc = Some(json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}));
        assert!(parse_mappings(&rc)
            .unwrap_err()
            .msg
            .contains("hostPort 0 out of range"));
        let rc = Some(
            json!({"portMappings": [{"hostPort": 1, "containerPort": 80, "protocol": "icmp"}]}),
        );
        assert!(parse_mappings(&rc)
            .unwrap_err()
            .msg
            .contains("unknown protocol"));
    }

    #[test]
    fn non_string_host_ip_and_protocol_are_refused() {
        for (k, v, kind) in [
            ("hostIP", json!(5), "a number"),
            ("HostIP", json!(["10.0.0.1"]), "a list"),
            ("hostip", json!({"ip": "10.0.0.1"}), "an object"),
            ("HostIP", json!(true), "a boolean"),
            ("protocol", json!(6), "a number"),
            ("Protocol", json!(["udp"]), "a list"),
        ] {
            let mut m = json!({"HostPort": 8080, "ContainerPort": 80});
            m[k] = v;
            let e = parse_mappings(&Some(json!({"portMappings": [m]}))).unwrap_err();
            let field = if k.eq_ignore_ascii_case("hostIP") {
                "hostIP"
            } else {
                "protocol"
            };
            assert_eq!(e.code, 7);
            assert_eq!(
                e.msg,
                format!("portmap: mapping 0: {field} must be a string, not {kind}")
            );
        }
        // null is "not given", as with containerd's and CRI-O's omitted fields.
        let m = parse_mappings(&Some(json!({"portMappings": [
            {"hostPort": 1, "containerPort": 2, "hostIP": null, "protocol": null}
        ]})))
        .unwrap();
        assert_eq!((m[0].protocol.as_str(), m[0].host_ip), ("tcp", None));
        // The same through the whole configuration.
        let e = parse_config(
            br#"{"cniVersion":"1.0.0","name":"n","type":"portmap","runtimeConfig":
                {"PortMappings":[{"HostPort":80,"ContainerPort":80,"HostIP":7}]}}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (
                7,
                "portmap: mapping 0: hostIP must be a string, not a number"
            )
        );
    }

    #[test]
    fn plan_covers_families_and_snat() {
        let maps = vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: None,
        }];
        let ips: Vec<IpNet> = vec![
            "10.1.0.5/24".parse().unwrap(),
            "fd00::5/64".parse().unwrap(),
        ];
        let els = plan(&maps, &ips, true);
        let keys: Vec<String> = els
            .iter()
            .map(|e| format!("{} {}", e.set, e.full()))
            .collect();
        assert_eq!(
            keys,
            vec![
                "hp4any tcp . 8080 : 10.1.0.5 . 80",
                "snat4 10.1.0.5",
                "hairpin4 10.1.0.0/24 . 10.1.0.5",
                "hp6any tcp . 8080 : fd00::5 . 80",
                "snat6 fd00::5",
                "hairpin6 fd00::/64 . fd00::5",
            ]
        );
        assert_eq!(plan(&maps, &ips, false).len(), 2);
        let v4only = vec![PortMapping {
            host_ip: Some("192.0.2.1".parse().unwrap()),
            ..maps[0].clone()
        }];
        let els = plan(&v4only, &ips, false);
        assert_eq!(els.len(), 1);
        assert_eq!(els[0].key, "192.0.2.1 . tcp . 8080");
    }

    /// The planned table with these elements in it.
    fn planned(els: &[Element]) -> Table {
        let mut t = table();
        for c in add_changes(els).unwrap() {
            if let Change::AddElems { set, elems } = c {
                t.sets.get_mut(&set).unwrap().elements.extend(elems);
            }
        }
        t
    }

    fn web_and_dns() -> Table {
        let maps = vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: None,
            },
            PortMapping {
                host_port: 5353,
                container_port: 53,
                protocol: "udp".into(),
                host_ip: Some("192.0.2.1".parse().unwrap()),
            },
        ];
        let ips: Vec<IpNet> = vec![
            "10.1.0.5/24".parse().unwrap(),
            "fd00::5/64".parse().unwrap(),
        ];
        planned(&plan(&maps, &ips, true))
    }

    const HOST: [&str; 4] = ["192.0.2.1", "192.0.2.2", "127.0.0.1", "2001:db8::1"];

    type Seen = (Option<(IpAddr, Option<u16>)>, bool);

    fn incoming(t: &Table, src: &str, dst: &str, proto: Proto, port: u16) -> Seen {
        let o = Tracer::new(t)
            .with_local(&HOST)
            .incoming(&Packet::new(src, dst, proto, port), &mut |_| 0);
        (o.dnat, o.masquerade)
    }

    fn to(ip: &str, port: u16) -> Option<(IpAddr, Option<u16>)> {
        Some((ip.parse().unwrap(), Some(port)))
    }

    #[test]
    fn host_ports_dnat_to_the_pod() {
        let t = web_and_dns();
        let tcp = Proto::Tcp;
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.1", tcp, 8080),
            (to("10.1.0.5", 80), false),
            "any host address, source kept"
        );
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.2", tcp, 8080),
            (to("10.1.0.5", 80), false)
        );
        assert_eq!(
            incoming(&t, "2001:db8::7", "2001:db8::1", tcp, 8080),
            (to("fd00::5", 80), false),
            "IPv6"
        );
        assert_eq!(
            incoming(&t, "198.51.100.7", "203.0.113.9", tcp, 8080),
            (None, false),
            "not for this host"
        );
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.1", tcp, 8081),
            (None, false)
        );
        // hostIP: that address, that protocol only.
        let udp = Proto::Udp;
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.1", udp, 5353),
            (to("10.1.0.5", 53), false)
        );
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.2", udp, 5353),
            (None, false)
        );
        assert_eq!(
            incoming(&t, "198.51.100.7", "192.0.2.1", tcp, 5353),
            (None, false)
        );
    }

    #[test]
    fn hairpin_and_localhost_are_masqueraded() {
        let t = web_and_dns();
        assert_eq!(
            incoming(&t, "10.1.0.5", "192.0.2.1", Proto::Tcp, 8080),
            (to("10.1.0.5", 80), true),
            "the pod reaching itself through its host port"
        );
        assert_eq!(
            incoming(&t, "10.1.0.6", "192.0.2.1", Proto::Tcp, 8080),
            (to("10.1.0.5", 80), true),
            "a neighbour on its bridge"
        );
        assert_eq!(
            incoming(&t, "fd00::6", "2001:db8::1", Proto::Tcp, 8080),
            (to("fd00::5", 80), true)
        );
        let o = Tracer::new(&t).with_local(&HOST).local(
            &Packet::new("127.0.0.1", "127.0.0.1", Proto::Tcp, 8080),
            &mut |_| 0,
        );
        assert_eq!(
            (o.dnat, o.masquerade),
            (to("10.1.0.5", 80), true),
            "localhost"
        );
        let o = Tracer::new(&t).with_local(&HOST).local(
            &Packet::new("192.0.2.1", "192.0.2.1", Proto::Tcp, 8080),
            &mut |_| 0,
        );
        assert_eq!(
            (o.dnat, o.masquerade),
            (to("10.1.0.5", 80), false),
            "from the host"
        );
        // Without snat: no masquerade elements at all.
        let maps = vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: "tcp".into(),
            host_ip: None,
        }];
        let t = planned(&plan(&maps, &["10.1.0.5/24".parse().unwrap()], false));
        assert_eq!(
            incoming(&t, "10.1.0.5", "192.0.2.1", Proto::Tcp, 8080),
            (to("10.1.0.5", 80), false)
        );
    }

    #[test]
    fn removal_spares_a_host_port_another_pod_holds_now() {
        let mine = plan(
            &[PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: None,
            }],
            &["10.1.0.5/24".parse().unwrap()],
            true,
        );
        let mut theirs = mine.clone();
        theirs[0].value = Some("10.1.0.9 . 80".into());
        let c = del_changes(&mine, &planned(&theirs)).unwrap();
        assert!(
            c.iter()
                .all(|c| !matches!(c, Change::DelElems { set, .. } if set == "hp4any")),
            "{c:?}"
        );
        let c = del_changes(&mine, &planned(&mine)).unwrap();
        assert!(c.contains(&Change::DelElems {
            set: "hp4any".into(),
            keys: vec![vec![NftValue::Proto(Proto::Tcp), NftValue::Port(8080)]]
        }));
        assert_eq!(
            diff::ops(&c),
            1 + 2 * 2,
            "the map element, and add-then-delete of snat4 and hairpin4: {c:?}"
        );
    }
}
