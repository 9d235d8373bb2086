//! ipam-ds-static, the selection delegate: picks the pools an attachment
//! gets its addresses from, by rules over its `CNI_ARGS` keys and
//! `runtimeConfig` values (first match wins, else the default), and hands
//! them on as its result's `pools`, as the original README's selectors do,
//! with the address the runtime asks for set on the pool that gives it.
//! It prints nothing on DEL, CHECK, GC and STATUS: it keeps nothing.
//!
//! ```json
//! "static": {
//!   "default": [{"name": "blue"}],
//!   "rules": [
//!     {"args": {"K8S_POD_NAMESPACE": ["payments", "ledger"]}, "pools": [{"name": "red"}]},
//!     {"runtimeConfig": {"tier": "edge"}, "pools": [{"name": "edge"}, {"name": "edge6"}]}
//!   ]
//! }
//! ```

use std::io::Write;

use serde_json::{json, Map, Value};

use crate::cni::{self, Environment, NetConf};
use crate::error::Error;
use crate::pool::{requested_by_runtime, Addr, Pool, Wanted};
use crate::skel::{self, Plugin};

/// ipam-ds-static as a CNI plugin.
pub struct Selector;

impl Plugin for Selector {
    fn add(&self, env: &Environment, net: NetConf, stdout: &mut dyn Write) -> Result<(), Error> {
        let chosen = select(env, &net)?;
        skel::write_reply(stdout, &result(&net, &chosen))
    }

    fn del(&self, _: &Environment, _: NetConf) -> Result<(), Error> {
        Ok(())
    }

    fn check(&self, _: &Environment, _: NetConf) -> Result<(), Error> {
        Ok(())
    }

    fn gc(&self, _: &Environment, _: NetConf) -> Result<(), Error> {
        Ok(())
    }

    fn status(&self, _: &Environment, _: NetConf) -> Result<(), Error> {
        Ok(())
    }
}

/// The Pool objects for this attachment: the first rule's that matches,
/// else the default's; with the runtime's requested addresses set.
fn select(env: &Environment, net: &NetConf) -> Result<Vec<Value>, Error> {
    let ipam = object_member(net, "ipam")?.unwrap_or_default();
    let settings = match ipam.get("static") {
        Some(Value::Object(settings)) => settings.clone(),
        Some(_) => return Err(invalid("\"ipam.static\" must be an object".into())),
        None => {
            return Err(invalid(
                "\"ipam.static\" is missing: it holds the rules and the default".into(),
            ))
        }
    };
    let args = cni_args(env);
    let runtime = object_member(net, "runtimeConfig")?.unwrap_or_default();
    let rules = match settings.get("rules") {
        None => &Vec::new(),
        Some(Value::Array(rules)) => rules,
        Some(_) => return Err(invalid("\"ipam.static.rules\" must be an array".into())),
    };
    let mut chosen = None;
    for (i, rule) in rules.iter().enumerate() {
        let rule = rule
            .as_object()
            .ok_or_else(|| invalid(format!("\"ipam.static.rules\"[{i}] must be an object")))?;
        let pools = pools(
            rule.get("pools"),
            &format!("\"ipam.static.rules\"[{i}].pools"),
        )?;
        if chosen.is_none() && matches(rule, &args, &runtime, i)? {
            chosen = Some(pools);
        }
    }
    let default = match settings.get("default") {
        None => None,
        Some(list) => Some(pools(Some(list), "\"ipam.static.default\"")?),
    };
    let mut chosen = chosen.or(default).ok_or_else(|| {
        invalid("no rule of \"ipam.static\" matches, and it has no \"default\"".into())
    })?;
    let pool_settings = ipam.get("pool").and_then(|p| p.get("pools")).cloned();
    for address in requested_by_runtime(env, net)? {
        place(&mut chosen, address, pool_settings.as_ref())?;
    }
    Ok(chosen)
}

