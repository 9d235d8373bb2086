//! The controller's and Keystone's answers as they come over the wire:
//! typed structures read straight from a body, every member the plugin
//! does not use skipped unread, so that no tree of a whole answer is ever
//! built (a tree of a few MiB of JSON takes ten times that). Each becomes
//! one of the API's types ([`Port`], [`Subnet`], [`Free`]) here, where a
//! value the controller sends is checked before any request carries it.

use serde::{Deserialize, Serialize};

use super::api::{Free, Port, Subnet};
use super::settings::is_id;
use crate::addr::Addr;
use crate::http::capped::at_most;

/// The most ports one page may list.
const PORTS: usize = 65_536;
/// The most of each list inside a port or a subnet: Neutron allows 50
/// tags, and 20 host routes by default; a port has an address or two.
const INNER: usize = 256;
/// The most subnets one answer may list.
const SUBNETS: usize = 4096;

/// `{"port": {…}}`: one port, made or read.
#[derive(Deserialize)]
pub struct OnePort {
    pub port: Port,
}

/// `{"ports": […], "ports_links": […]}`: a page of a listing, each port
/// made a [`Port`] as it is read (no page of [`PortWire`]s beside them).
#[derive(Deserialize)]
pub struct PortPage {
    #[serde(deserialize_with = "at_most::<_, _, PORTS>")]
    pub ports: Vec<Port>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    pub ports_links: Vec<Link>,
}

/// A link of a paged listing (`rel` "next" or "previous").
#[derive(Deserialize)]
pub struct Link {
    #[serde(default)]
    pub rel: Option<String>,
    #[serde(default)]
    pub href: Option<String>,
}

/// A port as the API has it; what a port lacks is empty.
#[derive(Deserialize)]
pub struct PortWire {
    id: String,
    name: Option<String>,
    network_id: Option<String>,
    device_id: Option<String>,
    device_owner: Option<String>,
    description: Option<String>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    fixed_ips: Vec<FixedIp>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    tags: Vec<String>,
    created_at: Option<String>,
    updated_at: Option<String>,
    revision_number: Option<u64>,
}

#[derive(Deserialize)]
struct FixedIp {
    ip_address: Option<String>,
    subnet_id: Option<String>,
}

impl TryFrom<PortWire> for Port {
    type Error = String;

    /// The port, if its ID is one a path may carry: a controller's ID is
    /// sent back in `/ports/ID`, and a line break there would be a request
    /// of the controller's making.
    fn try_from(wire: PortWire) -> Result<Port, String> {
        if !is_id(&wire.id) {
            return Err(format!(
                "a port ID {:?} that is not one (letters, digits, '-', '_', '.'): refused",
                wire.id
            ));
        }
        // A subnet's ID is sent back in `/subnets/ID`, as a port's is.
        if let Some(bad) = wire
            .fixed_ips
            .iter()
            .map(|ip| ip.subnet_id.as_deref().unwrap_or_default())
            .find(|id| !is_id(id))
        {
            return Err(format!(
                "port {} with an address whose subnet ID {bad:?} is not one (letters, digits, '-', '_', '.'): refused",
                wire.id
            ));
        }
        let fixed_ips = wire
            .fixed_ips
            .into_iter()
            .filter_map(|ip| {
                let address = ip.ip_address?.parse().ok()?;
                Some((ip.subnet_id.unwrap_or_default(), Addr::new(address)))
            })
            .collect();
        Ok(Port {
            id: wire.id,
            name: wire.name.unwrap_or_default(),
            network_id: wire.network_id.unwrap_or_default(),
            device_id: wire.device_id.unwrap_or_default(),
            device_owner: wire.device_owner.unwrap_or_default(),
            description: wire.description.unwrap_or_default(),
            fixed_ips,
            tags: wire.tags,
            created_at: wire.created_at,
            updated_at: wire.updated_at,
            revision_number: wire.revision_number,
        })
    }
}

/// `{"subnet": {…}}`.
#[derive(Deserialize)]
pub struct OneSubnet {
    pub subnet: SubnetWire,
}

/// `{"subnets": […]}`.
#[derive(Deserialize)]
pub struct SubnetList {
    #[serde(deserialize_with = "at_most::<_, _, SUBNETS>")]
    pub subnets: Vec<SubnetWire>,
}

/// A subnet as the API has it, as far as a result needs it; also what
/// the cache keeps of it.
#[derive(Deserialize, Serialize)]
pub struct SubnetWire {
    id: Option<String>,
    network_id: Option<String>,
    cidr: Option<String>,
    gateway_ip: Option<String>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    allocation_pools: Vec<AllocationPool>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    host_routes: Vec<HostRoute>,
    #[serde(default, deserialize_with = "at_most::<_, _, INNER>")]
    dns_nameservers: Vec<String>,
}

/// A range of a subnet's; one that lacks an end is passed over.
#[derive(Deserialize, Serialize)]
struct AllocationPool {
    start: Option<String>,
    end: Option<String>,
}

/// A route of a subnet's; one that lacks a part is passed over.
#[derive(Deserialize, Serialize)]
struct HostRoute {
    destination: Option<String>,
    nexthop: Option<String>,
}

