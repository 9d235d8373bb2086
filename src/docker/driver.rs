//! libnetwork's remote IPAM API answered by the CNI stack: a pool is a
//! (network, subnet, ip-range) Docker holds; every RequestAddress is an
//! ADD through the stack under a container ID the driver makes, its
//! result kept in agent mode's state; ReleaseAddress is the DEL of the
//! attachment holding the address, and ReleasePool releases what is left.
//! What a request leaves to undo (an ADD cut short, a release that
//! failed) is undone at the network's next request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{json, Value};
use tracing::{info, warn};

use super::error::DockerError;
use super::leftovers::{self, Leftovers};
use super::networks::{self, Network};
use super::pool_ids::{PoolId, PoolRequests};
use crate::addr::{Addr, Family, Subnet};
use crate::cni::Reportable;
use crate::delegated::agent::state::{self, Attachment};
use crate::delegated::agent::{self, Request, Setup};
use crate::delegated::config::Config;
use crate::delegated::DelegatedError;
use crate::dir::DirError;
use crate::http::Status;

/// The interface name of every attachment the driver makes.
const IFNAME: &str = "eth0";

/// The namespace delegates are given: the driver's own, the host's.
const HOST_NETNS: &str = "/proc/self/ns/net";

/// The option that says what an address Docker asks for is for.
const ADDRESS_TYPE: &str = "RequestAddressType";

/// Its value when Docker asks for a network's gateway.
const GATEWAY: &str = "com.docker.network.gateway";

/// An ADD made for a request: the network's attachments, still locked;
/// the attachment made and kept, and recorded as left to undo; its result;
/// the address that answers Docker; and the stdin the stack was given.
struct Added {
    state: state::Network,
    attachment: Attachment,
    result: Vec<u8>,
    given: Addr,
    stdin: Vec<u8>,
}

impl Added {
    /// Keeps it for Docker: no longer left to undo. Its address.
    fn keep(self) -> Result<Addr, DockerError> {
        Leftovers::forget(&self.state, &self.attachment.id)?;
        Ok(self.given)
    }
}

/// The driver: where the CNI networks' configurations are.
pub struct Driver {
    config: PathBuf,
}

/// The answer to one request.
pub struct Answer {
    pub status: Status,
    pub body: Vec<u8>,
    /// What undoes the request if Docker never learns of the answer.
    pub undo: Option<Undo>,
}

/// A pool or an address given, to release if Docker never gets it.
pub enum Undo {
    Pool(String),
    Address { pool: String, address: String },
}

/// A request's body: a JSON object (or nothing, for the handshake).
struct Body(serde_json::Map<String, Value>);

impl Body {
    fn parse(bytes: &[u8]) -> Result<Body, DockerError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| DockerError::Request(format!("the request is not JSON: {e}")))?;
        match value {
            Value::Object(members) => Ok(Body(members)),
            other => Err(DockerError::Request(format!(
                "the request is not a JSON object: {other}"
            ))),
        }
    }

    /// A string member; missing or null is empty.
    fn text(&self, key: &str) -> Result<&str, DockerError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(text)) => Ok(text),
            Some(other) => Err(DockerError::Request(format!(
                "\"{key}\" must be a string, not {other}"
            ))),
        }
    }

    /// `Options`, a map of strings; Docker sends null for none.
    fn options(&self) -> Result<HashMap<String, String>, DockerError> {
        match self.0.get("Options") {
            None | Some(Value::Null) => Ok(HashMap::new()),
            Some(Value::Object(options)) => options
                .iter()
                .map(|(key, value)| match value {
                    Value::String(text) => Ok((key.clone(), text.clone())),
                    other => Err(DockerError::Request(format!(
                        "option {key:?} must be a string, not {other}"
                    ))),
                })
                .collect(),
            Some(other) => Err(DockerError::Request(format!(
                "\"Options\" must be an object, not {other}"
            ))),
        }
    }
}

