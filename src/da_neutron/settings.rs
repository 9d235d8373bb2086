//! ipam-da-neutron's settings, read from `ipam.neutron` (delegate
//! `ipam-dX-NAME` reads `ipam.NAME`): the controller's API and how to
//! reach it, the networks its pools are, and whose its ports are; all of
//! it read and checked whole before any call.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::error::NeutronError;
use super::ports::Marks;
use super::warm::Warm;
use crate::cni::{self, NetConf};
use crate::http::tls::TlsFiles;
use crate::node_name;
use crate::pools;

/// The keys of `ipam.neutron`.
const KEYS: [&str; 17] = [
    "url",
    "tokenFile",
    "auth",
    "network",
    "subnets",
    "pools",
    "default",
    "host",
    "tls",
    "timeout",
    "dataDir",
    "nodeNameFile",
    "gcGraceSeconds",
    "cluster",
    "bindHost",
    "securityGroups",
    "warm",
];

/// Where the subnet cache and the answered ports are kept unless
/// `ipam.neutron.dataDir` says.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/ipam-da-neutron";

/// How long a whole call may take unless `ipam.neutron.timeout` says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How old a port must be, unless `ipam.neutron.gcGraceSeconds` says,
/// before GC may delete it: a runtime lists the valid attachments before
/// it calls GC, and an ADD that finishes in between is not on the list
/// (as `ipam-da-pool`'s grace).
pub const DEFAULT_GC_GRACE_SECONDS: u64 = 60;

/// Whether a POST binds the port to this node unless `bindHost` says:
/// no. Nothing plugs the port, so nothing uses the binding, and ML2's
/// attempt to bind it made a POST 57 % slower on the tests' Neutron
/// (`cargo bench --bench neutron`, the median of three runs).
const DEFAULT_BIND_HOST: bool = false;

/// The security groups a port is put in unless `securityGroups` says:
/// none. Nothing applies them to the interface, and a port in the
/// project's default group is one more member whose address every
/// remote-group rule fans out to the agents (a POST without it took
/// 3 % less on the tests' Neutron, whose default group is empty).
const DEFAULT_SECURITY_GROUPS: Option<&[&str]> = Some(&[]);

/// The pool name a configuration with `network` (no `pools`) has.
pub const ONLY_POOL: &str = "default";

/// A pool: a network of the controller, and the subnets of it to take an
/// address from (none: one of each IP version the network has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub network: String,
    pub subnets: Vec<String>,
    /// The ports kept free for it on the node, if any (its own `warm`,
    /// else `ipam.neutron.warm`).
    pub warm: Option<Warm>,
}

/// `auth`: Keystone v3 application credentials, for a token of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppCredential {
    /// Keystone's v3 root, such as `http://127.0.0.1:5000/v3`.
    pub url: Url,
    /// The credential's ID (`applicationCredentialId`).
    pub id: String,
    /// The file that holds its secret (`secretFile`), read when a token
    /// is asked for.
    pub secret_file: PathBuf,
}

/// The controller's API root, split as a connection needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    /// A name or an address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// The path the API's own paths are appended to, without a trailing
    /// slash ("" for the root).
    pub base: String,
}

/// `ipam.neutron`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: Url,
    /// `tokenFile`: sent as `X-Auth-Token`, read at each call.
    pub token_file: Option<PathBuf>,
    /// `auth`: the token is Keystone's, for these credentials.
    pub auth: Option<AppCredential>,
    /// The pools by name: `network` (and `subnets`) make one, named
    /// [`ONLY_POOL`]; or `pools`.
    pub pools: BTreeMap<String, Pool>,
    /// The pool an ADD without `prevResult.pools` uses.
    pub default: String,
    /// The node the ports are bound to and tagged with (or why it cannot
    /// be told, for a teardown): [`Settings::node`].
    host: Result<String, String>,
    pub tls: Option<TlsFiles>,
    /// `timeout`: how long a whole call may take.
    pub timeout: Duration,
    /// `dataDir`: the subnet cache and the answered ports.
    pub data_dir: PathBuf,
    /// `gcGraceSeconds`.
    pub gc_grace: u64,
    /// `cluster`: the cluster whose ports these are, tagged on each, where
    /// several share one project of the controller.
    pub cluster: Option<String>,
    /// `bindHost`: whether a POST asks the controller to bind the port to
    /// this node (`binding:host_id`).
    pub bind_host: bool,
    /// `securityGroups`: the groups a POST puts the port in (none for an
    /// empty list); `None` leaves them to the controller (its project's
    /// default group).
    pub security_groups: Option<Vec<String>>,
}

