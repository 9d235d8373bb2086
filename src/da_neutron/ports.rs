//! Which ports are ours, and whose: each is owned by this plugin
//! (`device_owner`), made for a container (`device_id`), named for its
//! CNI network, pool and interface, and tagged with its node, its CNI
//! network and its cluster (where one is named), so that DEL, GC and the
//! operator's verbs find exactly the ports they may touch, even at a
//! controller that ignores list filters. The owner and the name alone say
//! whose a port is; the tags let a listing select by node and network,
//! GC touches no port without this node's marks, and nothing touches
//! another cluster's. The same marks are in the port's `description`,
//! which every controller keeps: a port whose tags were lost (a plugin
//! killed between its POST and the tags' PUT, at a controller that drops
//! a POST's tags) is still found by its node.

use super::api::{Controller, Port};
use super::error::NeutronError;

/// The `device_owner` that marks a port as this plugin's.
pub const OWNER: &str = "cni:ipam-da-neutron";

/// The attachment a port is for, and the pool it was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container: String,
    pub ifname: String,
    pub pool: String,
}

/// The port name of `network`'s attachment `ifname`, for `pool`. `/` is
/// in no network, pool or interface name, so the name reads back whole.
pub fn name(network: &str, pool: &str, ifname: &str) -> String {
    format!("{network}/{pool}/{ifname}")
}

/// Neutron's limit on a port's `description` (and `name`).
pub const FIELD_LIMIT: usize = 255;

/// The most a mark's value may be in a tag (Neutron takes 255 characters
/// in a tag, with the mark's name before it).
const TAG_VALUE_LIMIT: usize = 200;

/// `value` as a mark's tag carries it: itself, or, where it would not
/// fit a tag or would split a tag filter (a comma, a line break),
/// `sha256:` and its digest, which a listing selects all the same.
pub fn tag_value(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= TAG_VALUE_LIMIT && !value.contains([',', '\n']) {
        return value.into();
    }
    format!("sha256:{}", digest(value)).into()
}

/// What marks a port as one node's, for one CNI network, of one cluster
/// (where `ipam.neutron.cluster` names one): its tags, and the same in
/// its description.
#[derive(Debug, Clone, Copy)]
pub struct Marks<'a> {
    pub node: &'a str,
    pub network: &'a str,
    pub cluster: Option<&'a str>,
}

impl Marks<'_> {
    /// The tags every port of ours carries.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = vec![
            format!("cni-node={}", tag_value(self.node)),
            format!("cni-network={}", self.network),
        ];
        tags.extend(self.cluster.map(|c| format!("cni-cluster={c}")));
        tags
    }

    /// The `description` every port of ours carries: the marks, each
    /// value escaped so that a space or a `%` in it reads back whole;
    /// where they pass the controller's limit, a digest of them, which a
    /// listing still selects exactly (only the node cannot be read back
    /// from it).
    pub fn description(&self) -> String {
        let mut marks = format!(
            "ipam-da-neutron cni-node={} cni-network={}",
            escaped(self.node),
            escaped(self.network)
        );
        if let Some(cluster) = self.cluster {
            marks.push_str(&format!(" cni-cluster={}", escaped(cluster)));
        }
        if marks.len() <= FIELD_LIMIT {
            return marks;
        }
        format!("ipam-da-neutron marks-sha256={}", digest(&marks))
    }

    /// Whether `port` carries these marks: all the tags, or (its tags
    /// lost) the description.
    pub fn on(&self, port: &Port) -> bool {
        let tagged = self.tags().iter().all(|t| port.tags.contains(t));
        (tagged || port.description == self.description()) && !foreign(port, self.cluster)
    }
}

