//! The attachments the Docker driver makes: ADDs through the stack under
//! container IDs of its own, each recorded as left to undo until it is
//! kept in agent mode's state; their DELs, one by one or a released
//! pool's all at once; what a request left to undo, undone; and what
//! their results say (the address that answers Docker, the gateway).

use std::net::IpAddr;

use serde_json::{json, Value};
use tracing::warn;

use super::error::{message, DockerError};
use super::leftovers::{self, Leftovers};
use super::networks::Network;
use super::pool_ids::{PoolId, PoolRequests};
use crate::addr::Addr;
use crate::delegated::agent::state::{self, Attachment};
use crate::delegated::agent::{self, Request, Setup};
use crate::delegated::config::Config;
use crate::delegated::DelegatedError;
use crate::dir::DirError;

/// The interface name of every attachment the driver makes.
const IFNAME: &str = "eth0";

/// The namespace delegates are given: the driver's own, the host's.
const HOST_NETNS: &str = "/proc/self/ns/net";

/// An ADD made for a request: the network's attachments, still locked;
/// the attachment made and kept, and recorded as left to undo; its result;
/// the address that answers Docker; and the stdin the stack was given.
pub(super) struct Added {
    pub(super) state: state::Network,
    pub(super) attachment: Attachment,
    pub(super) result: Vec<u8>,
    pub(super) given: Addr,
    pub(super) stdin: Vec<u8>,
}

impl Added {
    /// Keeps it for Docker: no longer left to undo. Its address.
    pub(super) fn keep(self) -> Result<Addr, DockerError> {
        Leftovers::forget(&self.state, &self.attachment.id)?;
        Ok(self.given)
    }
}

/// An ADD through the stack for `pool`, asking for `asked`: the
/// attachment made and kept, still recorded as left to undo until the
/// caller keeps it ([`Added::keep`]) or gives it back, and the address
/// of its result that answers Docker. A result that does not hold that
/// address is given back.
pub(super) fn add(net: &Network, pool: &PoolId, asked: Option<Addr>) -> Result<Added, DockerError> {
    let stdin = net.stdin(runtime_config(net, pool, asked));
    let id = format!("{}{}", pool.attachment_prefix(), random_hex()?);
    let setup = Setup::new(&request_for(net, &id, asked), &stdin)?;
    let state = setup.network()?;
    if !PoolRequests::read(&state)?.holds(pool) {
        return Err(DockerError::Request(format!(
            "pool {pool} was not requested from this driver, or its state (under {}) was lost",
            agent::state_root(&setup.config).display()
        )));
    }
    settle(net, &state);
    let delegates = setup.find_all()?;
    // Recorded first: a driver killed before it keeps the result
    // leaves this to undo at its start.
    Leftovers::add(&state, &id, pool)?;
    let added = setup.chain(&setup.config.net).add(&delegates);
    let attachment = Attachment {
        id,
        ifname: IFNAME.into(),
    };
    let result = match added {
        Ok(result) => result,
        // Undone whole by the stack, or left to undo again later.
        Err(e) => {
            if !matches!(e, DelegatedError::RollbackFailed { .. }) {
                Leftovers::forget(&state, &attachment.id)?;
            }
            return Err(e.into());
        }
    };
    // Kept before it is judged: if giving it back fails, it stays
    // kept, and left to undo.
    let result = setup.keep(&state, &attachment, result)?;
    let given = match address_for(&result, pool, asked) {
        Ok(given) => given,
        Err(e) => {
            match release(net, &stdin, &state, &attachment, Some(&result)) {
                Ok(()) => Leftovers::forget(&state, &attachment.id)?,
                Err(undo) => warn!(
                    "could not give back what the stack gave, left to undo: {}",
                    message(&undo)
                ),
            }
            return Err(e);
        }
    };
    Ok(Added {
        state,
        attachment,
        result,
        given,
        stdin,
    })
}

/// Undoes what requests of network `net` left to undo (`state` its
/// attachments, locked); what still fails is said and kept.
pub(super) fn settle(net: &Network, state: &state::Network) {
    let undone = leftovers::undo(net, state, |net, pool, id| {
        let attachment = Attachment {
            id: id.to_owned(),
            ifname: IFNAME.into(),
        };
        let kept = state.read(&attachment)?;
        let stdin = net.stdin(runtime_config(net, pool, None));
        release(net, &stdin, state, &attachment, kept.as_deref())
    });
    if let Err(e) = undone {
        warn!("{}", message(&e));
    }
}

