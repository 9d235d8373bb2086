//! A listing of ports, read page by page where the controller pages
//! (Neutron's `pagination_max_limit`), each page within the one deadline,
//! and bounded whatever the controller's links say: a port left off a
//! listing is one GC would never give back, so a link this client cannot
//! follow, a loop, or a listing past the caps is an error, never an end.

use std::collections::HashSet;

use super::{encode, wire, Controller, Port};
use crate::da_neutron::error::NeutronError;

/// The most pages one listing reads, and the most ports it keeps and
/// bytes of their text: with [`super::ANSWERS`] and the caps on each list of an
/// answer, a bound on what a listing holds, whatever the controller's
/// links say. A listing keeps only the ports its filters select, as a
/// controller that ignores them (Mizar-MP's) lists every port it has;
/// `show` keeps every node's: about 45,000 ports of the plugin's, of
/// some 700 bytes each.
const MAX_PAGES: usize = 1024;
const MAX_PORTS: usize = 65_536;
const MAX_KEPT_BYTES: usize = 32 << 20;

impl Controller {
    /// The ports the `filters` select, as the controller lists them. A
    /// controller that ignores filters (Mizar-MP's) lists more: callers
    /// select again from what comes.
    pub fn ports(&self, filters: &[(&str, &str)]) -> Result<Vec<Port>, NeutronError> {
        let query: Vec<String> = filters
            .iter()
            .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
            .collect();
        let mut path = match query.is_empty() {
            true => "/ports".to_owned(),
            false => format!("/ports?{}", query.join("&")),
        };
        let call = "listing ports";
        let mut ports = Vec::new();
        let mut kept = 0;
        let mut seen = HashSet::new();
        // Page by page where the controller pages (pagination_max_limit),
        // each within the one deadline: a port left off a listing is one
        // GC would never give back. A link already read is a loop, and
        // past the caps a controller that never ends.
        loop {
            seen.insert(path.clone());
            let answer = self.call("GET", &path, None, call)?;
            if answer.status != 200 {
                return Err(self.failure(call, &answer, "ports"));
            }
            let page: wire::PortPage = self.read(call, &answer)?;
            let count = page.ports.len();
            for port in page.ports.into_iter().filter(|p| selected(p, filters)) {
                kept += port.size();
                ports.push(port);
            }
            if ports.len() > MAX_PORTS || kept > MAX_KEPT_BYTES {
                return Err(NeutronError::Unreachable {
                    peer: self.peer(),
                    call: call.into(),
                    reason: format!(
                        "more than {MAX_PORTS} ports or {MAX_KEPT_BYTES} bytes of them in one listing"
                    ),
                });
            }
            let link = page
                .ports_links
                .into_iter()
                .filter(|link| link.rel.as_deref() == Some("next"))
                .find_map(|link| link.href);
            let next = match link {
                None => return Ok(ports),
                Some(_) if count == 0 => return Ok(ports),
                // Taken for the end, the rest of the list would be
                // missed without a word: a GC that never sees a port.
                Some(link) => self
                    .path_of(&link)
                    .ok_or_else(|| NeutronError::Unfollowable {
                        peer: self.peer(),
                        call: call.into(),
                        link,
                    })?,
            };
            if seen.contains(&next) {
                return Err(NeutronError::Unreachable {
                    peer: self.peer(),
                    call: call.into(),
                    reason: format!("its next page {next:?} was read already: its links loop"),
                });
            }
            if seen.len() == MAX_PAGES {
                return Err(NeutronError::Unreachable {
                    peer: self.peer(),
                    call: call.into(),
                    reason: format!("more than {MAX_PAGES} pages in one listing"),
                });
            }
            path = next;
        }
    }

    /// The path under the API's root of `href`, a link the controller
    /// gave (`http://HOST:PORT/v2.0/ports?…&marker=…`).
    fn path_of(&self, href: &str) -> Option<String> {
        let after_scheme = href.split_once("://")?.1;
        let path = &after_scheme[after_scheme.find('/')?..];
        path.strip_prefix(self.url.base.as_str()).map(String::from)
    }
}

/// Whether `port` is one that `filters` select, as the controller would:
/// a key it cannot judge selects every port.
fn selected(port: &Port, filters: &[(&str, &str)]) -> bool {
    filters.iter().all(|(key, value)| match *key {
        "device_id" => port.device_id == *value,
        "device_owner" => port.device_owner == *value,
        "description" => port.description == *value,
        // Every tag of the comma-separated list.
        "tags" => value
            .split(',')
            .all(|tag| port.tags.iter().any(|t| t == tag)),
        _ => true,
    })
}

impl Port {
    /// About how many bytes it takes, its text and its addresses.
    fn size(&self) -> usize {
        let text = [
            &self.id,
            &self.name,
            &self.network_id,
            &self.device_id,
            &self.device_owner,
            &self.description,
        ];
        std::mem::size_of::<Port>()
            + text.iter().map(|t| t.len()).sum::<usize>()
            + self.tags.iter().map(|t| t.len() + 24).sum::<usize>()
            + self
                .fixed_ips
                .iter()
                .map(|(s, _)| s.len() + 48)
                .sum::<usize>()
            + self.created_at.as_ref().map_or(0, String::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_keeps_what_its_filters_select_as_the_controller_would() {
        let port = Port {
            id: "p".into(),
            name: "n/default/eth0".into(),
            network_id: "net".into(),
            device_id: "c1".into(),
            device_owner: "cni:ipam-da-neutron".into(),
            description: "ipam-da-neutron cni-node=a cni-network=n".into(),
            fixed_ips: vec![],
            tags: vec!["cni-node=a".into(), "cni-network=n".into()],
            created_at: None,
            updated_at: None,
            revision_number: None,
        };
        for (filters, kept) in [
            (
                vec![("device_id", "c1"), ("device_owner", "cni:ipam-da-neutron")],
                true,
            ),
            (vec![("device_id", "c2")], false),
            (vec![("device_owner", "compute:nova")], false),
            (vec![("tags", "cni-node=a,cni-network=n")], true),
            (vec![("tags", "cni-node=a,cni-network=m")], false),
            (
                vec![("description", "ipam-da-neutron cni-node=a cni-network=n")],
                true,
            ),
            (
                vec![("description", "ipam-da-neutron cni-node=b cni-network=n")],
                false,
            ),
            (vec![("fields", "id")], true),
        ] {
            assert_eq!(selected(&port, &filters), kept, "{filters:?}");
        }
        assert!(port.size() > std::mem::size_of::<Port>() + 40);
    }
}