impl SubnetWire {
    /// The subnet; `None` if its `cidr` is not one.
    pub fn subnet(&self) -> Option<Subnet> {
        let cidr = crate::addr::Subnet::parse(self.cidr.as_deref()?).ok()?;
        let address = |text: &str| text.parse().ok().map(Addr::new);
        Some(Subnet {
            id: self.id.clone().unwrap_or_default(),
            network_id: self.network_id.clone().unwrap_or_default(),
            cidr,
            gateway: self.gateway_ip.as_deref().and_then(address),
            allocation_pools: self
                .allocation_pools
                .iter()
                .filter_map(|p| Some((address(p.start.as_deref()?)?, address(p.end.as_deref()?)?)))
                .collect(),
            host_routes: self
                .host_routes
                .iter()
                .filter_map(|r| Some((r.destination.clone()?, r.nexthop.clone()?)))
                .collect(),
            dns_nameservers: self.dns_nameservers.clone(),
        })
    }
}

/// `{"network_ip_availability": {"subnet_ip_availability": […]}}`.
#[derive(Deserialize)]
pub struct Availability {
    network_ip_availability: AvailabilityOf,
}

#[derive(Deserialize)]
struct AvailabilityOf {
    #[serde(default, deserialize_with = "at_most::<_, _, SUBNETS>")]
    subnet_ip_availability: Vec<SubnetAvailability>,
}

#[derive(Deserialize)]
struct SubnetAvailability {
    subnet_id: Option<String>,
    ip_version: Option<u64>,
    total_ips: Option<Count>,
    used_ips: Option<Count>,
}

/// An address count: an IPv6 subnet's passes u64's range, and comes as a
/// float then, exact enough to tell none from some.
#[derive(Deserialize)]
#[serde(untagged)]
enum Count {
    Whole(u64),
    Float(f64),
}

impl Count {
    fn value(count: Option<&Count>) -> u128 {
        match count {
            Some(Count::Whole(n)) => u128::from(*n),
            Some(Count::Float(f)) => *f as u128,
            None => 0,
        }
    }
}

impl Availability {
    /// How many addresses each subnet has left.
    pub fn free(self) -> Vec<Free> {
        let subnets = self.network_ip_availability.subnet_ip_availability;
        subnets
            .into_iter()
            .map(|s| Free {
                subnet_id: s.subnet_id.unwrap_or_default(),
                ip_version: s.ip_version.unwrap_or(4),
                free: Count::value(s.total_ips.as_ref())
                    .saturating_sub(Count::value(s.used_ips.as_ref())),
            })
            .collect()
    }
}

/// A failure's body: Neutron's `{"NeutronError": {"type", "message"}}`,
/// keystonemiddleware's `{"error": {"message"}}`, or `{"message"}`.
#[derive(Deserialize)]
pub struct Failure {
    #[serde(rename = "NeutronError")]
    neutron: Option<Described>,
    error: Option<Described>,
    message: Option<String>,
}

#[derive(Deserialize)]
struct Described {
    #[serde(rename = "type")]
    kind: Option<String>,
    message: Option<String>,
}

impl Failure {
    /// The controller's type for the failure ("" if none), and its
    /// message, if it gave one.
    pub fn said(self) -> (String, Option<String>) {
        let (kind, neutron_message) = match self.neutron {
            Some(Described { kind, message }) => (kind.unwrap_or_default(), message),
            None => (String::new(), None),
        };
        let message = neutron_message
            .or(self.error.and_then(|e| e.message))
            .or(self.message);
        (kind, message)
    }
}

/// Keystone's answer to a token request: `{"token": {"expires_at"}}` (the
/// token itself is its `X-Subject-Token` header).
#[derive(Deserialize)]
pub struct TokenIssued {
    token: Option<TokenBody>,
}

#[derive(Deserialize)]
struct TokenBody {
    expires_at: Option<String>,
}

impl TokenIssued {
    /// When the token expires (RFC 3339), if Keystone said.
    pub fn expires_at(self) -> Option<String> {
        self.token?.expires_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_read_with_what_it_lacks_empty_and_a_bad_id_refused() {
        let one: OnePort = serde_json::from_str(
            r#"{"port": {"id": "p-1", "name": null, "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.5"}, {"subnet_id": "s", "ip_address": "garbage"}], "tags": ["a"], "extra": {"deep": [1, 2, 3]}}}"#,
        )
        .unwrap();
        let port = one.port;
        assert_eq!(port.id, "p-1");
        assert_eq!(port.name, "");
        assert_eq!(port.fixed_ips.len(), 1);
        assert_eq!(port.tags, ["a"]);
        let text = serde_json::json!({"port": {"id": "p", "fixed_ips": [
            {"subnet_id": "../networks/n", "ip_address": "10.0.0.5"},
        ]}});
        let e = serde_json::from_str::<OnePort>(&text.to_string())
            .err()
            .unwrap();
        assert!(e.to_string().contains("subnet ID \"../networks/n\""), "{e}");
        for bad in ["p\r\nX-Injected: 1", "../ports", "", "p 1", "..", "."] {
            let text = serde_json::json!({"port": {"id": bad}}).to_string();
            let e = serde_json::from_str::<OnePort>(&text).err().unwrap();
            assert!(e.to_string().contains(&format!("port ID {bad:?}")), "{e}");
        }
    }

    #[test]
    fn free_addresses_are_counted_in_whole_numbers_or_floats() {
        let read: Availability = serde_json::from_str(
            r#"{"network_ip_availability": {"subnet_ip_availability": [
                {"subnet_id": "a", "ip_version": 4, "total_ips": 253, "used_ips": 250},
                {"subnet_id": "b", "ip_version": 6, "total_ips": 1.8446744073709552e19, "used_ips": 3}]}}"#,
        )
        .unwrap();
        let free = read.free();
        assert_eq!(free[0].free, 3);
        assert!(free[1].free > u128::from(u64::MAX / 2));
    }
}