/// The network's attachments, locked, if it has a state directory: what
/// the driver's timer looks at, making nothing.
pub(super) fn lock_existing(net: &Network) -> Result<Option<state::Network>, DelegatedError> {
    let stdin = net.stdin(Vec::new());
    let config = Config::parse(&stdin)?;
    if !agent::state_root(&config).join(&config.net.name).is_dir() {
        return Ok(None);
    }
    state::Network::lock(&agent::state_root(&config), &config.net.name).map(Some)
}

/// The network's attachments, locked.
pub(super) fn lock(net: &Network) -> Result<state::Network, DelegatedError> {
    let stdin = net.stdin(Vec::new());
    let config = Config::parse(&stdin)?;
    state::Network::lock(&agent::state_root(&config), &config.net.name)
}

/// The attachment `id` of the driver, as agent mode runs it: in the
/// host's namespace, asking for `asked` through CNI_ARGS, and for its
/// records to be synced to the disk (`DURABLE=true`): Docker keeps a
/// network's gateway and aux addresses across reboots, and a record a
/// power loss undid would give one to another container.
fn request_for(net: &Network, id: &str, asked: Option<Addr>) -> Request {
    let mut args = String::from("IgnoreUnknown=1;DURABLE=true");
    if let Some(addr) = asked {
        args.push_str(&format!(";IP={addr}"));
    }
    Request {
        config: net.file.clone(),
        network: None,
        id: id.to_owned(),
        ifname: IFNAME.into(),
        netns: HOST_NETNS.into(),
        args: Some(args),
    }
}

/// `runtimeConfig` as libcni passes it, for the capabilities the plugin
/// takes: `ipRanges` when Docker's pool is not the configuration's own
/// (another subnet, or an ip-range: the range's bounds, unless an address
/// is asked for, which Docker allows anywhere in the subnet), `ips` with
/// the address asked for.
pub(super) fn runtime_config(
    net: &Network,
    pool: &PoolId,
    asked: Option<Addr>,
) -> Vec<(&'static str, Value)> {
    let mut set = Vec::new();
    if net.takes("ipRanges") && (pool.range.is_some() || !net.subnets().contains(&pool.subnet)) {
        let mut range = json!({"subnet": pool.subnet.to_string()});
        if let Some(part) = pool.range.as_ref().filter(|_| asked.is_none()) {
            let (start, end) = part.host_bounds_in(&pool.subnet);
            range["rangeStart"] = start.to_string().into();
            range["rangeEnd"] = end.to_string().into();
        }
        set.push(("ipRanges", json!([[range]])));
    }
    if let Some(addr) = asked.filter(|_| net.takes("ips")) {
        set.push(("ips", json!([format!("{addr}/{}", pool.subnet.prefix)])));
    }
    set
}

/// Releases what is left of every pool Docker no longer holds (DEL of
/// each of its attachments still kept), forgetting each pool once nothing
/// of it is left. Returns the failures.
pub(super) fn sweep(
    net: &Network,
    state: &state::Network,
    requests: &mut PoolRequests,
) -> Vec<DelegatedError> {
    let mut failures = Vec::new();
    let attachments = match state.attachments() {
        Ok(attachments) => attachments,
        Err(e) => return vec![e],
    };
    for released in requests.released() {
        let Ok(pool) = PoolId::parse(&released) else {
            requests.forget(&released);
            continue;
        };
        let stdin = net.stdin(runtime_config(net, &pool, None));
        let prefix = pool.attachment_prefix();
        let before = failures.len();
        for attachment in attachments.iter().filter(|a| a.id.starts_with(&prefix)) {
            let released = state
                .read(attachment)
                .and_then(|kept| release(net, &stdin, state, attachment, kept.as_deref()));
            if let Err(e) = released {
                failures.push(e);
            }
        }
        if failures.len() == before {
            requests.forget(&released);
        }
    }
    failures
}