impl Settings {
    /// Reads `ipam.neutron` from `net`; the error says which key is wrong
    /// (code 7).
    pub fn from_net(net: &NetConf) -> Result<Settings, NeutronError> {
        Settings::read(net, Need::Whole)
    }

    /// As [`Settings::from_net`], for a teardown (DEL, GC): the pools are
    /// not read, and the node's name is read only when asked for, so that
    /// a mistake in them never stops a teardown.
    pub fn for_teardown(net: &NetConf) -> Result<Settings, NeutronError> {
        Settings::read(net, Need::Teardown)
    }

    fn read(net: &NetConf, need: Need) -> Result<Settings, NeutronError> {
        let ipam = net
            .member("ipam")
            .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
            .unwrap_or(Value::Null);
        match ipam.get("neutron") {
            Some(Value::Object(object)) => Settings::parse(object, need),
            Some(_) => Err(invalid("\"ipam.neutron\" must be an object".into())),
            None => Err(invalid(
                "\"ipam.neutron\" is missing: it names the controller (\"url\") and the network (\"network\" or \"pools\")".into(),
            )),
        }
    }

    /// Reads the settings' object, as much as `need` says.
    pub fn parse(object: &Map<String, Value>, need: Need) -> Result<Settings, NeutronError> {
        // A misspelt key would leave what it meant to set unset, unnoticed.
        if let Some(key) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown key \"ipam.neutron.{key}\": \"ipam.neutron\" has {}",
                KEYS.map(|k| format!("{k:?}")).join(", ")
            )));
        }
        let text = |key: &str| text(object, key);
        let url = text("url")?.ok_or_else(|| {
            invalid("\"ipam.neutron.url\" is missing: the API's root, such as http://127.0.0.1:9696/v2.0".into())
        })?;
        let url =
            Url::parse(&url).map_err(|e| invalid(format!("\"ipam.neutron.url\" {url:?}: {e}")))?;
        let token_file = text("tokenFile")?.map(PathBuf::from);
        let auth = object.get("auth").map(AppCredential::parse).transpose()?;
        if token_file.is_some() && auth.is_some() {
            return Err(invalid(
                "\"ipam.neutron\" has both \"tokenFile\" and \"auth\": give a token, or the application credentials that get one".into(),
            ));
        }
        // A token or a secret in clear is anyone's on the way; on the
        // host's own loopback nothing is on the way.
        if (token_file.is_some() || auth.is_some()) && !url.tls && !url.is_loopback() {
            return Err(invalid(format!(
                "\"ipam.neutron.url\" {url} is plain HTTP: the token would cross the network in clear; give the API as https:// with \"tls\""
            )));
        }
        if let Some(auth) = auth.as_ref().filter(|a| !a.url.tls && !a.url.is_loopback()) {
            return Err(invalid(format!(
                "\"ipam.neutron.auth.url\" {} is plain HTTP: the secret would cross the network in clear; give Keystone as https:// with \"tls\"",
                auth.url
            )));
        }
        // A teardown needs no pool: a mistake in one must never stop it.
        let (pools, default) = match (pools_of(object).and_then(|p| warmed(object, p)), need) {
            (Ok(pools), _) => pools,
            (Err(_), Need::Teardown) => (BTreeMap::new(), String::new()),
            (Err(e), Need::Whole) => return Err(e),
        };
        let tls = match object.get("tls") {
            None => None,
            Some(tls) => {
                Some(TlsFiles::parse(tls).map_err(|e| invalid(format!("\"ipam.neutron\": {e}")))?)
            }
        };
        let keystone_tls = auth.as_ref().is_some_and(|a| a.url.tls);
        if !url.tls && !keystone_tls && tls.is_some() {
            return Err(invalid(format!(
                "\"ipam.neutron.tls\" is given, but \"ipam.neutron.url\" {url} is plain HTTP: give the API as https://, or leave \"tls\" out"
            )));
        }
        if (url.tls || keystone_tls) && tls.is_none() {
            return Err(invalid(
                "an https:// URL of \"ipam.neutron\" needs \"tls\": {\"ca\": FILE}, the CA that signed the server's certificate".into(),
            ));
        }
        let timeout = match object.get("timeout") {
            None => DEFAULT_TIMEOUT,
            Some(value) => match value.as_f64() {
                Some(seconds) if seconds > 0.0 && seconds <= 3600.0 => {
                    Duration::from_secs_f64(seconds)
                }
                _ => {
                    return Err(invalid(format!(
                        "\"ipam.neutron.timeout\" must be a number of seconds above 0 and at most 3600, not {value}"
                    )))
                }
            },
        };
        // Never shorter than an ADD may wait for its POST: GC would
        // delete a port made for an ADD still in flight.
        let at_least = timeout.as_secs_f64().ceil() as u64;
        let gc_grace = match object.get("gcGraceSeconds") {
            None => DEFAULT_GC_GRACE_SECONDS.max(at_least),
            Some(value) => match value.as_u64() {
                Some(grace) if grace >= at_least => grace,
                Some(grace) => {
                    return Err(invalid(format!(
                        "\"ipam.neutron.gcGraceSeconds\" ({grace}) must be at least \"timeout\" ({} s): \
                         GC could delete a port that an ADD still waits for",
                        timeout.as_secs_f64()
                    )))
                }
                None => {
                    return Err(invalid(format!(
                        "\"ipam.neutron.gcGraceSeconds\" must be a whole number of seconds, not {value}"
                    )))
                }
            },
        };
        // A DEL needs no node name: one that cannot be read is said when
        // a command needs it.
        let host = match (host_of(object), need) {
            (Ok(host), _) => Ok(host),
            (Err(e), Need::Teardown) => Err(e.to_string()),
            (Err(e), Need::Whole) => return Err(e),
        };
        let bind_host = match object.get("bindHost") {
            None => DEFAULT_BIND_HOST,
            Some(Value::Bool(bind)) => *bind,
            Some(other) => {
                return Err(invalid(format!(
                    "\"ipam.neutron.bindHost\" must be true or false, not {other}"
                )))
            }
        };
        let security_groups = match object.get("securityGroups") {
            None => DEFAULT_SECURITY_GROUPS.map(|groups| groups.iter().map(|g| g.to_string()).collect()),
            Some(Value::Null) => None,
            Some(Value::Array(list)) => Some(
                list.iter()
                    .map(|g| g.as_str().filter(|g| is_id(g)).map(String::from))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        invalid(format!(
                            "\"ipam.neutron.securityGroups\" must be a list of security group IDs, or null, not {}",
                            Value::Array(list.clone())
                        ))
                    })?,
            ),
            Some(other) => {
                return Err(invalid(format!(
                    "\"ipam.neutron.securityGroups\" must be a list of security group IDs, or null, not {other}"
                )))
            }
        };
        let cluster = text("cluster")?;
        if let Some(cluster) = &cluster {
            check_tag_value("\"ipam.neutron.cluster\"", cluster)?;
        }
        let data_dir = text("dataDir")?.map_or_else(|| DEFAULT_DATA_DIR.into(), PathBuf::from);
        if !data_dir.is_absolute() {
            return Err(invalid(format!(
                "\"ipam.neutron.dataDir\" must be an absolute directory name, not {}",
                data_dir.display()
            )));
        }
        Ok(Settings {
            url,
            token_file,
            auth,
            pools,
            default,
            host,
            tls,
            timeout,
            data_dir,
            gc_grace,
            cluster,
            bind_host,
            security_groups,
        })
    }

    /// The marks of this node's ports of CNI network `network`.
    pub fn marks<'a>(&'a self, network: &'a str) -> Result<Marks<'a>, NeutronError> {
        Ok(Marks {
            node: self.node()?,
            network,
            cluster: self.cluster.as_deref(),
        })
    }

    /// The node the ports are bound to and tagged with.
    pub fn node(&self) -> Result<&str, NeutronError> {
        self.host
            .as_deref()
            .map_err(|e| cni::Error::InvalidConfig(e.clone()).into())
    }

    /// The pool named `name`; code 7 if the settings define none.
    pub fn pool(&self, name: &str) -> Result<&Pool, NeutronError> {
        self.pools.get(name).ok_or_else(|| {
            let defined: Vec<String> = self.pools.keys().map(|k| format!("{k:?}")).collect();
            invalid(format!(
                "pool {name:?} is asked for, but \"ipam.neutron\" defines {}",
                defined.join(", ")
            ))
        })
    }

    /// The token to send, read now so that a rotated one is used.
    pub fn token(&self) -> Result<Option<String>, NeutronError> {
        self.token_file
            .as_deref()
            .map(|file| {
                crate::secret::read(file)
                    .map_err(|e| invalid(format!("\"ipam.neutron.tokenFile\": {e}")))
            })
            .transpose()
    }
}

