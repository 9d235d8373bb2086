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

use crate::addr::Addr;
use crate::args::{Program, Verb};
use crate::cni::{Environment, Error, NetConf};
use crate::pools::{requested_by_runtime, Pool, Wanted};
use crate::skel::{self, Plugin};

/// Its command line: no command of its own, but `--help`, `--version`
/// and its manual page, as every binary of the family has.
pub const PROGRAM: Program = Program {
    name: "ipam-ds-static",
    purpose: "a CNI IPAM plugin that selects the pools an attachment's addresses come from",
    description: "\
A runtime (or ipam-delegated) runs it with CNI_COMMAND set. It reads
its rules from ipam.static: the first rule whose CNI_ARGS keys or
runtimeConfig values match gives its pools, else \"default\" does; its
ADD prints the previous result with those pools in \"pools\", the
address the runtime asks for set on the pool that gives it, for an
allocator such as ipam-da-pool. It keeps nothing: DEL, CHECK, GC and
STATUS print nothing.
",
    verbs: &[VALIDATE],
    notes: "",
    command: None,
};

/// `validate`: its settings checked, as the doctor of ipam-delegated
/// asks every delegate of the family.
const VALIDATE: Verb = skel::validate_verb(
    "\
Reads a plugin's configuration on stdin, as a runtime gives it,
and checks ipam.static whole, every rule and Pool object, as an
ADD does: exit 0, printing nothing, when it holds; else the CNI
error object an ADD would print (code 7, naming the key), and
exit 1. The doctor of ipam-delegated runs it.
",
    |_| Ok(skel::validate(|net| Settings::parse(net).map(drop))),
);

/// ipam-ds-static as a CNI plugin.
pub struct Selector;