impl Driver {
    /// The driver for the configurations at `config` (a file or a directory).
    pub fn new(config: PathBuf) -> Driver {
        Driver { config }
    }

    /// The answer to a POST of `body` to `path`. A request that fails is
    /// answered 200 with `{"Error": …}`, the key Docker reads, carrying
    /// the CNI code and message.
    pub fn answer(&self, path: &str, body: &[u8]) -> Answer {
        let mut undo = None;
        let outcome =
            match path {
                "/Plugin.Activate" => Ok(json!({"Implements": ["IpamDriver"]})),
                "/IpamDriver.GetCapabilities" => Ok(json!({
                    "RequiresMACAddress": false,
                    // What Docker asked for before it restarted is kept here:
                    // it need not ask again.
                    "RequiresRequestReplay": false,
                })),
                "/IpamDriver.GetDefaultAddressSpaces" => Ok(json!({
                    "LocalDefaultAddressSpace": "local",
                    "GlobalDefaultAddressSpace": "global",
                })),
                "/IpamDriver.RequestPool" => Body::parse(body)
                    .and_then(|r| self.request_pool(&r))
                    .map(|(value, pool)| {
                        undo = Some(Undo::Pool(pool));
                        value
                    }),
                "/IpamDriver.ReleasePool" => Body::parse(body)
                    .and_then(|r| self.release_pool(r.text("PoolID")?))
                    .map(|()| json!({})),
                "/IpamDriver.RequestAddress" => Body::parse(body)
                    .and_then(|r| self.request_address(&r))
                    .map(|(value, (pool, address))| {
                        undo = Some(Undo::Address { pool, address });
                        value
                    }),
                "/IpamDriver.ReleaseAddress" => Body::parse(body)
                    .and_then(|r| self.release_address(r.text("PoolID")?, r.text("Address")?))
                    .map(|()| json!({})),
                _ => {
                    return Answer {
                        status: Status::NotFound,
                        body: json!({"Err": format!("{path} is not part of the IPAM driver API")})
                            .to_string()
                            .into_bytes(),
                        undo: None,
                    }
                }
            };
        let body = match outcome {
            Ok(value) => value,
            Err(e) => {
                warn!("{path}: {}", message(&e));
                json!({"Error": message(&e)})
            }
        };
        Answer {
            status: Status::Ok,
            body: body.to_string().into_bytes(),
            undo,
        }
    }

    /// Releases a pool or an address Docker was never told of.
    pub fn undo(&self, undo: Undo) {
        let released = match &undo {
            Undo::Pool(pool) => {
                warn!("the answer giving pool {pool} could not be delivered: releasing it");
                self.release_pool(pool)
            }
            Undo::Address { pool, address } => {
                warn!("the answer giving {address} could not be delivered: releasing it");
                self.release_address(pool, address)
            }
        };
        if let Err(e) = released {
            warn!("could not release it: {}", message(&e));
        }
    }