impl AppCredential {
    /// `{"url", "applicationCredentialId", "secretFile"}`.
    fn parse(value: &Value) -> Result<AppCredential, NeutronError> {
        let keys = ["url", "applicationCredentialId", "secretFile"];
        let object = value.as_object().ok_or_else(|| {
            invalid("\"ipam.neutron.auth\" must be an object: {\"url\", \"applicationCredentialId\", \"secretFile\"}".into())
        })?;
        if let Some(key) = object.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown key \"ipam.neutron.auth.{key}\": \"ipam.neutron.auth\" has \"url\", \"applicationCredentialId\", \"secretFile\""
            )));
        }
        let text = |key: &str, what: &str| -> Result<String, NeutronError> {
            match object.get(key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                _ => Err(invalid(format!(
                    "\"ipam.neutron.auth.{key}\" must be {what}"
                ))),
            }
        };
        let url = text(
            "url",
            "Keystone's v3 root, such as https://keystone:5000/v3",
        )?;
        let url = Url::parse(&url)
            .map_err(|e| invalid(format!("\"ipam.neutron.auth.url\" {url:?}: {e}")))?;
        let id = text("applicationCredentialId", "the application credential's ID")?;
        if !is_id(&id) {
            return Err(invalid(format!(
                "\"ipam.neutron.auth.applicationCredentialId\" {id:?} is not an ID"
            )));
        }
        let secret_file = PathBuf::from(text("secretFile", "the file that holds its secret")?);
        Ok(AppCredential {
            url,
            id,
            secret_file,
        })
    }
}

