//! Which ports are ours, and whose: each is owned by this plugin
//! (`device_owner`), made for a container (`device_id`), named for its
//! CNI network, pool and interface, and tagged with its node and its CNI
//! network, so that DEL, GC and the operator's verbs find exactly the
//! ports they may touch, even at a controller that ignores list filters.
//! The owner and the name alone say whose a port is; the tags let a
//! listing select by node and network, and GC touches no port without
//! this node's tag.

use super::api::Port;

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

/// The tag that says which node a port is on.
pub fn node_tag(node: &str) -> String {
    format!("cni-node={node}")
}

/// The tag that says which CNI network a port is for.
pub fn network_tag(network: &str) -> String {
    format!("cni-network={network}")
}

/// The node a port of ours is tagged with.
pub fn node_of(port: &Port) -> Option<&str> {
    port.tags.iter().find_map(|t| t.strip_prefix("cni-node="))
}

/// The tags every port of ours carries.
pub fn tags(node: &str, network: &str) -> Vec<String> {
    vec![node_tag(node), network_tag(network)]
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
            device_id: "c1".into(),
            device_owner: owner.into(),
            fixed_ips: vec![],
            tags: tags.iter().map(|t| t.to_string()).collect(),
            created_at: None,
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
        assert_eq!(node_of(&ours), Some("n1"));
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
}
