//! ipam-da-pool's settings, read from `ipam.pool` (the original convention:
//! delegate `ipam-dX-NAME` reads `ipam.NAME`): the pools it defines, its
//! default ones, where its records are kept and whose they are, and how
//! long a workload's addresses stay held; all of it read and checked whole
//! before anything is claimed.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::cni::{self, Environment, NetConf};
use crate::da_pool::counts;
use crate::da_pool::error::PoolError;
use crate::etcd::EtcdSettings;
use crate::node_name;
use crate::pools::{self, Pool};

/// The keys of `ipam.pool`.
const KEYS: [&str; 13] = [
    "pools",
    "default",
    "routes",
    "etcd",
    "dataDir",
    "node",
    "nodeNameFile",
    "gcGraceSeconds",
    "sticky",
    "stickyFor",
    "nodeTTL",
    "counts",
    "reuseAfter",
];

/// The longest cooldown `ipam.pool.reuseAfter` may set: a day, longer
/// than any stale entry it is for outlives (and than an etcd lease's
/// time to live should be).
pub const MAX_REUSE_AFTER: u64 = 86_400;

/// Where the local store keeps its files unless `ipam.pool.dataDir` says.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/ipam-da-pool";

/// How old an attachment must be, unless `ipam.pool.gcGraceSeconds` says,
/// before GC may free it. A runtime lists the valid attachments before it
/// calls GC; an ADD that finishes in between is not on the list, and
/// freeing it would hand its address out twice. What is stale now is
/// still stale a minute later.
pub const DEFAULT_GC_GRACE_SECONDS: u64 = 60;

/// How long a node's registration outlives its keeper's last renewal,
/// unless `ipam.pool.nodeTTL` says.
pub const DEFAULT_NODE_TTL_SECONDS: u64 = 60;

/// `ipam.pool.sticky` and `stickyFor`: the addresses of an attachment
/// follow its workload, as `CNI_ARGS` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stickiness {
    /// The `CNI_ARGS` keys whose values, in this order, name the workload.
    pub keys: Vec<String>,
    /// How long, in seconds, a workload's addresses stay held once its
    /// container is gone.
    pub sticky_for: u64,
}

/// Whether reading the settings may pin the node's name at its first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// Pinned now, if it is not yet (an ADD, a command that records).
    Pin,
    /// Read, writing nothing.
    Read,
}

/// Where allocations are kept.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    /// Files under a directory on this node.
    Local { data_dir: PathBuf },
    /// An etcd cluster, shared by every node; the node's notes of its
    /// claims (hints only) under `data_dir`.
    Etcd {
        cluster: EtcdSettings,
        data_dir: PathBuf,
    },
}

/// `ipam.pool`.
#[derive(Debug)]
pub struct Settings {
    /// `pools`: the pools the configuration defines, in order.
    pub pools: Vec<Pool>,
    /// `default`: the pools an ADD without `prevResult.pools` gets one
    /// address from each of.
    pub default: Vec<String>,
    /// `routes`: the routes every result carries.
    pub routes: Option<Vec<Value>>,
    /// `dataDir`, or `etcd`.
    pub store: StoreSettings,
    /// `node`: the name allocations of this node are recorded under.
    pub node: String,
    /// `gcGraceSeconds`: how old an attachment must be before GC may
    /// free it.
    pub gc_grace: u64,
    /// `sticky` and `stickyFor`, if set.
    pub sticky: Option<Stickiness>,
    /// `nodeTTL`: how long, in seconds, the node's registration outlives
    /// its keeper's last renewal.
    pub node_ttl: u64,
    /// `counts`: the directory where each command leaves its count for
    /// the node's metrics; `None` where counting is off (`false`).
    pub counts: Option<PathBuf>,
    /// `reuseAfter`: how long, in seconds, an address given back cools
    /// down before it is given again; 0 (the default) gives it at once.
    pub reuse_after: u64,
}

impl Settings {
    /// Reads `ipam.pool` from `net`, every pool checked whole, and no two
    /// of them giving one address; without `ipam.pool.node`, the node's
    /// name pinned at its first use.
    pub fn from_net(net: &NetConf) -> Result<Settings, PoolError> {
        Settings::read(net, Naming::Pin)
    }