impl Pool {
    fn parse(
        network: &Value,
        subnets: Option<&Value>,
        network_key: &str,
        subnets_key: &str,
    ) -> Result<Pool, NeutronError> {
        let network = match network {
            Value::String(id) if is_id(id) => id.clone(),
            other => {
                return Err(invalid(format!(
                    "{network_key} must be the network's ID, not {other}"
                )))
            }
        };
        let subnets = match subnets {
            None => Vec::new(),
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|s| s.as_str().filter(|s| is_id(s)).map(String::from))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| invalid(format!("{subnets_key} must be a list of subnet IDs")))?,
            Some(other) => {
                return Err(invalid(format!(
                    "{subnets_key} must be a non-empty list of subnet IDs, not {other}"
                )))
            }
        };
        Ok(Pool {
            network,
            subnets,
            warm: None,
        })
    }
}

/// How much of the settings a command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Every key checked: ADD, CHECK, STATUS, the operator's verbs.
    Whole,
    /// All but the pools, and the node's name read only when asked for:
    /// DEL and GC.
    Teardown,
}

/// The string at `key`, if there is one; anything but a non-empty string
/// is code 7.
fn text(object: &Map<String, Value>, key: &str) -> Result<Option<String>, NeutronError> {
    match object.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!(
            "\"ipam.neutron.{key}\" must be a non-empty string, not {other}"
        ))),
    }
}

/// `network` (and `subnets`), one pool; or `pools` with `default`.
fn pools_of(object: &Map<String, Value>) -> Result<(BTreeMap<String, Pool>, String), NeutronError> {
    let pools = match (object.get("network"), object.get("pools")) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "\"ipam.neutron\" has both \"network\" and \"pools\": give one network, or pools of networks with \"default\"".into(),
            ))
        }
        (None, None) => {
            return Err(invalid(
                "\"ipam.neutron\" needs \"network\" (the network's ID) or \"pools\" (pool names and their networks)".into(),
            ))
        }
        (Some(network), None) => {
            if object.contains_key("default") {
                return Err(invalid(
                    "\"ipam.neutron.default\" goes with \"pools\", not with \"network\"".into(),
                ));
            }
            let pool = Pool::parse(
                network,
                object.get("subnets"),
                "\"ipam.neutron.network\"",
                "\"ipam.neutron.subnets\"",
            )?;
            (BTreeMap::from([(ONLY_POOL.to_owned(), pool)]), ONLY_POOL.to_owned())
        }
        (None, Some(pools)) => {
            if object.contains_key("subnets") {
                return Err(invalid(
                    "\"ipam.neutron.subnets\" goes with \"network\"; a pool of \"pools\" lists its own".into(),
                ));
            }
            let pools = parse_pools(pools)?;
            let default = text(object, "default")?.ok_or_else(|| {
                invalid("\"ipam.neutron.pools\" needs \"default\", the pool an ADD gets when no selector names one".into())
            })?;
            if !pools.contains_key(&default) {
                return Err(invalid(format!(
                    "\"ipam.neutron.default\" names pool {default:?}, which \"ipam.neutron.pools\" does not define"
                )));
            }
            (pools, default)
        }
    };
    Ok(pools)
}