impl Plugin for Selector {
    // It keeps nothing and runs nothing: every way it fails is a
    // configuration the protocol's rules refuse.
    type Error = Error;

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

/// A rule of `ipam.static.rules`, checked.
struct Rule {
    /// CNI_ARGS keys and the values each accepts.
    args: Vec<(String, Vec<String>)>,
    /// runtimeConfig keys and the value each must have.
    runtime: Map<String, Value>,
    pools: Vec<Value>,
}

impl Rule {
    /// Reads rule `i`, every part checked, whether it will match or not.
    fn parse(i: usize, rule: &Value) -> Result<Rule, Error> {
        let at = format!("\"ipam.static.rules\"[{i}]");
        let rule = rule
            .as_object()
            .ok_or_else(|| invalid(format!("{at} must be an object")))?;
        // A misspelt condition would leave a rule that matches every pod.
        refuse_unknown(rule, &RULE_KEYS, &at, "a rule")?;
        let args = match rule.get("args") {
            None => Vec::new(),
            Some(Value::Object(args)) => args
                .iter()
                .map(|(key, accepted)| {
                    let values = match accepted {
                        Value::String(one) => Some(vec![one.clone()]),
                        Value::Array(any) => {
                            any.iter().map(|a| a.as_str().map(String::from)).collect()
                        }
                        _ => None,
                    };
                    values.map(|v| (key.clone(), v)).ok_or_else(|| {
                        invalid(format!(
                            "{at}.args.{key} must be a string or a list of them"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid(format!("{at}.args must be an object"))),
        };
        let runtime = match rule.get("runtimeConfig") {
            None => Map::new(),
            Some(Value::Object(runtime)) => runtime.clone(),
            Some(_) => return Err(invalid(format!("{at}.runtimeConfig must be an object"))),
        };
        let pools = pools(rule.get("pools"), &format!("{at}.pools"))?;
        Ok(Rule {
            args,
            runtime,
            pools,
        })
    }

    /// Whether every `args` key has a value it accepts and every
    /// `runtimeConfig` key the value it gives.
    fn matches(&self, args: &[(&str, &str)], runtime: &Map<String, Value>) -> bool {
        let arg = |key: &str| args.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v);
        self.args
            .iter()
            .all(|(key, accepted)| arg(key).is_some_and(|v| accepted.iter().any(|a| a == v)))
            && self
                .runtime
                .iter()
                .all(|(key, value)| runtime.get(key) == Some(value))
    }
}

/// The keys of `ipam.static`.
const STATIC_KEYS: [&str; 2] = ["default", "rules"];

/// The keys of a rule; those inside its `args` and `runtimeConfig` are
/// the conditions the operator chooses.
const RULE_KEYS: [&str; 3] = ["args", "runtimeConfig", "pools"];

/// The keys of a Pool object written in `ipam.static`: its name, the
/// address asked for, an inline range's and the addresses it keeps back.
const POOL_OBJECT_KEYS: [&str; 8] = [
    "name",
    "requested-ip",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "exclude",
    "reserved",
];

/// Refuses a key of `object` (`at`, described as `what`) that is not one
/// of `keys`, naming it and the keys there are.
fn refuse_unknown(
    object: &Map<String, Value>,
    keys: &[&str],
    at: &str,
    what: &str,
) -> Result<(), Error> {
    match object.keys().find(|key| !keys.contains(&key.as_str())) {
        None => Ok(()),
        Some(key) => Err(invalid(format!(
            "{at} has unknown key {key:?}: {what} has {}",
            keys.iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `ipam.static`, checked whole: its rules, each whether it will match or
/// not, and its default.
struct Settings {
    rules: Vec<Rule>,
    default: Option<Vec<Value>>,
}

impl Settings {
    /// Reads `ipam.static` of `net`, every part checked, so that a mistake
    /// shows at the first ADD, not at the first attachment it would match.
    fn parse(net: &NetConf) -> Result<Settings, Error> {
        let ipam = object_member(net, "ipam")?.unwrap_or_default();
        Settings::of(&ipam)
    }

    fn of(ipam: &Map<String, Value>) -> Result<Settings, Error> {
        let settings = match ipam.get("static") {
            Some(Value::Object(settings)) => settings.clone(),
            Some(_) => return Err(invalid("\"ipam.static\" must be an object".into())),
            None => {
                return Err(invalid(
                    "\"ipam.static\" is missing: it holds the rules and the default".into(),
                ))
            }
        };
        refuse_unknown(&settings, &STATIC_KEYS, "\"ipam.static\"", "it")?;
        let rules: Vec<Rule> = match settings.get("rules") {
            None => Vec::new(),
            Some(Value::Array(rules)) => rules
                .iter()
                .enumerate()
                .map(|(i, rule)| Rule::parse(i, rule))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("\"ipam.static.rules\" must be an array".into())),
        };
        let default = match settings.get("default") {
            None => None,
            Some(list) => Some(pools(Some(list), "\"ipam.static.default\"")?),
        };
        Ok(Settings { rules, default })
    }
}

/// The Pool objects for this attachment: the first rule's that matches,
/// else the default's; with the runtime's requested addresses set.
fn select(env: &Environment, net: &NetConf) -> Result<Vec<Value>, Error> {
    let ipam = object_member(net, "ipam")?.unwrap_or_default();
    let Settings { rules, default } = Settings::of(&ipam)?;
    let runtime = object_member(net, "runtimeConfig")?.unwrap_or_default();
    let args = env.arg_pairs();
    let mut chosen = rules
        .into_iter()
        .find(|rule| rule.matches(&args, &runtime))
        .map(|rule| rule.pools)
        .or(default)
        .ok_or_else(|| {
            invalid("no rule of \"ipam.static\" matches, and it has no \"default\"".into())
        })?;
    let defined = ipam.get("pool").and_then(|p| p.get("pools")).cloned();
    for address in requested_by_runtime(env, net)? {
        place(&mut chosen, address, defined.as_ref());
    }
    Ok(chosen)
}

/// A list of Pool objects, each checked as the allocator reads it.
fn pools(list: Option<&Value>, what: &str) -> Result<Vec<Value>, Error> {
    let list = list
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| invalid(format!("{what} must be a non-empty array of pools")))?;
    for (i, pool) in list.iter().enumerate() {
        if let Some(object) = pool.as_object() {
            let at = format!("{what}[{i}]");
            refuse_unknown(object, &POOL_OBJECT_KEYS, &at, "a Pool object")?;
        }
        Wanted::parse(pool, what)?;
    }
    Ok(list.clone())
}

/// Sets `requested-ip` to `address` on the one chosen pool known to give
/// it (by its inline range or the configuration's `ipam.pool.pools`), or,
/// when none is known to, on the one chosen pool whose ranges are not
/// known here (the allocator's store may define it). Otherwise it is left
/// for the allocator to place, which reads the runtime's addresses too and
/// says what is wrong.
fn place(chosen: &mut [Value], address: Addr, defined: Option<&Value>) {
    // Every pool was checked by `pools`: parsing it again cannot fail.
    let ranges = |pool: &Value| -> Option<Pool> {
        let wanted = Wanted::parse(pool, "").ok()?;
        if wanted.inline.is_some() {
            return wanted.inline;
        }
        Pool::parse(&wanted.name, defined?.get(&wanted.name)?).ok()
    };
    let known: Vec<Option<Pool>> = chosen.iter().map(ranges).collect();
    let giving: Vec<usize> = (0..known.len())
        .filter(|i| {
            known[*i]
                .as_ref()
                .is_some_and(|p| p.range_of(address).is_some())
        })
        .collect();
    let unknown: Vec<usize> = (0..known.len()).filter(|i| known[*i].is_none()).collect();
    let index = match (giving.as_slice(), unknown.as_slice()) {
        ([one], _) | ([], [one]) => *one,
        _ => return,
    };
    let pool = &mut chosen[index];
    if pool.get("requested-ip").is_none() {
        pool["requested-ip"] = json!(address.to_string());
    }
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

/// A configuration error (code 7) saying `reason`.
fn invalid(reason: String) -> Error {
    Error::InvalidConfig(reason)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Reportable;

    fn env(args: &str) -> Environment {
        crate::cni::add_with_args(args)
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
        // Left for the allocator to place (or refuse, saying why): here no
        // chosen pool gives it, and there two unknown pools might.
        let result = chosen("IP=10.7.7.7", json!({})).unwrap();
        assert_eq!(
            result["pools"],
            json!([{"name": "blue"}, {"name": "blue6"}])
        );
        let mut two_unknown = json!({"runtimeConfig": {"tier": "edge"}});
        two_unknown["ipam"] = json!({"static": {"rules": [{"runtimeConfig": {"tier": "edge"}, "pools": [{"name": "x"}, {"name": "y"}]}]}});
        let raw = config(two_unknown);
        let net = NetConf::parse(&raw).unwrap();
        let pools = select(&env("IP=10.8.0.1"), &net).unwrap();
        assert_eq!(Value::Array(pools), json!([{"name": "x"}, {"name": "y"}]));
    }

    #[test]
    fn every_rule_is_checked_even_after_one_matches() {
        let mut bad_later = json!({});
        bad_later["ipam"] = json!({"static": {"rules": [
            {"pools": [{"name": "all"}]},
            {"args": {"K": 3}, "pools": [{"name": "never"}]},
        ]}});
        let raw = config(bad_later);
        let e = select(&env(""), &NetConf::parse(&raw).unwrap()).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"ipam.static.rules\"[1].args.K must be a string"),
            "{e}"
        );
    }

    #[test]
    fn conditions_and_a_previous_results_pools_are_the_operators_own() {
        // Keys inside args and runtimeConfig are conditions, whatever they
        // are called; the previous result's Pool objects keep their members.
        let mut own = json!({"runtimeConfig": {"any-key": "x"}});
        own["ipam"] = json!({"static": {"rules": [
            {"args": {"ANY_KEY": "v"}, "runtimeConfig": {"any-key": "x"}, "pools": [{"name": "a"}]},
        ]}});
        own["prevResult"] =
            json!({"cniVersion": "1.0.0", "ips": [], "pools": [{"name": "p", "vendor": 1}]});
        let raw = config(own);
        let net = NetConf::parse(&raw).unwrap();
        assert_eq!(
            select(&env("ANY_KEY=v"), &net).unwrap(),
            [json!({"name": "a"})]
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
            // A misspelt key anywhere the settings are ours: named, never
            // dropped (a rule without its condition would match every pod).
            (
                json!({"default": [{"name": "general"}],
                       "rules": [{"arg": {"K8S_POD_NAMESPACE": "payments"}, "pools": [{"name": "pci"}]}]}),
                "\"ipam.static.rules\"[0] has unknown key \"arg\": a rule has \"args\", \"runtimeConfig\", \"pools\"",
            ),
            (
                json!({"default": [{"name": "general"}], "rule": []}),
                "\"ipam.static\" has unknown key \"rule\": it has \"default\", \"rules\"",
            ),
            (
                json!({"default": [{"name": "x", "subnet": "10.0.0.0/24", "exlcude": ["10.0.0.9"]}]}),
                "\"ipam.static.default\"[0] has unknown key \"exlcude\": a Pool object has",
            ),
            (
                json!({"rules": [{"pools": [{"name": "x", "requested_ip": "10.0.0.9"}]}]}),
                "\"ipam.static.rules\"[0].pools[0] has unknown key \"requested_ip\"",
            ),
        ] {
            let e = bad(settings.clone());
            assert_eq!(e.code(), 7, "{settings}");
            assert!(e.to_string().contains(said), "{settings}: {e}");
        }
    }
}