/// A mark too long to be written whole: the first 128 bits of its
/// SHA-256, in hex.
pub fn digest(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `value` as it goes in a description: `%`, spaces and control
/// characters escaped as `%XX`, so that the marks split at spaces.
fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c == '%' || c == ' ' || c.is_control() {
            let mut bytes = [0; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A description's value read back: `%XX` as the byte it stands for
/// (one without two hex digits after it is left as it is).
fn unescaped(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of mark `key` (`cni-node`, `cni-cluster`) on `port`: its
/// tag, else its description's.
fn mark(port: &Port, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    if let Some(tag) = port.tags.iter().find_map(|t| t.strip_prefix(&prefix)) {
        return Some(tag.to_owned());
    }
    let marks = port.description.strip_prefix("ipam-da-neutron ")?;
    marks
        .split(' ')
        .find_map(|m| m.strip_prefix(&prefix))
        .map(unescaped)
}

/// The node a port of ours is marked with, as its tag carries it
/// ([`tag_value`]: a long name's digest): its tag, else its description.
pub fn node_of(port: &Port) -> Option<String> {
    mark(port, "cni-node").map(|node| tag_value(&node).into_owned())
}

/// Whether `port` is marked as another cluster's than `cluster` (none
/// for a configuration without `cluster`): never ours to touch. A port
/// without a cluster's mark may be ours (made before `cluster` was set).
pub fn foreign(port: &Port, cluster: Option<&str>) -> bool {
    mark(port, "cni-cluster").is_some_and(|marked| Some(marked.as_str()) != cluster)
}

/// Whether `port` may be this node's, of this cluster: marked with
/// `node`, or with no node at all (marks lost with both tags and
/// description, or made before them, or a description that is a
/// digest). A controller that ignores list filters lists every node's
/// ports of a container ID; another node's is never ours.
pub fn on_node(port: &Port, node: &str, cluster: Option<&str>) -> bool {
    node_of(port).is_none_or(|marked| marked == tag_value(node)) && !foreign(port, cluster)
}

/// `network`'s ports of this plugin with `marks`, oldest first: those
/// tagged so, and those only described so (their tags lost), each once.
pub fn of_node(
    controller: &Controller,
    marks: &Marks,
) -> Result<Vec<(Port, Attachment)>, NeutronError> {
    let tags = marks.tags().join(",");
    let mut listed = controller.ports(&[("device_owner", OWNER), ("tags", &tags)])?;
    let described = marks.description();
    for port in controller.ports(&[("device_owner", OWNER), ("description", &described)])? {
        if !listed.iter().any(|p| p.id == port.id) {
            listed.push(port);
        }
    }
    Ok(ours(listed, marks.network)
        .into_iter()
        .filter(|(port, _)| marks.on(port))
        .collect())
}

/// The attachment `port` is for, if it is one of `network`'s ports of
/// this plugin.
pub fn attachment(port: &Port, network: &str) -> Option<Attachment> {
    if port.device_owner != OWNER {
        return None;
    }
    let rest = port.name.strip_prefix(network)?.strip_prefix('/')?;
    let (pool, ifname) = rest.split_once('/')?;
    Some(Attachment {
        container: port.device_id.clone(),
        ifname: ifname.to_owned(),
        pool: pool.to_owned(),
    })
}

/// `network`'s ports of this plugin among `listed`, with their
/// attachments, oldest first (as the controller dates them).
pub fn ours(listed: Vec<Port>, network: &str) -> Vec<(Port, Attachment)> {
    let mut ours: Vec<(Port, Attachment)> = listed
        .into_iter()
        .filter_map(|p| attachment(&p, network).map(|a| (p, a)))
        .collect();
    ours.sort_by(|(a, _), (b, _)| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, owner: &str, tags: &[&str]) -> Port {
        Port {
            id: "p".into(),
            name: name.into(),
            network_id: "n".into(),
            device_id: "c1".into(),
            device_owner: owner.into(),
            description: String::new(),
            fixed_ips: vec![],
            tags: tags.iter().map(|t| t.to_string()).collect(),
            created_at: None,
            updated_at: None,
            revision_number: None,
        }
    }

    #[test]
    fn a_port_reads_back_as_its_attachment_only_if_it_is_ours_and_the_networks() {
        let tags = ["cni-node=n1", "cni-network=net"];
        let ours = port(&name("net", "tenant-a", "eth0"), OWNER, &tags);
        assert_eq!(
            attachment(&ours, "net"),
            Some(Attachment {
                container: "c1".into(),
                ifname: "eth0".into(),
                pool: "tenant-a".into()
            })
        );
        assert_eq!(node_of(&ours).as_deref(), Some("n1"));
        // Its tags lost, its description still says.
        let mut untagged = port(&name("net", "tenant-a", "eth0"), OWNER, &[]);
        assert_eq!(node_of(&untagged), None);
        let marks = Marks {
            node: "n2",
            network: "net",
            cluster: None,
        };
        untagged.description = marks.description();
        assert_eq!(node_of(&untagged).as_deref(), Some("n2"));
        assert_eq!(attachment(&ours, "ne"), None);
        assert_eq!(
            attachment(
                &port(&name("net", "a", "eth0"), "compute:nova", &tags),
                "net"
            ),
            None
        );
        // Another network's, and a name that does not read back.
        assert_eq!(
            attachment(&port(&name("other", "a", "eth0"), OWNER, &tags), "net"),
            None
        );
        assert_eq!(attachment(&port("net-a-eth0", OWNER, &tags), "net"), None);
    }

    #[test]
    fn marks_read_back_whatever_the_names_and_always_fit() {
        let spaced = Marks {
            node: "rack 7 % node",
            network: "net",
            cluster: Some("east one"),
        };
        let mut p = port(&name("net", "a", "eth0"), OWNER, &[]);
        p.description = spaced.description();
        assert_eq!(
            p.description,
            "ipam-da-neutron cni-node=rack%207%20%25%20node cni-network=net cni-cluster=east%20one"
        );
        assert_eq!(node_of(&p).as_deref(), Some("rack 7 % node"));
        assert!(spaced.on(&p) && on_node(&p, "rack 7 % node", Some("east one")));
        // Names as long as a tag takes: the description is a digest, which
        // selects the same port again, and only its node is not read back.
        let long = "n".repeat(200);
        let marks = Marks {
            node: &long,
            network: &long,
            cluster: Some(&long),
        };
        let described = marks.description();
        assert!(described.len() <= FIELD_LIMIT, "{described}");
        assert!(described.starts_with("ipam-da-neutron marks-sha256="));
        let other = Marks { node: "m", ..marks };
        assert_ne!(other.description(), described);
        p.description = described;
        assert!(marks.on(&p) && !other.on(&p));
        assert_eq!(node_of(&p), None);
        assert!(marks.tags().iter().all(|t| t.len() <= FIELD_LIMIT));
    }

    #[test]
    fn another_clusters_port_is_never_ours_and_an_unmarked_one_may_be() {
        let tags = ["cni-node=n1", "cni-network=net", "cni-cluster=west"];
        let west = port(&name("net", "a", "eth0"), OWNER, &tags);
        let marks = |cluster| Marks {
            node: "n1",
            network: "net",
            cluster,
        };
        assert!(marks(Some("west")).on(&west));
        assert!(!marks(Some("east")).on(&west) && !marks(None).on(&west));
        assert!(foreign(&west, None) && foreign(&west, Some("east")));
        assert!(!on_node(&west, "n1", None) && on_node(&west, "n1", Some("west")));
        // Made before `cluster` was set: DEL and ADD may take it, GC and
        // `release` (which select by every mark) do not.
        let before = port(&name("net", "a", "eth0"), OWNER, &tags[..2]);
        assert!(!foreign(&before, Some("west")) && on_node(&before, "n1", Some("west")));
        assert!(!marks(Some("west")).on(&before) && marks(None).on(&before));
    }

    #[test]
    fn any_node_name_marks_a_port_a_long_one_or_one_with_a_comma_by_its_digest() {
        let long = "n".repeat(253);
        for node in [long.as_str(), "rack,7", "n1"] {
            let marks = Marks {
                node,
                network: "net",
                cluster: None,
            };
            let tags = marks.tags();
            assert!(
                tags.iter()
                    .all(|t| t.len() <= FIELD_LIMIT && !t.contains(',')),
                "{tags:?}"
            );
            let tagged = Port {
                tags: tags.clone(),
                ..port("net/default/eth0", OWNER, &[])
            };
            assert_eq!(node_of(&tagged).as_deref(), Some(tag_value(node).as_ref()));
            assert!(on_node(&tagged, node, None) && marks.on(&tagged));
            assert!(!on_node(&tagged, "other", None));
            // Its tags lost, its description says the same node.
            let untagged = Port {
                description: marks.description(),
                ..port("net/default/eth0", OWNER, &[])
            };
            if !marks.description().contains("marks-sha256=") {
                assert_eq!(node_of(&untagged), node_of(&tagged));
            }
        }
        assert_eq!(tag_value("n1"), "n1");
        assert!(tag_value(&long).starts_with("sha256:"));
    }
}