/// `pools` with `ipam.neutron.warm` given to each pool without a `warm`
/// of its own.
fn warmed(
    object: &Map<String, Value>,
    (mut pools, default): (BTreeMap<String, Pool>, String),
) -> Result<(BTreeMap<String, Pool>, String), NeutronError> {
    if let Some(value) = object.get("warm") {
        let warm = Warm::parse(value, "\"ipam.neutron.warm\"")?;
        for pool in pools.values_mut() {
            pool.warm = pool.warm.or(Some(warm));
        }
    }
    Ok((pools, default))
}

/// `host`, or the name the allocator pins (read and never pinned here;
/// without a pin, the host's name).
fn host_of(object: &Map<String, Value>) -> Result<String, NeutronError> {
    let host = match text(object, "host")? {
        Some(host) => host,
        None => {
            let file = text(object, "nodeNameFile")?.map_or_else(
                || PathBuf::from(node_name::DEFAULT_NODE_NAME_FILE),
                PathBuf::from,
            );
            node_name::current(&file)?
        }
    };
    // Any name marks a port: one too long for a tag, or with a comma, is
    // tagged by its digest (`ports::tag_value`).
    if host.is_empty() || host.contains('\n') {
        return Err(invalid(format!(
            "the node's name {host:?} cannot mark a port: it must be one line, not empty"
        )));
    }
    Ok(host)
}

/// `pools`: pool names and their networks.
fn parse_pools(value: &Value) -> Result<BTreeMap<String, Pool>, NeutronError> {
    let fail = || {
        invalid(
            "\"ipam.neutron.pools\" must be an object of pool names and {\"network\", \"subnets\"?}"
                .into(),
        )
    };
    let object = value
        .as_object()
        .filter(|o| !o.is_empty())
        .ok_or_else(fail)?;
    let mut pools = BTreeMap::new();
    for (name, pool) in object {
        pools::check_name(name)?;
        let fields = pool.as_object().ok_or_else(fail)?;
        if let Some(key) = fields
            .keys()
            .find(|k| !["network", "subnets", "warm"].contains(&k.as_str()))
        {
            return Err(invalid(format!(
                "unknown key \"ipam.neutron.pools.{name}.{key}\": a pool has \"network\", \"subnets\" and \"warm\""
            )));
        }
        let network = fields.get("network").ok_or_else(|| {
            invalid(format!(
                "pool {name:?} of \"ipam.neutron.pools\" has no \"network\""
            ))
        })?;
        let mut pool = Pool::parse(
            network,
            fields.get("subnets"),
            &format!("\"ipam.neutron.pools.{name}.network\""),
            &format!("\"ipam.neutron.pools.{name}.subnets\""),
        )?;
        if let Some(warm) = fields.get("warm") {
            let key = format!("\"ipam.neutron.pools.{name}.warm\"");
            pool.warm = Some(Warm::parse(warm, &key)?);
        }
        pools.insert(name.clone(), pool);
    }
    Ok(pools)
}

/// Whether `text` may be a resource's ID in a path or a filter: Neutron's
/// are UUIDs, other controllers' may be other names, but none of them has
/// a character a path or a query would have to escape.
pub fn is_id(text: &str) -> bool {
    // `.` and `..` would name a path's own directory or its parent.
    !text.is_empty()
        && !text.chars().all(|c| c == '.')
        && text.len() <= 255
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Tags are filtered as a comma-separated list, and are at most 255
/// characters: a name that goes in one must fit.
pub fn check_tag_value(what: &str, value: &str) -> Result<(), NeutronError> {
    if value.is_empty() || value.len() > 200 || value.contains([',', '\n']) {
        return Err(invalid(format!(
            "{what} {value:?} cannot mark a port: it must be 1 to 200 characters, with no comma"
        )));
    }
    Ok(())
}

impl Url {
    /// `http[s]://HOST[:PORT][/PATH]`.
    pub fn parse(text: &str) -> Result<Url, String> {
        let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("it must start with http:// or https://".into());
        };
        let (authority, base) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if rest.contains(['?', '#', ' ']) {
            return Err("the root cannot have a query, a fragment or a space".into());
        }
        if authority.contains('@') {
            return Err("credentials in the URL: give a \"tokenFile\"".into());
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) = bracketed.split_once(']').ok_or("an unclosed [")?;
            match after.strip_prefix(':') {
                Some(port) => (host, port.parse().map_err(|_| "a bad port")?),
                None if after.is_empty() => (host, default_port),
                None => return Err("a bad port".into()),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().map_err(|_| "a bad port")?),
                None => (authority, default_port),
            }
        };
        if host.is_empty() || host.contains(':') && !authority.starts_with('[') {
            return Err("no host".into());
        }
        Ok(Url {
            tls,
            host: host.to_owned(),
            port,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Whether it is this host's own loopback (127.0.0.0/8, ::1 or
    /// `localhost`).
    pub fn is_loopback(&self) -> bool {
        crate::http::client::is_loopback(&self.host)
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}{}", self.host, self.port, self.base)
        } else {
            write!(f, "{scheme}://{}:{}{}", self.host, self.port, self.base)
        }
    }
}

