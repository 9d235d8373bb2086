//! The CNI networks the Docker driver serves: each configuration under
//! `--config` (a file, or a directory of them as runtimes read
//! `/etc/cni/net.d`) whose plugin has `ipam.type` ipam-delegated, and what
//! the driver reads of it: its name, the subnets it declares, and the
//! capabilities its plugin takes.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tracing::debug;

use super::error::DockerError;
use crate::addr::{Family, Subnet};
use crate::delegated::{config, DelegatedError};
use crate::netd::{self, ConfigFileError};

/// One network: its plugin's configuration, as a main plugin would pass
/// it to ipam-delegated.
#[derive(Debug)]
pub struct Network {
    pub name: String,
    /// The file it was read from.
    pub file: PathBuf,
    config: Map<String, Value>,
}

impl Network {
    /// The subnets the configuration declares, in order: host-local's
    /// (`ipam.subnet`, then each `ipam.ranges` range's), then
    /// ipam-da-pool's (the ranges of the pools in `ipam.pool.default`, or
    /// of every pool in `ipam.pool.pools` when there is no default).
    /// Values that are not subnets are skipped: they are the delegates'
    /// to refuse.
    pub fn subnets(&self) -> Vec<Subnet> {
        let ipam = self.member("ipam");
        let mut found: Vec<&Value> = vec![&ipam["subnet"]];
        for set in as_list(&ipam["ranges"]) {
            found.extend(as_list(set).iter().map(|range| &range["subnet"]));
        }
        // As the allocator reads them: `default` a name or a list, a pool
        // its ranges or `{"ranges", "reserved"}`.
        let pools = &ipam["pool"]["pools"];
        let names: Vec<&str> = match &ipam["pool"]["default"] {
            Value::String(one) => vec![one.as_str()],
            Value::Array(default) => default.iter().filter_map(Value::as_str).collect(),
            _ => pools
                .as_object()
                .map(|pools| pools.keys().map(String::as_str).collect())
                .unwrap_or_default(),
        };
        for name in names {
            let ranges = match &pools[name] {
                Value::Object(definition) => definition.get("ranges").unwrap_or(&Value::Null),
                ranges => ranges,
            };
            found.extend(as_list(ranges).iter().map(|range| &range["subnet"]));
        }
        let mut subnets: Vec<Subnet> = Vec::new();
        for subnet in found.into_iter().filter_map(Value::as_str) {
            match Subnet::parse(subnet) {
                Ok(subnet) if !subnets.contains(&subnet) => subnets.push(subnet),
                Ok(_) => {}
                Err(e) => debug!("{}: skipping {subnet:?}: {e}", self.file.display()),
            }
        }
        subnets
    }

    /// The one subnet of `family` the configuration declares, for a Docker
    /// network created without `--subnet`.
    pub fn declared_subnet(&self, family: Family) -> Result<Subnet, DockerError> {
        let of_family: Vec<Subnet> = self
            .subnets()
            .into_iter()
            .filter(|s| s.family() == family)
            .collect();
        let version = match family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        match of_family.as_slice() {
            [one] => Ok(*one),
            [] => Err(DockerError::Request(format!(
                "network {:?} ({}) declares no {version} subnet (in ipam.subnet, ipam.ranges or ipam.pool): give one with --subnet",
                self.name,
                self.file.display()
            ))),
            several => Err(DockerError::Request(format!(
                "network {:?} ({}) declares several {version} subnets ({}): pick one with --subnet",
                self.name,
                self.file.display(),
                list(several)
            ))),
        }
    }

    /// Whether the plugin declares capability `name`: only then does a
    /// runtime (libcni, and this driver) pass it `runtimeConfig.NAME`.
    pub fn takes(&self, name: &str) -> bool {
        self.member("capabilities")[name] == Value::Bool(true)
    }

    /// A top-level member, null when missing.
    fn member(&self, key: &str) -> &Value {
        self.config.get(key).unwrap_or(&Value::Null)
    }

    /// The configuration with `runtimeConfig` holding `set` besides what
    /// the file had there.
    pub fn stdin(&self, set: Vec<(&str, Value)>) -> Vec<u8> {
        let mut config = self.config.clone();
        if !set.is_empty() {
            let runtime = config
                .entry("runtimeConfig")
                .or_insert_with(|| Value::Object(Map::new()));
            if !runtime.is_object() {
                *runtime = Value::Object(Map::new());
            }
            if let Value::Object(runtime) = runtime {
                for (key, value) in set {
                    runtime.insert(key.to_owned(), value);
                }
            }
        }
        Value::Object(config).to_string().into_bytes()
    }
}