    /// RequestPool: checks that the network can give addresses from the
    /// pool and counts one more request of it. Nothing is allocated.
    fn request_pool(&self, request: &Body) -> Result<(Value, String), DockerError> {
        let options = request.options()?;
        let (asked_pool, sub_pool) = (request.text("Pool")?, request.text("SubPool")?);
        let v6 = request.0.get("V6") == Some(&Value::Bool(true));
        if let Some(unknown) = options.keys().find(|key| *key != "network") {
            return Err(DockerError::Request(format!(
                "unknown IPAM option {unknown:?}: this driver takes --ipam-opt network=NAME"
            )));
        }
        let net = networks::find(&self.config, options.get("network").map(String::as_str))?;
        let subnet = if asked_pool.is_empty() {
            if !sub_pool.is_empty() {
                return Err(DockerError::Request(
                    "an --ip-range needs a --subnet".into(),
                ));
            }
            net.declared_subnet(if v6 { Family::V6 } else { Family::V4 })?
        } else {
            Subnet::parse(asked_pool)
                .map_err(|e| DockerError::Request(format!("--subnet {asked_pool}: {e}")))?
        };
        let range = match sub_pool {
            "" => None,
            text => {
                let range = Subnet::parse(text)
                    .map_err(|e| DockerError::Request(format!("--ip-range {text}: {e}")))?;
                if !subnet.covers(&range) {
                    return Err(DockerError::Request(format!(
                        "--ip-range {range} is not inside --subnet {subnet}"
                    )));
                }
                let (first, last) = range.host_bounds_in(&subnet);
                if first > last {
                    return Err(DockerError::Request(format!(
                        "--ip-range {range} holds no address a host of {subnet} may have"
                    )));
                }
                Some(range)
            }
        };
        let declared = net.subnets();
        if !net.takes("ipRanges") {
            if range.is_some() {
                return Err(DockerError::Request(format!(
                    "an --ip-range is given to the stack as the ipRanges capability, which network {:?}'s plugin does not take (\"capabilities\": {{\"ipRanges\": true}})",
                    net.name
                )));
            }
            if !declared.is_empty() && !declared.contains(&subnet) {
                return Err(DockerError::Request(format!(
                    "network {:?} declares {}, not {subnet}, and its plugin does not take the ipRanges capability through which the stack could be given it",
                    net.name,
                    networks::list(&declared)
                )));
            }
        }
        let pool = PoolId {
            network: net.name.clone(),
            subnet,
            range,
        };
        let state = lock(&net)?;
        settle(&net, &state);
        let mut requests = PoolRequests::read(&state)?;
        requests.add(&pool);
        let leftovers = sweep(&net, &state, &mut requests);
        requests.write(&state)?;
        for e in leftovers {
            warn!("{}", message(&e));
        }
        info!("pool {pool} requested");
        let answer = json!({"PoolID": pool.to_string(), "Pool": subnet.to_string(), "Data": {}});
        Ok((answer, pool.to_string()))
    }

    /// ReleasePool: one request less; after the last, DEL of every
    /// attachment of the pool still kept. One that fails stays kept, its
    /// pool recorded as released, and is tried again at the network's next
    /// RequestPool or ReleasePool.
    fn release_pool(&self, pool: &str) -> Result<(), DockerError> {
        let pool = PoolId::parse(pool)?;
        let net = networks::find(&self.config, Some(&pool.network))?;
        let state = lock(&net)?;
        settle(&net, &state);
        let mut requests = PoolRequests::read(&state)?;
        if !requests.holds(&pool) {
            warn!("pool {pool} is not held: releasing what is left of it");
        }
        requests.remove(&pool);
        let failures = sweep(&net, &state, &mut requests);
        requests.write(&state)?;
        DelegatedError::from_failures(failures)?;
        info!("pool {pool} released");
        Ok(())
    }

    /// RequestAddress: an ADD through the stack, with the address Docker
    /// asks for (if any) passed every way CNI IPAM plugins read one; the
    /// result is kept, or given back if it does not hold the address the
    /// pool needs. Docker's request for the gateway is answered with the
    /// gateway the stack gives (see [`Driver::gateway`]).
    fn request_address(&self, request: &Body) -> Result<(Value, (String, String)), DockerError> {
        let pool = PoolId::parse(request.text("PoolID")?)?;
        let options = request.options()?;
        let unavailable = |address: &str, why: String| DockerError::AddressUnavailable {
            address: address.to_owned(),
            pool: pool.to_string(),
            why,
        };
        let asked = match request.text("Address")? {
            "" => None,
            text => {
                let ip: IpAddr = text
                    .parse()
                    .map_err(|_| unavailable(text, "it is not an address".into()))?;
                let addr = Addr::new(ip);
                if !pool.subnet.contains(addr) {
                    return Err(unavailable(text, "it is outside the pool's subnet".into()));
                }
                Some(addr)
            }
        };
        let net = networks::find(&self.config, Some(&pool.network))?;
        let for_gateway = options.get(ADDRESS_TYPE).map(String::as_str) == Some(GATEWAY);
        let given = if for_gateway {
            self.gateway(&net, &pool, asked)?
        } else {
            let added = self.add(&net, &pool, asked)?;
            info!(
                "{} given from pool {pool} to {}",
                added.given, added.attachment.id
            );
            added.keep()?
        };
        let answer = json!({"Address": format!("{given}/{}", pool.subnet.prefix), "Data": {}});
        Ok((answer, (pool.to_string(), given.to_string())))
    }