/// A configuration error (code 7).
pub fn invalid(reason: String) -> NeutronError {
    cni::Error::InvalidConfig(reason).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Reportable;
    use serde_json::json;

    fn parse(value: Value) -> Result<Settings, NeutronError> {
        Settings::parse(value.as_object().unwrap(), Need::Whole)
    }

    fn error(value: Value) -> String {
        let e = parse(value).unwrap_err();
        assert_eq!(e.code(), 7, "{e}");
        e.to_string()
    }

    const NET: &str = "6f6e1a7c-2b5e-4c1e-9a51-0d3c0a0b7c11";

    #[test]
    fn warm_is_each_pools_own_else_the_whole_settings_and_a_wrong_one_is_named() {
        let url = "http://127.0.0.1:9696/v2.0";
        let s =
            parse(json!({"url": url, "network": NET, "host": "a", "warm": {"min": 2}})).unwrap();
        let two = Warm {
            min: 2,
            max: 2,
            batch: 2,
        };
        assert_eq!(s.pools["default"].warm, Some(two));
        let s = parse(json!({"url": url, "host": "a", "default": "x", "warm": {"min": 2},
            "pools": {"x": {"network": NET}, "y": {"network": NET, "warm": {"min": 1, "max": 9, "batch": 3}}}}))
        .unwrap();
        assert_eq!(s.pools["x"].warm, Some(two));
        assert_eq!(
            s.pools["y"].warm,
            Some(Warm {
                min: 1,
                max: 9,
                batch: 3
            })
        );
        let s = parse(json!({"url": url, "network": NET, "host": "a"})).unwrap();
        assert_eq!(s.pools["default"].warm, None);
        let e = error(json!({"url": url, "host": "a", "default": "x",
            "pools": {"x": {"network": NET, "warm": {"min": 3, "max": 2}}}}));
        assert!(
            e.contains("\"ipam.neutron.pools.x.warm\".max (2) is below"),
            "{e}"
        );
        let e = error(json!({"url": url, "network": NET, "host": "a", "warm": 4}));
        assert!(e.contains("\"ipam.neutron.warm\" must be an object"), "{e}");
    }

    #[test]
    fn a_network_alone_is_one_pool_and_the_defaults_fill_the_rest() {
        let s =
            parse(json!({"url": "http://127.0.0.1:9696/v2.0/", "network": NET, "host": "node-a"}))
                .unwrap();
        assert_eq!(s.url.to_string(), "http://127.0.0.1:9696/v2.0");
        assert_eq!(s.default, "default");
        assert_eq!(s.pool("default").unwrap().network, NET);
        assert!(s.pool("default").unwrap().subnets.is_empty());
        assert_eq!(s.timeout, Duration::from_secs(10));
        assert_eq!(s.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(s.gc_grace, 60);
        assert_eq!(s.cluster, None);
        assert_eq!((s.bind_host, s.security_groups), (false, Some(vec![])));
        // Unset, it is never below the timeout either.
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n", "timeout": 90.5}))
            .unwrap();
        assert_eq!(s.gc_grace, 91);
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n", "timeout": 3, "gcGraceSeconds": 3}))
            .unwrap();
        assert_eq!(s.gc_grace, 3);
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n", "cluster": "east 1"}))
            .unwrap();
        assert_eq!(s.cluster.as_deref(), Some("east 1"));
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n",
            "bindHost": false, "securityGroups": []}))
        .unwrap();
        assert_eq!((s.bind_host, s.security_groups), (false, Some(vec![])));
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n",
            "securityGroups": null}))
        .unwrap();
        assert_eq!(s.security_groups, None);
        let s = parse(json!({"url": "http://h", "network": NET, "host": "n",
            "securityGroups": ["sg-1", "sg-2"]}))
        .unwrap();
        assert_eq!(s.security_groups, Some(vec!["sg-1".into(), "sg-2".into()]));
        let s = parse(json!({"url": "http://h/v2.0/", "network": NET, "host": "node-a"})).unwrap();
        let e = s.pool("tenant-a").unwrap_err().to_string();
        assert!(e.contains("pool \"tenant-a\" is asked for"), "{e}");
    }

    #[test]
    fn pools_need_a_default_they_define() {
        let s = parse(json!({
            "url": "http://[::1]:9696/v2.0", "host": "n",
            "pools": {"a": {"network": NET, "subnets": ["s-1"]}, "b": {"network": NET}},
            "default": "a"
        }))
        .unwrap();
        assert_eq!(s.pool("a").unwrap().subnets, ["s-1"]);
        assert_eq!(s.url.host, "::1");
        let e = error(json!({"url": "http://h/", "host": "n", "pools": {"a": {"network": NET}}}));
        assert!(e.contains("needs \"default\""), "{e}");
        let e = error(
            json!({"url": "http://h/", "host": "n", "pools": {"a": {"network": NET}}, "default": "b"}),
        );
        assert!(e.contains("does not define"), "{e}");
    }

    #[test]
    fn every_mistake_is_refused_with_code_7_naming_the_key() {
        for (value, says) in [
            (
                json!({"url": "http://h", "network": NET, "host": "n", "port": 1}),
                "unknown key \"ipam.neutron.port\"",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "pools": {}}),
                "both \"network\" and \"pools\"",
            ),
            (json!({"url": "http://h", "host": "n"}), "needs \"network\""),
            (
                json!({"network": NET, "host": "n"}),
                "\"ipam.neutron.url\" is missing",
            ),
            (
                json!({"url": "ftp://h", "network": NET, "host": "n"}),
                "http:// or https://",
            ),
            (
                json!({"url": "http://h?x=1", "network": NET, "host": "n"}),
                "a query, a fragment or a space",
            ),
            (
                json!({"url": "http://h:x", "network": NET, "host": "n"}),
                "a bad port",
            ),
            (
                json!({"url": "http://u:p@h", "network": NET, "host": "n"}),
                "credentials",
            ),
            (
                json!({"url": "http://h", "network": "a/b", "host": "n"}),
                "the network's ID",
            ),
            (
                json!({"url": "http://h", "network": NET, "subnets": [], "host": "n"}),
                "non-empty list",
            ),
            (
                json!({"url": "http://h", "network": NET, "default": "x", "host": "n"}),
                "goes with \"pools\"",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "timeout": 0}),
                "above 0",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "a\nb"}),
                "one line, not empty",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "bindHost": "yes"}),
                "\"ipam.neutron.bindHost\" must be true or false",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "securityGroups": ["a/b"]}),
                "must be a list of security group IDs, or null",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "securityGroups": "sg"}),
                "must be a list of security group IDs, or null",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "cluster": "east,west"}),
                "\"ipam.neutron.cluster\" \"east,west\" cannot mark a port",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "gcGraceSeconds": 0}),
                "(0) must be at least \"timeout\" (10 s)",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "gcGraceSeconds": 2, "timeout": 2.5}),
                "(2) must be at least \"timeout\" (2.5 s)",
            ),
            (
                json!({"url": "https://h", "network": NET, "host": "n"}),
                "needs \"tls\"",
            ),
            (
                json!({"url": "http://h", "host": "n", "pools": {"a": {"network": NET, "mtu": 1}}, "default": "a"}),
                "\"ipam.neutron.pools.a.mtu\"",
            ),
            (
                json!({"url": "https://h", "network": NET, "host": "n", "tls": {"ca": "/c", "x": 1}}),
                "unknown key \"tls.x\"",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "tls": {"ca": "/c"}}),
                "is plain HTTP: give the API as https://",
            ),
            (
                json!({"url": "http://h", "network": NET, "host": "n", "dataDir": "state"}),
                "absolute directory",
            ),
        ] {
            let e = error(value.clone());
            assert!(e.contains(says), "{value}: {e}");
        }
    }

    #[test]
    fn a_token_over_plain_http_beyond_loopback_is_refused() {
        let e = error(
            json!({"url": "http://10.0.0.5:9696/v2.0", "network": NET, "host": "n", "tokenFile": "/t"}),
        );
        assert!(e.contains("would cross the network in clear"), "{e}");
        for url in [
            "http://127.0.0.1:9696/v2.0",
            "http://localhost/v2.0",
            "http://[::1]/v2.0",
        ] {
            assert!(
                parse(json!({"url": url, "network": NET, "host": "n", "tokenFile": "/t"})).is_ok(),
                "{url}"
            );
        }
        // Without a token, plain HTTP is the operator's choice.
        assert!(
            parse(json!({"url": "http://10.0.0.5:9696/v2.0", "network": NET, "host": "n"})).is_ok()
        );
    }

    #[test]
    fn application_credentials_replace_a_token_and_never_travel_in_clear() {
        let auth = json!({"url": "http://127.0.0.1:5000/v3", "applicationCredentialId": "ac1", "secretFile": "/s"});
        let s = parse(
            json!({"url": "http://127.0.0.1:9696/v2.0", "network": NET, "host": "n", "auth": auth}),
        )
        .unwrap();
        let auth = s.auth.unwrap();
        assert_eq!(
            (auth.url.to_string(), auth.id.as_str()),
            ("http://127.0.0.1:5000/v3".into(), "ac1")
        );
        for (value, says) in [
            (
                json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n", "tokenFile": "/t",
                       "auth": {"url": "http://127.0.0.1:5000/v3", "applicationCredentialId": "a", "secretFile": "/s"}}),
                "both \"tokenFile\" and \"auth\"",
            ),
            (
                json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n",
                       "auth": {"url": "http://10.0.0.9:5000/v3", "applicationCredentialId": "a", "secretFile": "/s"}}),
                "the secret would cross the network in clear",
            ),
            (
                json!({"url": "http://10.0.0.8/v2.0", "network": NET, "host": "n",
                       "auth": {"url": "http://127.0.0.1:5000/v3", "applicationCredentialId": "a", "secretFile": "/s"}}),
                "the token would cross the network in clear",
            ),
            (
                json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n",
                       "auth": {"url": "https://k:5000/v3", "applicationCredentialId": "a", "secretFile": "/s"}}),
                "needs \"tls\"",
            ),
            (
                json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n",
                       "auth": {"url": "http://127.0.0.1/v3", "applicationCredentialID": "a", "secretFile": "/s"}}),
                "unknown key \"ipam.neutron.auth.applicationCredentialID\"",
            ),
            (
                json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n",
                       "auth": {"url": "http://127.0.0.1/v3", "secretFile": "/s"}}),
                "\"ipam.neutron.auth.applicationCredentialId\" must be",
            ),
        ] {
            let e = error(value.clone());
            assert!(e.contains(says), "{value}: {e}");
        }
        // Keystone over TLS with the controller in clear on loopback: the
        // CA is Keystone's.
        let ca = json!({"ca": "/ca.pem"});
        assert!(parse(json!({"url": "http://127.0.0.1/v2.0", "network": NET, "host": "n", "tls": ca,
            "auth": {"url": "https://k:5000/v3", "applicationCredentialId": "a", "secretFile": "/s"}})).is_ok());
    }

    #[test]
    fn a_teardown_reads_no_pool_and_the_node_name_only_when_asked() {
        let broken = json!({"url": "http://h", "host": "a\nb", "pools": {"a": {"network": NET}}, "default": "b"});
        let object = broken.as_object().unwrap();
        assert_eq!(Settings::parse(object, Need::Whole).unwrap_err().code(), 7);
        let s = Settings::parse(object, Need::Teardown).unwrap();
        assert!(s.pools.is_empty());
        let e = s.node().unwrap_err();
        assert!(e.to_string().contains("one line") && e.code() == 7, "{e}");
        // What a teardown does need is still checked whole.
        let e = Settings::parse(
            json!({"url": "ftp://h", "network": NET})
                .as_object()
                .unwrap(),
            Need::Teardown,
        )
        .unwrap_err();
        assert!(e.to_string().contains("http://"), "{e}");
    }

    #[test]
    fn without_host_the_pinned_name_is_read_and_nothing_is_pinned() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("node-name");
        let s = parse(json!({"url": "http://h", "network": NET, "nodeNameFile": file})).unwrap();
        assert!(!file.exists(), "a read pinned the name");
        assert!(!s.node().unwrap().is_empty());
        std::fs::write(&file, "pinned-node\n").unwrap();
        let s = parse(json!({"url": "http://h", "network": NET, "nodeNameFile": file})).unwrap();
        assert_eq!(s.node().unwrap(), "pinned-node");
    }
}