/// The subnets as a list for a message.
pub fn list(subnets: &[Subnet]) -> String {
    let texts: Vec<String> = subnets.iter().map(ToString::to_string).collect();
    texts.join(", ")
}

fn as_list(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Network `name` of the configurations at `path`, or the only one there
/// when no name is given. Read at every request, as a runtime reads its
/// configuration at every invocation: a change applies to the next one.
pub fn find(path: &Path, name: Option<&str>) -> Result<Network, DockerError> {
    let (mut networks, skipped) = load(path)?;
    let skipped_note = || {
        if skipped.is_empty() {
            String::new()
        } else {
            format!("; skipped: {}", skipped.join("; "))
        }
    };
    match name {
        Some(name) => match networks.iter().position(|n| n.name == name) {
            Some(i) => Ok(networks.swap_remove(i)),
            None => Err(DockerError::Request(format!(
                "no network {name:?} uses ipam-delegated in {} (found: {}){}",
                path.display(),
                names(&networks),
                skipped_note()
            ))),
        },
        None if networks.len() == 1 => Ok(networks.remove(0)),
        None => Err(DockerError::Request(format!(
            "{} holds {} networks that use ipam-delegated ({}): name one with --ipam-opt network=NAME{}",
            path.display(),
            networks.len(),
            names(&networks),
            skipped_note()
        ))),
    }
}

fn names(networks: &[Network]) -> String {
    if networks.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
    names.join(", ")
}

/// Every network at `path` (a file, or a directory of them, read as
/// libcni reads it), each checked as the plugin would check it, so that a
/// broken network is refused by name before Docker counts on it; and why
/// each file of a directory that gave none was skipped.
pub fn load(path: &Path) -> Result<(Vec<Network>, Vec<String>), DockerError> {
    let found = netd::scan(
        path,
        &config::OURS,
        |stdin| -> Result<String, DockerError> {
            let config = config::Config::parse(stdin).map_err(DelegatedError::from)?;
            Ok(config.net.name)
        },
    )?;
    let networks = found
        .networks
        .into_iter()
        .map(|network| {
            let config = serde_json::from_slice(&network.stdin)
                .map_err(|e| ConfigFileError::new(&network.file, e.to_string()))?;
            Ok(Network {
                name: network.name,
                file: network.file,
                config,
            })
        })
        .collect::<Result<_, DockerError>>()?;
    Ok((networks, found.skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn network(ipam: &str) -> Network {
        let text = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"bridge","capabilities":{{"ips":true}},"ipam":{ipam}}}"#
        );
        let Value::Object(config) = serde_json::from_str(&text).unwrap() else {
            panic!()
        };
        Network {
            name: "n".into(),
            file: "f".into(),
            config,
        }
    }

    fn texts(subnets: Vec<Subnet>) -> Vec<String> {
        subnets.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn host_local_and_pool_subnets_are_found_in_order_once() {
        let n = network(
            r#"{"subnet":"10.9.0.0/24","ranges":[[{"subnet":"10.1.0.0/16"},{"subnet":"fd00::/64"}],[{"subnet":"10.9.0.0/24"}]],"pool":{"pools":{"a":[{"subnet":"10.2.0.0/24"}],"b":[{"subnet":"10.3.0.0/24"}]}}}"#,
        );
        assert_eq!(
            texts(n.subnets()),
            [
                "10.9.0.0/24",
                "10.1.0.0/16",
                "fd00::/64",
                "10.2.0.0/24",
                "10.3.0.0/24"
            ]
        );
        let n = network(
            r#"{"pool":{"default":["b"],"pools":{"a":[{"subnet":"10.2.0.0/24"}],"b":[{"subnet":"10.3.0.0/24"},{"subnet":"bad"}]}}}"#,
        );
        assert_eq!(texts(n.subnets()), ["10.3.0.0/24"]);
        let n = network(
            r#"{"pool":{"default":"b","pools":{"a":[{"subnet":"10.2.0.0/24"}],"b":{"ranges":[{"subnet":"10.3.0.0/24"}],"reserved":["10.3.0.9"]}}}}"#,
        );
        assert_eq!(texts(n.subnets()), ["10.3.0.0/24"]);
        assert!(network(r#"{"delegates":["x"]}"#).subnets().is_empty());
    }

    #[test]
    fn a_network_without_subnet_needs_exactly_one_declared() {
        let n = network(r#"{"ranges":[[{"subnet":"10.1.0.0/16"}],[{"subnet":"fd00::/64"}]]}"#);
        assert_eq!(
            n.declared_subnet(Family::V4).unwrap().to_string(),
            "10.1.0.0/16"
        );
        assert_eq!(
            n.declared_subnet(Family::V6).unwrap().to_string(),
            "fd00::/64"
        );
        let e = network("{}").declared_subnet(Family::V4).unwrap_err();
        assert!(e.to_string().contains("declares no IPv4 subnet"), "{e}");
        let e = network(r#"{"ranges":[[{"subnet":"10.1.0.0/16"}],[{"subnet":"10.2.0.0/16"}]]}"#)
            .declared_subnet(Family::V4)
            .unwrap_err();
        assert!(
            e.to_string().contains(
                "several IPv4 subnets (10.1.0.0/16, 10.2.0.0/16): pick one with --subnet"
            ),
            "{e}"
        );
    }

    #[test]
    fn runtime_config_is_added_to_what_the_file_has() {
        let n = network("{}");
        assert!(n.takes("ips") && !n.takes("ipRanges"));
        let mut bare = network("{}");
        bare.config.remove("capabilities");
        assert!(!bare.takes("ips"), "no capabilities, none taken");
        assert_eq!(n.stdin(vec![]), serde_json::to_vec(&n.config).unwrap());
        let stdin: Value =
            serde_json::from_slice(&n.stdin(vec![("ips", serde_json::json!(["10.1.0.9"]))]))
                .unwrap();
        assert_eq!(
            stdin["runtimeConfig"],
            serde_json::json!({"ips": ["10.1.0.9"]})
        );
        let mut with = network("{}");
        with.config
            .insert("runtimeConfig".into(), serde_json::json!({"mac": "x"}));
        let stdin: Value = serde_json::from_slice(&with.stdin(vec![("ips", Value::Null)])).unwrap();
        assert_eq!(
            stdin["runtimeConfig"],
            serde_json::json!({"mac": "x", "ips": null})
        );
    }

    #[test]
    fn a_directory_gives_its_networks_by_name_and_says_what_it_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ours = |name: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge","ipam":{{"type":"ipam-delegated","delegates":["host-local"]}}}}]}}"#
            )
        };
        fs::write(dir.path().join("10-a.conflist"), ours("a")).unwrap();
        fs::write(dir.path().join("20-b.conflist"), ours("b")).unwrap();
        fs::write(dir.path().join("30-a.conflist"), ours("a")).unwrap();
        fs::write(
            dir.path().join("40-other.conf"),
            r#"{"cniVersion":"1.0.0","name":"o","type":"bridge","ipam":{"type":"host-local"}}"#,
        )
        .unwrap();
        fs::write(dir.path().join("README"), "not a configuration").unwrap();
        let a = find(dir.path(), Some("a")).unwrap();
        assert_eq!(a.file, dir.path().join("10-a.conflist"));
        assert_eq!(find(dir.path(), Some("b")).unwrap().name, "b");
        let e = find(dir.path(), Some("o")).unwrap_err().to_string();
        assert!(e.contains("no network \"o\" uses ipam-delegated"), "{e}");
        assert!(e.contains("found: a, b"), "{e}");
        assert!(e.contains("40-other.conf"), "{e}");
        assert!(
            e.contains("30-a.conflist: network \"a\" is named by an earlier file"),
            "{e}"
        );
        let e = find(dir.path(), None).unwrap_err().to_string();
        assert!(e.contains("name one with --ipam-opt network=NAME"), "{e}");
        // One file: its network, whatever name is asked for by default.
        let file = dir.path().join("20-b.conflist");
        assert_eq!(find(&file, None).unwrap().name, "b");
        // A broken single file is its own error.
        let e = find(&dir.path().join("40-other.conf"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("it is not a plugin whose ipam.type is ipam-delegated"),
            "{e}"
        );
        assert!(find(&dir.path().join("missing"), None).is_err());
    }
}