    /// As [`Settings::from_net`], but writing nothing: the node's name is
    /// the one pinned, or the one a first use would pin. A check of the
    /// settings makes nothing.
    pub fn checked(net: &NetConf) -> Result<Settings, PoolError> {
        Settings::read(net, Naming::Read)
    }

    fn read(net: &NetConf, naming: Naming) -> Result<Settings, PoolError> {
        let pool = pool_object(net)?;
        // A misspelt key would leave what it meant to set unset, unnoticed.
        if let Some(key) = pool.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown key \"ipam.pool.{key}\": \"ipam.pool\" has {}",
                KEYS.map(|k| format!("{k:?}")).join(", ")
            )));
        }
        let mut settings = Settings::store(net, naming)?;
        settings.pools = match pool.get("pools") {
            None => Vec::new(),
            Some(Value::Object(pools)) => pools
                .iter()
                .map(|(name, ranges)| Pool::parse(name, ranges))
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(invalid(
                    "\"ipam.pool.pools\" must be an object of pool names and their ranges".into(),
                ))
            }
        };
        for (i, a) in settings.pools.iter().enumerate() {
            for b in &settings.pools[i + 1..] {
                let shared = a
                    .ranges
                    .iter()
                    .find_map(|r| b.ranges.iter().find(|q| r.overlaps(q)).map(|q| (r, q)));
                if let Some((r, q)) = shared {
                    return Err(invalid(format!(
                        "pools {:?} ({}) and {:?} ({}) would give the same addresses",
                        a.name,
                        r.subnet(),
                        b.name,
                        q.subnet()
                    )));
                }
            }
        }
        settings.default = match pool.get("default") {
            None => Vec::new(),
            Some(Value::String(name)) => vec![name.clone()],
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| n.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    invalid("\"ipam.pool.default\" must be a pool name or a list of them".into())
                })?,
            Some(_) => {
                return Err(invalid(
                    "\"ipam.pool.default\" must be a pool name or a list of them".into(),
                ))
            }
        };
        for name in &settings.default {
            pools::check_name(name)?;
        }
        settings.sticky = match (pool.get("sticky"), pool.get("stickyFor")) {
            (None, None) => None,
            (Some(keys), Some(duration)) => Some(Stickiness {
                keys: sticky_keys(keys)?,
                sticky_for: duration
                    .as_str()
                    .and_then(parse_duration)
                    .filter(|seconds| *seconds > 0)
                    .ok_or_else(|| {
                        invalid(format!(
                            "\"ipam.pool.stickyFor\" must be a duration such as \"24h\" or \"90m\", not {duration}"
                        ))
                    })?,
            }),
            (Some(_), None) => {
                return Err(invalid(
                    "\"ipam.pool.sticky\" needs \"stickyFor\": how long a workload's addresses stay held once its container is gone (\"24h\", say)".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "\"ipam.pool.stickyFor\" needs \"sticky\": the CNI_ARGS keys that name a workload".into(),
                ))
            }
        };
        settings.node_ttl = match pool.get("nodeTTL") {
            None => DEFAULT_NODE_TTL_SECONDS,
            Some(ttl) => ttl
                .as_u64()
                .or_else(|| ttl.as_str().and_then(parse_duration))
                .filter(|seconds| (1..=86_400).contains(seconds))
                .ok_or_else(|| {
                    invalid(format!(
                        "\"ipam.pool.nodeTTL\" must be seconds (1 to 86400) or a duration such as \"60s\", not {ttl}"
                    ))
                })?,
        };
        settings.routes = match pool.get("routes") {
            None => None,
            Some(Value::Array(routes)) => Some(routes.clone()),
            Some(_) => {
                return Err(invalid(
                    "\"ipam.pool.routes\" must be an array of routes".into(),
                ))
            }
        };
        Ok(settings)
    }

    /// Reads only where the records are, whose they are and GC's grace:
    /// what DEL, CHECK and GC need, so that a mistake in a pool never
    /// stops a teardown. Pools, default and routes are left empty. It
    /// writes nothing: a teardown makes no file, the node's name included.
    pub fn store_only(net: &NetConf) -> Result<Settings, PoolError> {
        Settings::store(net, Naming::Read)
    }

    fn store(net: &NetConf, naming: Naming) -> Result<Settings, PoolError> {
        let pool = pool_object(net)?;
        let data_dir = match pool.get("dataDir") {
            None => DEFAULT_DATA_DIR.into(),
            Some(Value::String(dir)) if dir.starts_with('/') => dir.into(),
            Some(other) => {
                return Err(invalid(format!(
                    "\"ipam.pool.dataDir\" must be an absolute directory, not {other}"
                )))
            }
        };
        let store = match pool.get("etcd") {
            Some(settings) => StoreSettings::Etcd {
                cluster: EtcdSettings::parse(settings)
                    .map_err(|e| invalid(format!("\"ipam.pool.etcd\": {e}")))?,
                data_dir,
            },
            None => StoreSettings::Local { data_dir },
        };
        let node = match pool.get("node") {
            None => {
                let file = match pool.get("nodeNameFile") {
                    None => PathBuf::from(node_name::DEFAULT_NODE_NAME_FILE),
                    Some(Value::String(file)) if file.starts_with('/') => file.into(),
                    Some(other) => {
                        return Err(invalid(format!(
                            "\"ipam.pool.nodeNameFile\" must be an absolute file name, not {other}"
                        )))
                    }
                };
                match naming {
                    Naming::Pin => node_name::pinned(&file)?,
                    Naming::Read => node_name::current(&file)?,
                }
            }
            Some(Value::String(node)) if cni::is_identifier(node) => node.clone(),
            Some(other) => {
                return Err(invalid(format!(
                    "\"ipam.pool.node\" {other} {}",
                    cni::IDENTIFIER_RULE
                )))
            }
        };
        let gc_grace = match pool.get("gcGraceSeconds") {
            None => DEFAULT_GC_GRACE_SECONDS,
            Some(seconds) => seconds.as_u64().ok_or_else(|| {
                invalid(format!(
                    "\"ipam.pool.gcGraceSeconds\" must be a whole number of seconds, not {seconds}"
                ))
            })?,
        };
        // Read for DEL and GC too: they are what give addresses back.
        let reuse_after = match pool.get("reuseAfter") {
            None => 0,
            Some(duration) => duration
                .as_str()
                .and_then(parse_duration)
                .filter(|seconds| *seconds <= MAX_REUSE_AFTER)
                .ok_or_else(|| {
                    invalid(format!(
                        "\"ipam.pool.reuseAfter\" must be a duration of up to 24h, such as \"30s\" or \"10m\", not {duration}"
                    ))
                })?,
        };
        let counts = counts_in(&pool).map_err(|other| {
            invalid(format!(
                "\"ipam.pool.counts\" must be an absolute directory, or false, not {other}"
            ))
        })?;
        Ok(Settings {
            pools: Vec::new(),
            default: Vec::new(),
            routes: None,
            store,
            node,
            gc_grace,
            sticky: None,
            node_ttl: DEFAULT_NODE_TTL_SECONDS,
            counts,
            reuse_after,
        })
    }

    /// The pool the configuration defines under `name`.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|pool| pool.name == name)
    }
}