/// DEL of `attachment` (with `kept` as prevResult), then forgotten.
pub(super) fn release(
    net: &Network,
    stdin: &[u8],
    state: &state::Network,
    attachment: &Attachment,
    kept: Option<&[u8]>,
) -> Result<(), DelegatedError> {
    let mut request = request_for(net, &attachment.id, None);
    request.ifname.clone_from(&attachment.ifname);
    Setup::new(&request, stdin)?.del(kept)?;
    state.remove(attachment)
}

/// Gives back the attachment `added` made (DEL, then forgotten), which
/// Docker will never hear of; if that fails, it stays left to undo at
/// the network's next request (as it does if the driver dies first).
pub(super) fn give_back(net: &Network, pool: &PoolId, added: Added) {
    let Added {
        state,
        attachment,
        result,
        stdin,
        ..
    } = added;
    let undone = release(net, &stdin, &state, &attachment, Some(&result))
        .map_err(DockerError::from)
        .and_then(|()| Leftovers::forget(&state, &attachment.id));
    if let Err(e) = undone {
        warn!(
            "could not give back {} of pool {pool}, left to undo: {}",
            attachment.id,
            message(&e)
        );
    }
}

/// The gateway `result` names for an address of `pool`'s subnet, if any.
pub(super) fn gateway_of(result: &[u8], pool: &PoolId) -> Option<Addr> {
    let result: Value = serde_json::from_slice(result).ok()?;
    result["ips"].as_array()?.iter().find_map(|ip| {
        let address: IpAddr = ip["address"].as_str()?.split('/').next()?.parse().ok()?;
        let gateway: IpAddr = ip["gateway"].as_str()?.parse().ok()?;
        let (address, gateway) = (Addr::new(address), Addr::new(gateway));
        (pool.subnet.contains(address) && pool.subnet.contains(gateway)).then_some(gateway)
    })
}

