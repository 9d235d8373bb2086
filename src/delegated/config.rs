//! The plugin's configuration: the common keys (see [`NetConf`]) plus the
//! `ipam` keys it reads, checked. Also loads a configuration file (or one
//! network of a directory of them), as a main plugin would pass it on,
//! for agent mode and the doctor.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::value::RawValue;

use crate::cni::{self, string, Members, NetConf};
use crate::delegated::error::DelegatedError;
use crate::netd;

/// A configuration, its common keys and the plugin's own checked.
#[derive(Debug)]
pub struct Config<'a> {
    /// The network configuration, every member kept as written.
    pub net: NetConf<'a>,
    /// `ipam.delegates`: names to look up in CNI_PATH, in the order to run them.
    pub delegates: Vec<String>,
    /// `ipam.timeout`: how long one delegate call may take.
    pub timeout: Option<Duration>,
    /// `ipam.stateDir`: where agent mode keeps its attachments, if set.
    pub state_dir: Option<PathBuf>,
}

impl<'a> Config<'a> {
    /// Parses and checks a configuration: the common keys first (codes 6,
    /// then 1, then 7), then the plugin's own (7).
    pub fn parse(raw: &'a [u8]) -> Result<Self, cni::Error> {
        Self::from_net(NetConf::parse(raw)?)
    }

    /// Checks the plugin's own keys of `net`, whose common keys are checked.
    pub fn from_net(net: NetConf<'a>) -> Result<Self, cni::Error> {
        let ipam = net
            .object("ipam")?
            .ok_or_else(|| invalid_config("\"ipam\" is missing".into()))?;
        Ok(Config {
            delegates: delegates(&ipam)?,
            timeout: ipam.get("timeout").map(timeout).transpose()?,
            state_dir: ipam.get("stateDir").map(state_dir).transpose()?,
            net,
        })
    }
}

fn invalid_config(reason: String) -> cni::Error {
    cni::Error::InvalidConfig(reason)
}

/// `ipam.delegates`: a non-empty array of names, each safe to look up as a
/// file name in a CNI_PATH directory.
fn delegates(ipam: &Members) -> Result<Vec<String>, cni::Error> {
    let list = ipam
        .get("delegates")
        .ok_or_else(|| invalid_config("\"ipam.delegates\" is missing".into()))?;
    let list: Vec<&RawValue> = serde_json::from_str(list.get()).map_err(|_| {
        invalid_config("\"ipam.delegates\" must be an array of plugin names".into())
    })?;
    if list.is_empty() {
        return Err(invalid_config("\"ipam.delegates\" is empty".into()));
    }
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            let name = string(entry).ok_or_else(|| {
                invalid_config(format!(
                    "\"ipam.delegates\"[{i}] must be a plugin name, not {}",
                    entry.get()
                ))
            })?;
            check_delegate_name(&name)?;
            Ok(name)
        })
        .collect()
}

/// `ipam.timeout`: seconds, from a millisecond (less rounds to nothing) to
/// a day (more is no bound a runtime waits for, and far more would overflow
/// a deadline).
fn timeout(value: &RawValue) -> Result<Duration, cni::Error> {
    const RANGE: std::ops::RangeInclusive<f64> = 0.001..=86_400.0;
    serde_json::from_str::<f64>(value.get())
        .ok()
        .filter(|seconds| RANGE.contains(seconds))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            invalid_config(format!(
                "\"ipam.timeout\" must be a number of seconds from 0.001 to 86400, not {}",
                value.get()
            ))
        })
}

/// `ipam.stateDir`: an absolute directory.
fn state_dir(value: &RawValue) -> Result<PathBuf, cni::Error> {
    string(value)
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .ok_or_else(|| {
            invalid_config(format!(
                "\"ipam.stateDir\" must be an absolute directory, not {}",
                value.get()
            ))
        })
}

/// Names select files inside CNI_PATH directories and must not leave them.
fn check_delegate_name(name: &str) -> Result<(), cni::Error> {
    let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']);
    if bad {
        Err(invalid_config(format!(
            "delegate name {name:?} is not a plain file name (empty, '.', '..', or holds '/', '\\' or NUL)"
        )))
    } else {
        Ok(())
    }
}

/// The plugin of a configuration that is ipam-delegated.
pub(crate) const OURS: netd::Ours = netd::Ours {
    described: "whose ipam.type is ipam-delegated",
    several: "networks whose ipam.type is ipam-delegated",
    is_ours: |ipam| ipam["type"] == "ipam-delegated",
};