/// `ipam.pool`, an object; none is an empty one.
/// `ipam.pool.counts` of `pool`: the directory, `None` for `false`; the
/// value if it is neither.
fn counts_in(pool: &Map<String, Value>) -> Result<Option<PathBuf>, &Value> {
    match pool.get("counts") {
        None => Ok(Some(PathBuf::from(counts::DEFAULT_DIR))),
        Some(Value::Bool(false)) => Ok(None),
        Some(Value::String(dir)) if dir.starts_with('/') => Ok(Some(dir.into())),
        Some(other) => Err(other),
    }
}

/// Where a command of `net` leaves its count, read alone, for a command
/// whose settings are wrong elsewhere: its error counts too, where the
/// node's daemon reads them, and not at all if counting is off. Where
/// `counts` itself is wrong, the default place.
pub fn counts_of(net: &NetConf) -> Option<PathBuf> {
    let pool = pool_object(net).unwrap_or_default();
    counts_in(&pool).unwrap_or_else(|_| Some(PathBuf::from(counts::DEFAULT_DIR)))
}

fn pool_object(net: &NetConf) -> Result<Map<String, Value>, PoolError> {
    let ipam = net
        .member("ipam")
        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        .unwrap_or(Value::Null);
    match ipam.get("pool") {
        Some(Value::Object(pool)) => Ok(pool.clone()),
        Some(_) => Err(invalid("\"ipam.pool\" must be an object".into())),
        None => Ok(Map::new()),
    }
}