    /// Docker's gateway request. The stack's gateway for the pool is the
    /// truth, so that Docker's bridge and every CNI result agree: it is
    /// read from the result of an ADD made to learn it, whose address then
    /// goes back, and a `--gateway` naming another address is refused. A
    /// stack whose results name no gateway gives the gateway as it gives
    /// any address, held for as long as Docker keeps it.
    fn gateway(
        &self,
        net: &Network,
        pool: &PoolId,
        asked: Option<Addr>,
    ) -> Result<Addr, DockerError> {
        let probe = self.add(net, pool, None)?;
        let Some(gateway) = gateway_of(&probe.result, pool) else {
            if asked.is_none() {
                info!(
                    "{} given from pool {pool} to {} as the gateway (the stack names none)",
                    probe.given, probe.attachment.id
                );
                return probe.keep();
            }
            give_back(net, pool, probe);
            let added = self.add(net, pool, asked)?;
            info!(
                "{} given from pool {pool} to {} as the gateway (the stack names none)",
                added.given, added.attachment.id
            );
            return added.keep();
        };
        give_back(net, pool, probe);
        match asked {
            Some(other) if other != gateway => Err(DockerError::AddressUnavailable {
                address: other.to_string(),
                pool: pool.to_string(),
                why: format!(
                    "the stack gives the pool the gateway {gateway}, which every container's result names: give --gateway {gateway}, or none"
                ),
            }),
            _ => {
                info!("{gateway}, the stack's gateway, is pool {pool}'s");
                Ok(gateway)
            }
        }
    }