/// The stdin a main plugin would give the plugin for the network at
/// `path`: a file, or a directory of them, as libcni reads net.d, of which
/// `network` picks one by name (the only one there if it names none).
/// From a list, its one plugin whose `ipam.type` is ipam-delegated, with
/// the list's cniVersion and name, as libcni derives it; or the file's own
/// object.
pub(crate) fn load(path: &Path, network: Option<&str>) -> Result<Vec<u8>, DelegatedError> {
    if network.is_none() && !path.is_dir() {
        // Read as given, checked later, so that a broken file is named
        // with what is wrong in it.
        return Ok(netd::load(path, &OURS)?);
    }
    let name_of = |stdin: &[u8]| -> Result<String, DelegatedError> {
        Ok(NetConf::parse(stdin)?.name.to_owned())
    };
    Ok(netd::pick(path, &OURS, network, name_of)?.stdin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{code, Reportable};

    const GOOD: &str = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b"]}}"#;

    fn parse_err(text: &str) -> cni::Error {
        Config::parse(text.as_bytes()).expect_err("should be refused")
    }

    #[test]
    fn a_good_config_is_read() {
        let text = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b"],"stateDir":"/s"}}"#;
        let c = Config::parse(text.as_bytes()).unwrap();
        assert_eq!(c.net.cni_version, "1.0.0");
        assert_eq!(c.delegates, ["a", "b"]);
        assert_eq!(c.state_dir, Some(PathBuf::from("/s")));
        assert_eq!(c.net.raw, text.as_bytes());
    }

    #[test]
    fn duplicated_keys_read_as_the_last_one() {
        let text =
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["x"],"delegates":["a"]}}"#;
        assert_eq!(Config::parse(text.as_bytes()).unwrap().delegates, ["a"]);
    }

    #[test]
    fn delegates_must_be_a_non_empty_list_of_names() {
        let cases = [
            (r#""ipam":{}"#, "is missing"),
            (r#""ipam":3"#, "\"ipam\" must be an object"),
            (r#""ipam":{"delegates":"a"}"#, "must be an array"),
            (r#""ipam":{"delegates":[]}"#, "is empty"),
            (
                r#""ipam":{"delegates":["a",1]}"#,
                "[1] must be a plugin name, not 1",
            ),
            (
                r#""ipam":{"delegates":[null]}"#,
                "[0] must be a plugin name, not null",
            ),
        ];
        for (ipam, expect) in cases {
            let text = format!(r#"{{"cniVersion":"0.3.1","name":"n",{ipam}}}"#);
            let e = parse_err(&text);
            assert_eq!(e.code(), code::INVALID_CONFIG, "{ipam}");
            assert!(e.to_string().contains(expect), "{ipam}: {e}");
        }
        let e = parse_err(r#"{"cniVersion":"0.3.1","name":"n"}"#);
        assert!(e.to_string().contains("\"ipam\" is missing"));
    }

    #[test]
    fn timeout_is_seconds_from_a_millisecond_to_a_day() {
        let with = |t: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"delegates":["a"],"timeout":{t}}}}}"#
            )
        };
        let input = with("2.5");
        let c = Config::parse(input.as_bytes()).unwrap();
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(Config::parse(GOOD.as_bytes()).unwrap().timeout, None);
        let input = with("86400");
        let c = Config::parse(input.as_bytes()).unwrap();
        assert_eq!(c.timeout, Some(Duration::from_secs(86_400)));
        let bad = [
            "0", "-1", "\"5\"", "null", "true", "[1]", "{}", "1e400", "1e300", "-0.0", "1e19",
            "9.3e18", "1e-300", "0.0009", "86400.5",
        ];
        for bad in bad {
            let e = parse_err(&with(bad));
            assert_eq!(e.code(), code::INVALID_CONFIG, "{bad}");
            let expected = "\"ipam.timeout\" must be a number of seconds from 0.001 to 86400";
            assert!(e.to_string().contains(expected), "{e}");
        }
    }

    #[test]
    fn names_that_could_leave_cni_path_are_refused() {
        for name in ["", ".", "..", "../x", "a/b", "/bin/sh", "a\\b", "a\u{0}b"] {
            let e = check_delegate_name(name).unwrap_err();
            assert_eq!(e.code(), code::INVALID_CONFIG, "{name:?}");
        }
        for name in ["host-local", "ipam-ds-x", "...", "a.b", "é"] {
            assert!(check_delegate_name(name).is_ok(), "{name:?}");
        }
    }
}