/// Whether every `args` key of the rule has a value it names (one, or any
/// of a list) and every `runtimeConfig` key the value it gives.
fn matches(
    rule: &Map<String, Value>,
    args: &[(String, String)],
    runtime: &Map<String, Value>,
    i: usize,
) -> Result<bool, Error> {
    if let Some(wanted) = rule.get("args") {
        let wanted = wanted
            .as_object()
            .ok_or_else(|| invalid(format!("\"ipam.static.rules\"[{i}].args must be an object")))?;
        for (key, accepted) in wanted {
            let value = args.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            let ok = match accepted {
                Value::String(one) => value == Some(one.as_str()),
                Value::Array(any) => any
                    .iter()
                    .any(|a| a.as_str().is_some() && a.as_str() == value),
                _ => {
                    return Err(invalid(format!(
                        "\"ipam.static.rules\"[{i}].args.{key} must be a string or a list of them"
                    )))
                }
            };
            if !ok {
                return Ok(false);
            }
        }
    }
    if let Some(wanted) = rule.get("runtimeConfig") {
        let wanted = wanted.as_object().ok_or_else(|| {
            invalid(format!(
                "\"ipam.static.rules\"[{i}].runtimeConfig must be an object"
            ))
        })?;
        if wanted
            .iter()
            .any(|(key, value)| runtime.get(key) != Some(value))
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A list of Pool objects, each checked as the allocator reads it.
fn pools(list: Option<&Value>, what: &str) -> Result<Vec<Value>, Error> {
    let list = list
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| invalid(format!("{what} must be a non-empty array of pools")))?;
    for pool in list {
        Wanted::parse(pool, what)?;
    }
    Ok(list.clone())
}

/// Sets `requested-ip` to `address` on the chosen pool that gives it:
/// known by its inline ranges or the configuration's `ipam.pool.pools`; or,
/// when no pool is known to, the only pool whose ranges are not known here
/// (the allocator's store may define it).
fn place(chosen: &mut [Value], address: Addr, defined: Option<&Value>) -> Result<(), Error> {
    // Every pool was checked by `pools`: parsing it again cannot fail.
    let ranges = |pool: &Value| -> Option<Pool> {
        let wanted = Wanted::parse(pool, "").ok()?;
        if wanted.inline.is_some() {
            return wanted.inline;
        }
        Pool::parse(&wanted.name, defined?.get(&wanted.name)?).ok()
    };
    let known: Vec<Option<Pool>> = chosen.iter().map(ranges).collect();
    let giving: Vec<usize> = known
        .iter()
        .enumerate()
        .filter(|(_, pool)| pool.as_ref().is_some_and(|p| p.range_of(address).is_some()))
        .map(|(i, _)| i)
        .collect();
    let unknown: Vec<usize> = known
        .iter()
        .enumerate()
        .filter(|(_, pool)| pool.is_none())
        .map(|(i, _)| i)
        .collect();
    let index = match (giving.as_slice(), unknown.as_slice()) {
        ([one], _) | ([], [one]) => *one,
        _ => {
            return Err(invalid(format!(
                "the runtime asks for {address}, and no one pool chosen is known to give it"
            )))
        }
    };
    let pool = &mut chosen[index];
    if pool.get("requested-ip").is_some() {
        return Err(invalid(format!(
            "the runtime asks for {address} from pool {}, which has a \"requested-ip\" already",
            pool["name"]
        )));
    }
    pool["requested-ip"] = json!(address.to_string());
    Ok(())
}

/// CNI_ARGS as `KEY=VALUE` pairs, separated by ';'.
fn cni_args(env: &Environment) -> Vec<(String, String)> {
    env.args
        .as_deref()
        .unwrap_or_default()
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The selector's result: the previous result amended with `pools`, or
/// `{"cniVersion", "ips": [], "pools"}` without one, as the original
/// README's example flow shows a selector's.
fn result(net: &NetConf, chosen: &[Value]) -> Vec<u8> {
    let pools = Value::Array(chosen.to_vec()).to_string();
    if net.member("prevResult").is_some() {
        net.result_on_previous(&[("pools", &pools)])
    } else {
        net.result_on_previous(&[("ips", "[]"), ("pools", &pools)])
    }
}

/// The configuration's top-level member `key`, which must be an object if
/// it is there.
fn object_member(net: &NetConf, key: &str) -> Result<Option<Map<String, Value>>, Error> {
    match net
        .member(key)
        .map(|raw| serde_json::from_str::<Value>(raw.get()))
    {
        None => Ok(None),
        Some(Ok(Value::Object(object))) => Ok(Some(object)),
        Some(_) => Err(invalid(format!("\"{key}\" must be an object"))),
    }
}

fn invalid(reason: String) -> Error {
    cni::Error::InvalidConfig(reason).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(args: &str) -> Environment {
        let args = args.to_owned();
        Environment::from_vars(move |name| match name {
            "CNI_COMMAND" => Some("ADD".into()),
            "CNI_CONTAINERID" => Some("c".into()),
            "CNI_NETNS" => Some("/n".into()),
            "CNI_IFNAME" => Some("eth0".into()),
            "CNI_PATH" => Some("/p".into()),
            "CNI_ARGS" => Some(args.clone().into()),
            _ => None,
        })
        .unwrap()
        .unwrap()
    }

    fn config(extra: Value) -> Vec<u8> {
        let mut config = json!({
            "cniVersion": "1.0.0",
            "name": "n",
            "ipam": {
                "type": "ipam-delegated",
                "static": {
                    "default": [{"name": "blue"}, {"name": "blue6"}],
                    "rules": [
                        {"args": {"K8S_POD_NAMESPACE": ["payments", "ledger"]}, "pools": [{"name": "red"}]},
                        {"runtimeConfig": {"tier": "edge"}, "pools": [{"name": "edge", "subnet": "10.9.0.0/24"}]},
                    ],
                },
                "pool": {"pools": {"blue": [{"subnet": "10.1.0.0/24"}], "blue6": [{"subnet": "fd00::/64"}]}},
            },
        });
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        config.to_string().into_bytes()
    }

    fn chosen(args: &str, extra: Value) -> Result<Value, Error> {
        let raw = config(extra);
        let net = NetConf::parse(&raw).unwrap();
        let pools = select(&env(args), &net)?;
        Ok(serde_json::from_slice(&result(&net, &pools)).unwrap())
    }

    #[test]
    fn the_first_matching_rule_wins_else_the_default() {
        let pools = |args, extra| chosen(args, extra).unwrap()["pools"].clone();
        assert_eq!(
            pools("K8S_POD_NAMESPACE=ledger", json!({})),
            json!([{"name": "red"}])
        );
        assert_eq!(
            pools(
                "K8S_POD_NAMESPACE=ledger",
                json!({"runtimeConfig": {"tier": "edge"}})
            ),
            json!([{"name": "red"}]),
            "the first of two matching rules"
        );
        assert_eq!(
            pools(
                "K8S_POD_NAMESPACE=web",
                json!({"runtimeConfig": {"tier": "edge"}})
            ),
            json!([{"name": "edge", "subnet": "10.9.0.0/24"}])
        );
        assert_eq!(
            pools("", json!({})),
            json!([{"name": "blue"}, {"name": "blue6"}])
        );
    }

    #[test]
    fn a_requested_address_goes_to_the_pool_that_gives_it() {
        let result = chosen("IgnoreUnknown=1;IP=fd00::9/64,10.1.0.9", json!({})).unwrap();
        assert_eq!(
            result["pools"],
            json!([{"name": "blue", "requested-ip": "10.1.0.9"}, {"name": "blue6", "requested-ip": "fd00::9"}])
        );
        let result = chosen(
            "",
            json!({"runtimeConfig": {"tier": "edge", "ips": ["10.9.0.7/24"]}}),
        )
        .unwrap();
        assert_eq!(result["pools"][0]["requested-ip"], "10.9.0.7");
        // red's ranges are not known here: the only unknown pool takes it.
        let result = chosen("K8S_POD_NAMESPACE=payments;IP=10.5.0.5", json!({})).unwrap();
        assert_eq!(result["pools"][0]["requested-ip"], "10.5.0.5");
        let e = chosen("IP=10.7.7.7", json!({})).unwrap_err();
        assert!(
            e.to_string()
                .contains("no one pool chosen is known to give it"),
            "{e}"
        );
    }

    #[test]
    fn the_previous_result_is_kept_and_pools_set() {
        let prev = json!({"cniVersion": "0.4.0", "ips": [], "dns": {"domain": "x"}, "pools": [{"name": "old"}]});
        let raw = config(json!({"prevResult": prev}));
        let net = NetConf::parse(&raw).unwrap();
        let text = String::from_utf8(result(&net, &select(&env(""), &net).unwrap())).unwrap();
        assert_eq!(
            text,
            r#"{"cniVersion":"1.0.0","ips":[],"dns":{"domain":"x"},"pools":[{"name":"blue"},{"name":"blue6"}]}"#
        );
        let raw = config(json!({}));
        let net = NetConf::parse(&raw).unwrap();
        let text = String::from_utf8(result(&net, &select(&env(""), &net).unwrap())).unwrap();
        assert_eq!(
            text,
            r#"{"cniVersion":"1.0.0","ips":[],"pools":[{"name":"blue"},{"name":"blue6"}]}"#
        );
    }

    #[test]
    fn bad_settings_are_code_7_and_named() {
        let bad = |static_settings: Value| {
            let mut raw: Value = serde_json::from_slice(&config(json!({}))).unwrap();
            raw["ipam"]["static"] = static_settings;
            let raw = raw.to_string().into_bytes();
            select(&env(""), &NetConf::parse(&raw).unwrap()).unwrap_err()
        };
        for (settings, said) in [
            (
                json!({}),
                "no rule of \"ipam.static\" matches, and it has no \"default\"",
            ),
            (
                json!({"default": []}),
                "\"ipam.static.default\" must be a non-empty array",
            ),
            (
                json!({"rules": [{"pools": [{"name": "x", "subnet": "10.0.0.1/24"}]}]}),
                "not a network address",
            ),
            (
                json!({"rules": [{"args": {"A": 1}, "pools": [{"name": "x"}]}]}),
                "must be a string or a list",
            ),
            (json!({"default": [{"name": "../x"}]}), "pool name \"../x\""),
            (json!(3), "\"ipam.static\" must be an object"),
        ] {
            let e = bad(settings.clone());
            assert_eq!(e.code(), 7, "{settings}");
            assert!(e.to_string().contains(said), "{settings}: {e}");
        }
    }
}