    /// An ADD through the stack for `pool`, asking for `asked`: the
    /// attachment made and kept, still recorded as left to undo until the
    /// caller keeps it ([`Added::keep`]) or gives it back, and the address
    /// of its result that answers Docker. A result that does not hold that
    /// address is given back.
    fn add(&self, net: &Network, pool: &PoolId, asked: Option<Addr>) -> Result<Added, DockerError> {
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

    /// ReleaseAddress: the DEL of the attachment that holds the address
    /// (with its kept result as prevResult), then the attachment
    /// forgotten. An address no attachment of the pool holds is released
    /// already.
    fn release_address(&self, pool: &str, address: &str) -> Result<(), DockerError> {
        let pool = PoolId::parse(pool)?;
        let ip: IpAddr = address
            .parse()
            .map_err(|_| DockerError::Request(format!("{address:?} is not an address")))?;
        let address = Addr::new(ip);
        let net = networks::find(&self.config, Some(&pool.network))?;
        let state = lock(&net)?;
        settle(&net, &state);
        let prefix = pool.attachment_prefix();
        for attachment in state.attachments()? {
            if !attachment.id.starts_with(&prefix) {
                continue;
            }
            let Some(kept) = state.read(&attachment)? else {
                continue;
            };
            if addresses(&kept).contains(&address) {
                let stdin = net.stdin(runtime_config(&net, &pool, None));
                if let Err(e) = release(&net, &stdin, &state, &attachment, Some(&kept)) {
                    // Docker forgets the address whatever the answer:
                    // released later, not at `docker network rm` only.
                    Leftovers::add(&state, &attachment.id, &pool)?;
                    warn!(
                        "{address} of pool {pool} is left to release again: {}",
                        message(&e)
                    );
                    return Err(e.into());
                }
                info!("{address} released from pool {pool} by {}", attachment.id);
                return Ok(());
            }
        }
        // The stack's gateway, which no attachment holds, comes here at
        // `docker network rm`.
        info!("{address} is held by no attachment of pool {pool}: nothing to release");
        Ok(())
    }
}

/// What Docker is told when a request fails: the error's one-line summary
/// (naming a delegate that failed), its CNI code, and its details.
fn message(e: &impl Reportable) -> String {
    let details = e.details();
    let mut text = format!("{} (CNI error code {})", e.summary(), e.code());
    if !details.is_empty() {
        text.push_str(": ");
        text.push_str(&details.replace('\n', " "));
    }
    text
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
fn lock(net: &Network) -> Result<state::Network, DelegatedError> {
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
fn runtime_config(net: &Network, pool: &PoolId, asked: Option<Addr>) -> Vec<(&'static str, Value)> {
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
fn sweep(
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
fn release(
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
fn give_back(net: &Network, pool: &PoolId, added: Added) {
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
fn gateway_of(result: &[u8], pool: &PoolId) -> Option<Addr> {
    let result: Value = serde_json::from_slice(result).ok()?;
    result["ips"].as_array()?.iter().find_map(|ip| {
        let address: IpAddr = ip["address"].as_str()?.split('/').next()?.parse().ok()?;
        let gateway: IpAddr = ip["gateway"].as_str()?.parse().ok()?;
        let (address, gateway) = (Addr::new(address), Addr::new(gateway));
        (pool.subnet.contains(address) && pool.subnet.contains(gateway)).then_some(gateway)
    })
}

/// The addresses of a result's `ips`.
fn addresses(result: &[u8]) -> Vec<Addr> {
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
    fn failures_reach_docker_with_their_code_and_details() {
        let e = DockerError::from(DelegatedError::Failed {
            delegate: "ipam-da-x".into(),
            command: crate::cni::Command::Add,
            failure: crate::delegated::Failure::Reported {
                code: 11,
                msg: "pool busy".into(),
                details: "line one\nline two".into(),
            },
        });
        assert_eq!(
            message(&e),
            "ipam-da-x (ADD): failed with code 11: pool busy (CNI error code 11): line one line two"
        );
    }

    #[test]
    fn the_api_answers_its_handshake_and_refuses_what_it_does_not_have() {
        let driver = Driver::new("/nonexistent".into());
        let activate = driver.answer("/Plugin.Activate", b"");
        assert_eq!(activate.body, br#"{"Implements":["IpamDriver"]}"#);
        let caps = driver.answer("/IpamDriver.GetCapabilities", b"null");
        let caps: Value = serde_json::from_slice(&caps.body).unwrap();
        assert_eq!(caps["RequiresRequestReplay"], false);
        let spaces = driver.answer("/IpamDriver.GetDefaultAddressSpaces", b"");
        assert_eq!(spaces.status, Status::Ok);
        assert_eq!(
            driver.answer("/NetworkDriver.CreateNetwork", b"{}").status,
            Status::NotFound
        );
        // Errors are a 200 with "Error", which is what Docker reads.
        for (path, body) in [
            ("/IpamDriver.RequestPool", &b"not json"[..]),
            (
                "/IpamDriver.RequestPool",
                br#"{"AddressSpace":"local","Options":{"colour":"red"}}"#,
            ),
            (
                "/IpamDriver.RequestPool",
                br#"{"AddressSpace":"local","Options":null}"#,
            ),
            (
                "/IpamDriver.RequestAddress",
                br#"{"PoolID":"junk","Address":"","Options":null}"#,
            ),
            (
                "/IpamDriver.ReleaseAddress",
                br#"{"PoolID":"n/10.1.0.0/16","Address":"x"}"#,
            ),
        ] {
            let answer = driver.answer(path, body);
            assert_eq!(answer.status, Status::Ok);
            assert!(answer.undo.is_none());
            let body: Value = serde_json::from_slice(&answer.body).unwrap();
            let error = body["Error"].as_str().unwrap();
            assert!(error.contains("(CNI error code "), "{path}: {error}");
        }
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