/// The addresses of a result's `ips`.
pub(super) fn addresses(result: &[u8]) -> Vec<Addr> {
    let result: Value = serde_json::from_slice(result).unwrap_or_default();
    result["ips"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .filter_map(|cidr| cidr.split('/').next()?.parse::<IpAddr>().ok())
        .map(Addr::new)
        .collect()
}

/// The address of `result` that answers the request: the one asked for,
/// or one inside the pool (and its ip-range).
fn address_for(result: &[u8], pool: &PoolId, asked: Option<Addr>) -> Result<Addr, DockerError> {
    let given = addresses(result);
    let listed = || {
        let texts: Vec<String> = given.iter().map(ToString::to_string).collect();
        if texts.is_empty() {
            "no address".to_owned()
        } else {
            texts.join(", ")
        }
    };
    if let Some(asked) = asked {
        return given.contains(&asked).then_some(asked).ok_or_else(|| {
            DockerError::AddressUnavailable {
                address: asked.to_string(),
                pool: pool.to_string(),
                why: format!("the stack gave {} instead", listed()),
            }
        });
    }
    let within = pool.range.as_ref().unwrap_or(&pool.subnet);
    given
        .iter()
        .copied()
        .find(|addr| within.contains(*addr))
        .ok_or_else(|| {
            DockerError::Request(format!(
                "the stack gave {}, outside pool {pool}: network {:?}'s delegates must give addresses from {within}",
                listed(),
                pool.network
            ))
        })
}

/// 16 random hex digits, for container IDs no one else makes.
fn random_hex() -> Result<String, DockerError> {
    crate::sys::random_hex()
        .map_err(|error| DirError::io(std::path::Path::new("getrandom(2)"), error).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Reportable;
    use crate::docker::networks;

    fn pool(text: &str) -> PoolId {
        PoolId::parse(text).unwrap()
    }

    fn a(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    const RESULT: &[u8] =
        br#"{"cniVersion":"1.0.0","ips":[{"address":"fd00::5/64"},{"address":"10.1.0.5/16","gateway":"10.1.0.1"}]}"#;

    #[test]
    fn the_answer_is_the_address_asked_for_or_one_in_the_pool() {
        let p = pool("n/10.1.0.0/16");
        assert_eq!(address_for(RESULT, &p, None).unwrap(), a("10.1.0.5"));
        assert_eq!(
            address_for(RESULT, &p, Some(a("10.1.0.5"))).unwrap(),
            a("10.1.0.5")
        );
        let e = address_for(RESULT, &p, Some(a("10.1.0.9"))).unwrap_err();
        assert_eq!(e.code(), crate::cni::code::ADDRESS_UNAVAILABLE);
        assert!(
            e.to_string()
                .contains("10.1.0.9 cannot be given from pool \"n/10.1.0.0/16\": the stack gave fd00::5, 10.1.0.5 instead"),
            "{e}"
        );
        let e = address_for(RESULT, &pool("n/10.1.0.0/16/10.1.2.0/24"), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("outside pool n/10.1.0.0/16/10.1.2.0/24"),
            "{e}"
        );
        let e = address_for(b"{}", &p, None).unwrap_err();
        assert!(e.to_string().contains("the stack gave no address"), "{e}");
    }

    #[test]
    fn the_gateway_is_the_one_the_result_names_in_the_pool() {
        assert_eq!(
            gateway_of(RESULT, &pool("n/10.1.0.0/16")),
            Some(a("10.1.0.1"))
        );
        // The IPv6 address names none; another subnet's gateway is not it.
        assert_eq!(gateway_of(RESULT, &pool("n/fd00::/64")), None);
        assert_eq!(
            gateway_of(RESULT, &pool("n/10.1.0.0/24")),
            Some(a("10.1.0.1"))
        );
        assert_eq!(gateway_of(RESULT, &pool("n/10.2.0.0/16")), None);
        let elsewhere = br#"{"ips":[{"address":"10.1.0.5/16","gateway":"10.9.0.1"}]}"#;
        assert_eq!(gateway_of(elsewhere, &pool("n/10.1.0.0/16")), None);
    }

    #[test]
    fn runtime_config_gives_the_stack_a_pool_it_does_not_declare() {
        let net = |capabilities: &str| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("n.conflist");
            std::fs::write(
                &file,
                format!(
                    r#"{{"cniVersion":"1.0.0","name":"n","plugins":[{{"type":"bridge","capabilities":{capabilities},"ipam":{{"type":"ipam-delegated","delegates":["host-local"],"ranges":[[{{"subnet":"10.1.0.0/16"}}]]}}}}]}}"#
                ),
            )
            .unwrap();
            networks::find(&file, None).unwrap()
        };
        let both = net(r#"{"ipRanges":true,"ips":true}"#);
        assert!(runtime_config(&both, &pool("n/10.1.0.0/16"), None).is_empty());
        let ranged = pool("n/10.1.0.0/16/10.1.0.0/24");
        let bounds = json!([[{"subnet": "10.1.0.0/16", "rangeStart": "10.1.0.1", "rangeEnd": "10.1.0.255"}]]);
        assert_eq!(runtime_config(&both, &ranged, None), [("ipRanges", bounds)]);
        // An address asked for may be outside the ip-range, as Docker allows.
        assert_eq!(
            runtime_config(&both, &ranged, Some(a("10.1.7.7"))),
            [
                ("ipRanges", json!([[{"subnet": "10.1.0.0/16"}]])),
                ("ips", json!(["10.1.7.7/16"])),
            ]
        );
        assert_eq!(
            runtime_config(&both, &pool("n/10.7.0.0/24"), None),
            [("ipRanges", json!([[{"subnet": "10.7.0.0/24"}]]))]
        );
        let none = net("{}");
        assert!(runtime_config(&none, &pool("n/10.7.0.0/24"), Some(a("10.7.0.7"))).is_empty());
        assert_eq!(
            request_for(&none, "docker-x", Some(a("10.7.0.7")))
                .args
                .as_deref(),
            Some("IgnoreUnknown=1;DURABLE=true;IP=10.7.0.7")
        );
        assert_eq!(
            request_for(&none, "docker-x", None).args.as_deref(),
            Some("IgnoreUnknown=1;DURABLE=true")
        );
    }

    #[test]
    fn container_ids_are_random() {
        let (x, y) = (random_hex().unwrap(), random_hex().unwrap());
        assert_ne!(x, y);
        assert_eq!(x.len(), 16);
    }
}