/// `ipam.pool.sticky`: a non-empty list of `CNI_ARGS` keys.
fn sticky_keys(value: &Value) -> Result<Vec<String>, PoolError> {
    let fail = || {
        invalid(format!(
            "\"ipam.pool.sticky\" must be a non-empty list of CNI_ARGS keys, such as [\"K8S_POD_NAMESPACE\", \"K8S_POD_NAME\"], not {value}"
        ))
    };
    let keys: Vec<String> = value
        .as_array()
        .ok_or_else(fail)?
        .iter()
        .map(|key| {
            key.as_str()
                .filter(|k| !k.is_empty() && !k.contains(['=', ';']))
                .map(String::from)
                .ok_or_else(fail)
        })
        .collect::<Result<_, _>>()?;
    if keys.is_empty() {
        return Err(fail());
    }
    Ok(keys)
}

/// A duration such as `24h`, `90m`, `1h30m`, `45s` or `2d`, in seconds:
/// whole numbers, each with its unit (`s`, `m`, `h`, `d`).
pub fn parse_duration(text: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    for c in text.chars() {
        if let Some(digit) = c.to_digit(10) {
            number = Some(
                number
                    .unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(u64::from(digit))?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            _ => return None,
        };
        total = total.checked_add(number.take()?.checked_mul(unit)?)?;
    }
    // A number without its unit, or nothing at all: no duration.
    (number.is_none() && !text.is_empty()).then_some(total)
}

/// The workload an ADD's addresses follow: the values of the `sticky`
/// keys in `CNI_ARGS`, in order, joined by '/' (`default/web-0`); `None`
/// without `sticky`, or when a key is missing or empty (said at debug
/// level: the addresses then follow the container only).
pub fn workload(env: &Environment, settings: &Settings) -> Option<String> {
    let sticky = settings.sticky.as_ref()?;
    let pairs = env.arg_pairs();
    let mut values = Vec::new();
    for key in &sticky.keys {
        match pairs.iter().find(|(k, _)| k == key).map(|(_, v)| *v) {
            Some(value) if !value.is_empty() => values.push(value),
            _ => {
                tracing::debug!(
                    "\"ipam.pool.sticky\" is set, but CNI_ARGS has no {key}: the addresses follow the container only"
                );
                return None;
            }
        }
    }
    Some(values.join("/"))
}

/// A configuration error (code 7) saying `reason`.
pub fn invalid(reason: String) -> PoolError {
    cni::Error::InvalidConfig(reason).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Reportable;
    use serde_json::json;

    fn net(ipam_pool: Value, prev: Option<Value>) -> Vec<u8> {
        let mut config = json!({
            "cniVersion": "1.0.0",
            "name": "n",
            "ipam": {"type": "ipam-delegated", "pool": ipam_pool},
        });
        if let Some(prev) = prev {
            config["prevResult"] = prev;
        }
        config.to_string().into_bytes()
    }

    fn settings(ipam_pool: Value) -> Result<Settings, PoolError> {
        let raw = net(ipam_pool, None);
        Settings::from_net(&NetConf::parse(&raw).unwrap())
    }

    #[test]
    fn pools_are_checked_whole_and_errors_name_pool_range_and_field() {
        let ok = settings(json!({"node": "a", "pools": {"blue": [
            {"subnet": "10.1.0.0/24", "rangeEnd": "10.1.0.100"},
            {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.101"},
        ]}}))
        .unwrap();
        assert_eq!(ok.pools[0].ranges.len(), 2);
        let ok = settings(json!({"node": "a", "pools": {"blue": {
            "ranges": [{"subnet": "10.1.0.0/24", "exclude": ["10.1.0.128/25"]}],
            "reserved": ["10.1.0.9", "10.1.0.10"],
        }}}))
        .unwrap();
        assert_eq!(ok.pools[0].reserved.len(), 2);
        assert_eq!(ok.pools[0].ranges[0].exclude.len(), 1);
        for (pools, said) in [
            (
                json!({"blue": [{"subnet": "10.1.0.0/24"}, {"subnet": "10.1.0.0/16"}]}),
                "pool \"blue\": ranges 0 (10.1.0.0/24) and 1 (10.1.0.0/16) overlap",
            ),
            (
                json!({"blue": [{"subnet": "10.1.0.0/24"}, {"subnet": "fd00::/64"}]}),
                "of different IP versions",
            ),
            (
                json!({"blue": [{"subnet": "10.1.0.0/24", "gateway": "10.2.0.1"}]}),
                "pool \"blue\": range 0: \"gateway\" 10.2.0.1 is outside the subnet",
            ),
            (json!({"blue": []}), "must be a non-empty array"),
            (
                json!({"blue": [{"subnet": "10.1.0.0/24"}], "red": [{"subnet": "10.1.0.0/25"}]}),
                "pools \"blue\" (10.1.0.0/24) and \"red\" (10.1.0.0/25) would give the same addresses",
            ),
            (
                json!({"../x": [{"subnet": "10.1.0.0/24"}]}),
                "pool name \"../x\"",
            ),
            (
                json!({"blue": {"ranges": [{"subnet": "10.1.0.0/24"}], "reserved": ["10.2.0.1"]}}),
                "pool \"blue\": \"reserved\" 10.2.0.1 is in none of the pool's ranges",
            ),
            (
                json!({"blue": {"ranges": [{"subnet": "10.1.0.0/24"}], "reserved": ["10.1.0.x"]}}),
                "pool \"blue\": \"reserved\" \"10.1.0.x\" is not an address",
            ),
            (
                json!({"blue": {"ranges": [{"subnet": "10.1.0.0/24"}], "reserve": ["10.1.0.9"]}}),
                "pool \"blue\": unknown key \"reserve\"",
            ),
            (
                json!({"blue": {"reserved": ["10.1.0.9"]}}),
                "pool \"blue\": must be a non-empty array of ranges",
            ),
            (
                json!({"blue": [{"subnet": "10.1.0.0/24", "exclude": ["10.1.0.0/16"]}]}),
                "pool \"blue\": range 0: \"exclude\" 10.1.0.0/16 is outside the subnet 10.1.0.0/24",
            ),
        ] {
            let e = settings(json!({"node": "a", "pools": pools})).unwrap_err();
            assert_eq!(e.code(), 7);
            assert!(e.to_string().contains(said), "{e}");
        }
    }

    #[test]
    fn the_store_is_local_by_default_or_etcd_with_the_nodes_notes_in_data_dir() {
        let s = settings(json!({"node": "a"})).unwrap();
        assert!(
            matches!(s.store, StoreSettings::Local { ref data_dir } if data_dir == &PathBuf::from(DEFAULT_DATA_DIR))
        );
        let s = settings(
            json!({"node": "a", "dataDir": "/x", "etcd": {"endpoints": ["127.0.0.1:2379"]}}),
        )
        .unwrap();
        assert!(
            matches!(s.store, StoreSettings::Etcd { ref data_dir, .. } if data_dir == &PathBuf::from("/x"))
        );
        let s = settings(json!({"node": "a", "etcd": {"endpoints": ["127.0.0.1:2379"]}})).unwrap();
        assert!(
            matches!(s.store, StoreSettings::Etcd { ref data_dir, .. } if data_dir == &PathBuf::from(DEFAULT_DATA_DIR))
        );
        let e = settings(json!({"node": "a", "dataDir": "relative"})).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = settings(json!({"node": "../n"})).unwrap_err();
        assert!(e.to_string().contains("\"ipam.pool.node\""), "{e}");
    }

    #[test]
    fn a_misspelt_key_is_refused_wherever_it_is() {
        for (pool, said) in [
            (
                json!({"defualt": "blue"}),
                "unknown key \"ipam.pool.defualt\"",
            ),
            (
                json!({"pools": {"blue": [{"subnet": "10.1.0.0/24", "exlude": ["10.1.0.5"]}]}}),
                "pool \"blue\": range 0: unknown key \"exlude\"",
            ),
            (
                json!({"pools": {"blue": {"ranges": [{"subnet": "10.1.0.0/24"}], "resrved": []}}}),
                "pool \"blue\": unknown key \"resrved\"",
            ),
        ] {
            let mut pool = pool;
            pool["node"] = json!("a");
            let e = settings(pool).unwrap_err();
            assert_eq!(e.code(), 7);
            assert!(e.to_string().contains(said), "{e}");
        }
    }

    #[test]
    fn without_a_node_the_pinned_name_is_read_from_the_file_given() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("node-name");
        std::fs::write(&file, "pinned-1\n").unwrap();
        let s = settings(json!({"nodeNameFile": file})).unwrap();
        assert_eq!(s.node, "pinned-1");
        let s = settings(json!({"nodeNameFile": file, "node": "set-1"})).unwrap();
        assert_eq!(s.node, "set-1", "an explicit node wins");
        let e = settings(json!({"nodeNameFile": "node-name"})).unwrap_err();
        assert!(
            e.to_string().contains("must be an absolute file name"),
            "{e}"
        );
    }

    #[test]
    fn a_teardown_or_a_check_pins_no_name_and_makes_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("fresh-node/node-name");
        let raw = net(json!({"nodeNameFile": file}), None);
        let net = NetConf::parse(&raw).unwrap();
        let host = node_name::current(&file).unwrap();
        assert_eq!(Settings::store_only(&net).unwrap().node, host);
        assert_eq!(Settings::checked(&net).unwrap().node, host);
        assert!(!tmp.path().join("fresh-node").exists(), "a file was made");
        // An ADD's reading pins it.
        assert_eq!(Settings::from_net(&net).unwrap().node, host);
        assert!(file.exists());
    }

    #[test]
    fn the_gc_grace_is_a_minute_unless_set_to_whole_seconds() {
        assert_eq!(settings(json!({"node": "a"})).unwrap().gc_grace, 60);
        let s = settings(json!({"node": "a", "gcGraceSeconds": 0})).unwrap();
        assert_eq!(s.gc_grace, 0);
        for bad in [json!(-1), json!(1.5), json!("60")] {
            let e = settings(json!({"node": "a", "gcGraceSeconds": bad})).unwrap_err();
            assert!(e.to_string().contains("whole number of seconds"), "{e}");
        }
    }

    #[test]
    fn durations_are_whole_numbers_with_their_units() {
        for (text, seconds) in [
            ("24h", 86_400),
            ("90m", 5_400),
            ("1h30m", 5_400),
            ("45s", 45),
            ("2d", 172_800),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration(text), Some(seconds), "{text}");
        }
        for bad in ["", "24", "h", "1.5h", "1w", "-1h", "99999999999999999999d"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn reuse_after_is_off_unless_set_to_a_duration_of_up_to_a_day() {
        assert_eq!(settings(json!({"node": "a"})).unwrap().reuse_after, 0);
        let s = settings(json!({"node": "a", "reuseAfter": "2m30s"})).unwrap();
        assert_eq!(s.reuse_after, 150);
        let s = settings(json!({"node": "a", "reuseAfter": "24h"})).unwrap();
        assert_eq!(s.reuse_after, 86_400);
        for bad in [json!(30), json!("30"), json!("25h"), json!(null)] {
            let e = settings(json!({"node": "a", "reuseAfter": bad})).unwrap_err();
            assert!(
                e.to_string()
                    .contains("\"ipam.pool.reuseAfter\" must be a duration"),
                "{e}"
            );
        }
        // DEL reads it too: it is what cools an address.
        let raw = net(json!({"node": "a", "reuseAfter": "1m", "pools": 7}), None);
        let net = NetConf::parse(&raw).unwrap();
        assert_eq!(Settings::store_only(&net).unwrap().reuse_after, 60);
    }

    #[test]
    fn sticky_needs_its_keys_and_a_duration_and_names_the_workload_from_cni_args() {
        let keys = json!(["K8S_POD_NAMESPACE", "K8S_POD_NAME"]);
        let s = settings(json!({"node": "a", "sticky": keys, "stickyFor": "24h"})).unwrap();
        assert_eq!(
            s.sticky,
            Some(Stickiness {
                keys: vec!["K8S_POD_NAMESPACE".into(), "K8S_POD_NAME".into()],
                sticky_for: 86_400
            })
        );
        assert_eq!(settings(json!({"node": "a"})).unwrap().sticky, None);
        for (pool, said) in [
            (json!({"sticky": keys}), "needs \"stickyFor\""),
            (json!({"stickyFor": "1h"}), "needs \"sticky\""),
            (json!({"sticky": [], "stickyFor": "1h"}), "non-empty list"),
            (
                json!({"sticky": ["A=B"], "stickyFor": "1h"}),
                "non-empty list",
            ),
            (
                json!({"sticky": "K8S_POD_NAME", "stickyFor": "1h"}),
                "non-empty list",
            ),
            (
                json!({"sticky": keys, "stickyFor": 3600}),
                "must be a duration",
            ),
            (
                json!({"sticky": keys, "stickyFor": "0s"}),
                "must be a duration",
            ),
            (json!({"nodeTTL": 0}), "\"ipam.pool.nodeTTL\""),
            (json!({"nodeTTL": "soon"}), "\"ipam.pool.nodeTTL\""),
        ] {
            let mut pool = pool;
            pool["node"] = json!("a");
            let e = settings(pool).unwrap_err();
            assert_eq!(e.code(), 7);
            assert!(e.to_string().contains(said), "{e}");
        }
        assert_eq!(settings(json!({"node": "a"})).unwrap().node_ttl, 60);
        assert_eq!(
            settings(json!({"node": "a", "nodeTTL": "2m"}))
                .unwrap()
                .node_ttl,
            120
        );
        let env = cni::add_with_args;
        let pod = "IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=default";
        assert_eq!(workload(&env(pod), &s).as_deref(), Some("default/web-0"));
        assert_eq!(workload(&env("K8S_POD_NAME=web-0"), &s), None);
        assert_eq!(
            workload(&env("K8S_POD_NAMESPACE=;K8S_POD_NAME=web-0"), &s),
            None
        );
        let plain = settings(json!({"node": "a"})).unwrap();
        assert_eq!(workload(&env(pod), &plain), None);
    }

    #[test]
    fn counts_go_where_the_setting_says_even_from_settings_wrong_elsewhere() {
        let counts = |pool: Value| {
            let raw = net(pool, None);
            counts_of(&NetConf::parse(&raw).unwrap())
        };
        let default = Some(PathBuf::from(counts::DEFAULT_DIR));
        // Wrong elsewhere: a pool that does not parse.
        let wrong = json!({"node": "a", "pools": {"blue": "10.1.0.0/24"}});
        assert!(settings(wrong.clone()).is_err());
        assert_eq!(counts(wrong.clone()), default);
        let mut off = wrong.clone();
        off["counts"] = json!(false);
        assert_eq!(counts(off), None);
        let mut elsewhere = wrong;
        elsewhere["counts"] = json!("/run/other");
        assert_eq!(counts(elsewhere), Some(PathBuf::from("/run/other")));
        assert_eq!(counts(json!({"counts": "relative"})), default);
        assert_eq!(
            settings(json!({"node": "a", "counts": false}))
                .unwrap()
                .counts,
            None
        );
        for bad in [json!("relative"), json!(true), json!(1)] {
            let e = settings(json!({"node": "a", "counts": bad})).unwrap_err();
            assert!(
                e.to_string()
                    .contains("\"ipam.pool.counts\" must be an absolute directory, or false"),
                "{e}"
            );
        }
    }
}
