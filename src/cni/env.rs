//! The environment a runtime sets for a plugin: which command, and the
//! CNI_* variables that command needs, checked against the
//! specification's rules.

use std::ffi::OsString;
use std::path::PathBuf;

use super::command::Command;
use super::error::Error;

const COMMAND: &str = "CNI_COMMAND";
const CONTAINER_ID: &str = "CNI_CONTAINERID";
const NETNS: &str = "CNI_NETNS";
const IFNAME: &str = "CNI_IFNAME";
const ARGS: &str = "CNI_ARGS";
const PATH: &str = "CNI_PATH";

/// Where plugins are looked for when CNI_PATH is not set (libcni's and
/// every runtime's default).
const DEFAULT_PATH: &str = "/opt/cni/bin";

/// Linux's IFNAMSIZ less the terminating NUL.
const MAX_IFNAME_LEN: usize = 15;

/// The variables a runtime must set for `command`. DEL leaves out
/// CNI_NETNS: the namespace may be gone, and containerd sends it empty.
/// GC and STATUS concern no one attachment, so need only CNI_PATH.
fn required(command: Command) -> &'static [&'static str] {
    match command {
        Command::Add | Command::Check => &[CONTAINER_ID, NETNS, IFNAME, PATH],
        Command::Del => &[CONTAINER_ID, IFNAME, PATH],
        Command::Gc | Command::Status => &[PATH],
        Command::Version => &[],
    }
}

/// A plugin invocation's CNI_* variables, checked. Everything else in the
/// environment (and these, as they are) is the plugin's to pass on.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The command to run.
    pub command: Command,
    /// CNI_CONTAINERID, when the command needs it.
    pub container_id: Option<String>,
    /// CNI_NETNS, when set and not empty.
    pub netns: Option<String>,
    /// CNI_IFNAME, when the command needs it.
    pub ifname: Option<String>,
    /// CNI_ARGS, when set and not empty.
    pub args: Option<String>,
    /// The CNI_PATH directories in order, empty entries dropped.
    pub path: Vec<PathBuf>,
}

impl Environment {
    /// CNI_ARGS as its `KEY=VALUE` pairs (separated by ';'), in order; a
    /// pair without '=' is no pair.
    pub fn arg_pairs(&self) -> Vec<(&str, &str)> {
        self.args
            .as_deref()
            .unwrap_or_default()
            .split(';')
            .filter_map(|pair| pair.split_once('='))
            .collect()
    }

    /// Reads and checks the variables through `var`; `Ok(None)` when
    /// CNI_COMMAND is unset or empty, which is not a CNI invocation at all.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Option<Self>, Error> {
        let Some(name) = var(COMMAND).filter(|c| !c.is_empty()) else {
            return Ok(None);
        };
        let name = name.to_string_lossy();
        let command = Command::parse(&name).ok_or_else(|| Error::UnknownCommand(name.into()))?;
        let optional = |name: &str| {
            var(name)
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string_lossy().into_owned())
        };
        let mut env = Environment {
            command,
            container_id: None,
            netns: optional(NETNS),
            ifname: None,
            args: optional(ARGS),
            path: Vec::new(),
        };
        // Every variable is checked, so that one error names them all.
        let mut problems = Vec::new();
        for &required in required(command) {
            let Some(value) = var(required).filter(|v| !v.is_empty()) else {
                problems.push(Error::MissingVariable(required));
                continue;
            };
            let Ok(value) = value.into_string() else {
                problems.push(invalid_variable(required, "not valid UTF-8"));
                continue;
            };
            let checked = match required {
                CONTAINER_ID => check_container_id(CONTAINER_ID, &value)
                    .map(|()| env.container_id = Some(value)),
                IFNAME => check_ifname(IFNAME, &value).map(|()| env.ifname = Some(value)),
                PATH => {
                    env.path = search_path(&value);
                    if env.path.is_empty() {
                        Err(invalid_variable(
                            PATH,
                            format!("{value:?} names no directory"),
                        ))
                    } else {
                        Ok(())
                    }
                }
                _ => Ok(()),
            };
            problems.extend(checked.err());
        }
        match Error::from_variables(problems) {
            Some(error) => Err(error),
            None => Ok(Some(env)),
        }
    }
}

fn invalid_variable(name: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidVariable {
        name,
        reason: reason.into(),
    }
}

/// CNI_PATH for a plugin run outside a runtime (agent mode, a doctor):
/// the variable's `value` when set and not empty, else where runtimes look
/// by default.
pub fn path_outside_runtime(value: Option<OsString>) -> String {
    value
        .filter(|p| !p.is_empty())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| DEFAULT_PATH.into())
}

/// A CNI_PATH value's directories, in order, empty entries dropped.
pub fn search_path(value: &str) -> Vec<PathBuf> {
    value
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The specification's rule for container IDs and network names,
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`: what can also name a file safely.
pub fn is_identifier(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// How [`is_identifier`] is explained when a value breaks it.
pub const IDENTIFIER_RULE: &str =
    "must start with a letter or digit and hold only letters, digits, '_', '.' and '-'";

/// A container ID must be an identifier; `name` is what the value is
/// called in the error.
pub fn check_container_id(name: &'static str, id: &str) -> Result<(), Error> {
    if is_identifier(id) {
        Ok(())
    } else {
        Err(invalid_variable(name, format!("{id:?} {IDENTIFIER_RULE}")))
    }
}

/// The rules Linux puts on an interface name, as the specification
/// restates them; `label` is what the value is called in the error.
pub fn check_ifname(label: &'static str, name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_IFNAME_LEN {
        "is longer than 15 bytes"
    } else if name == "." || name == ".." {
        "cannot be '.' or '..'"
    } else if name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace()) {
        "cannot contain '/', ':' or whitespace"
    } else {
        return Ok(());
    };
    Err(invalid_variable(label, format!("{name:?} {reason}")))
}

/// An ADD's environment for the tests, with `args` as CNI_ARGS.
#[cfg(test)]
pub fn add_with_args(args: &str) -> Environment {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<Option<Environment>, Error> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Environment::from_vars(|k| map.get(k).cloned())
    }

    fn full(command: &str) -> Vec<(&str, &str)> {
        vec![
            (COMMAND, command),
            (CONTAINER_ID, "ctr-1"),
            (NETNS, "/var/run/netns/x"),
            (IFNAME, "eth0"),
            (PATH, "/opt/cni/bin:/usr/lib/cni"),
        ]
    }

    fn without<'a>(mut pairs: Vec<(&'a str, &'a str)>, name: &str) -> Vec<(&'a str, &'a str)> {
        pairs.retain(|(k, _)| *k != name);
        pairs
    }

    fn with<'a>(
        mut pairs: Vec<(&'a str, &'a str)>,
        name: &'a str,
        value: &'a str,
    ) -> Vec<(&'a str, &'a str)> {
        pairs.retain(|(k, _)| *k != name);
        pairs.push((name, value));
        pairs
    }

    fn err(pairs: &[(&str, &str)]) -> Error {
        env_of(pairs).expect_err("should be refused")
    }

    #[test]
    fn no_command_is_not_an_invocation() {
        assert!(env_of(&[]).unwrap().is_none());
        assert!(env_of(&[(COMMAND, "")]).unwrap().is_none());
    }

    #[test]
    fn an_unknown_command_is_code_4() {
        let e = err(&[(COMMAND, "FROB")]);
        assert_eq!(e.code(), code::INVALID_ENVIRONMENT);
        assert!(e.to_string().contains("FROB"));
    }

    #[test]
    fn add_reads_everything_it_needs() {
        let env = env_of(&with(full("ADD"), ARGS, "K8S_POD_NAME=p"))
            .unwrap()
            .unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.container_id.as_deref(), Some("ctr-1"));
        assert_eq!(env.netns.as_deref(), Some("/var/run/netns/x"));
        assert_eq!(env.ifname.as_deref(), Some("eth0"));
        assert_eq!(env.args.as_deref(), Some("K8S_POD_NAME=p"));
        assert_eq!(
            env.path,
            [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        // Empty is unset, for the optional ones too.
        let env = env_of(&with(without(full("DEL"), NETNS), ARGS, ""))
            .unwrap()
            .unwrap();
        assert_eq!((env.netns, env.args), (None, None));
    }

    #[test]
    fn outside_a_runtime_cni_path_defaults_to_where_runtimes_look() {
        assert_eq!(path_outside_runtime(None), "/opt/cni/bin");
        assert_eq!(path_outside_runtime(Some("".into())), "/opt/cni/bin");
        assert_eq!(path_outside_runtime(Some("/a:/b".into())), "/a:/b");
    }

    #[test]
    fn each_required_variable_missing_or_empty_is_named() {
        for command in ["ADD", "CHECK", "DEL", "GC", "STATUS"] {
            for &name in required(Command::parse(command).unwrap()) {
                for pairs in [without(full(command), name), with(full(command), name, "")] {
                    let e = err(&pairs);
                    assert_eq!(e.code(), code::INVALID_ENVIRONMENT, "{command} {name}");
                    assert_eq!(e.to_string(), format!("{name} is not set"));
                }
            }
        }
    }

    #[test]
    fn every_missing_or_invalid_variable_is_named_in_one_error() {
        let pairs = with(
            without(without(full("ADD"), NETNS), PATH),
            CONTAINER_ID,
            "-bad",
        );
        let e = err(&with(pairs, IFNAME, ""));
        assert_eq!(e.code(), code::INVALID_ENVIRONMENT);
        assert_eq!(
            e.to_string(),
            "CNI_CONTAINERID is invalid: \"-bad\" must start with a letter or digit and hold only letters, digits, '_', '.' and '-'; \
             CNI_NETNS is not set; CNI_IFNAME is not set; CNI_PATH is not set"
        );
    }

    #[test]
    fn del_needs_no_netns() {
        assert!(env_of(&without(full("DEL"), NETNS)).unwrap().is_some());
        assert!(env_of(&with(full("DEL"), NETNS, "")).unwrap().is_some());
        assert_eq!(
            err(&without(full("ADD"), NETNS)).to_string(),
            "CNI_NETNS is not set"
        );
    }

    #[test]
    fn gc_and_status_need_only_cni_path() {
        for command in ["GC", "STATUS"] {
            let env = env_of(&[(COMMAND, command), (PATH, "/opt/cni/bin")])
                .unwrap()
                .unwrap();
            assert_eq!(env.command.as_str(), command);
            assert_eq!(env.container_id, None);
            let e = err(&[(COMMAND, command)]);
            assert_eq!(e.to_string(), "CNI_PATH is not set");
        }
    }

    #[test]
    fn version_needs_nothing_else() {
        let env = env_of(&[(COMMAND, "VERSION")]).unwrap().unwrap();
        assert_eq!(env.command, Command::Version);
        assert!(env.path.is_empty());
    }

    #[test]
    fn container_ids_follow_the_spec_pattern() {
        for good in ["a", "0", "abc-DEF_1.2", "x..y"] {
            assert!(check_container_id(CONTAINER_ID, good).is_ok(), "{good}");
        }
        for bad in ["-a", "_a", ".a", "a b", "a/b", "a:b", "é", "a\n"] {
            let e = check_container_id(CONTAINER_ID, bad).unwrap_err();
            assert_eq!(e.code(), code::INVALID_ENVIRONMENT, "{bad}");
            assert!(
                e.to_string().starts_with("CNI_CONTAINERID is invalid"),
                "{bad}"
            );
        }
    }

    #[test]
    fn interface_names_follow_the_kernel_rules() {
        for good in ["eth0", "a", "123456789012345", "net1.100", "veth-x_y"] {
            assert!(check_ifname(IFNAME, good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1234567890123456",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
        ] {
            let e = check_ifname(IFNAME, bad).unwrap_err();
            assert!(e.to_string().starts_with("CNI_IFNAME is invalid"), "{bad}");
        }
    }

    #[test]
    fn malformed_variables_are_refused_through_from_vars() {
        let e = err(&with(full("DEL"), CONTAINER_ID, "../x"));
        assert!(e.to_string().contains("CNI_CONTAINERID"));
        let e = err(&with(full("CHECK"), IFNAME, "way-too-long-ifname"));
        assert!(e.to_string().contains("CNI_IFNAME"));
    }

    #[test]
    fn empty_path_entries_are_dropped_and_a_path_of_none_is_refused() {
        let env = env_of(&with(full("ADD"), PATH, ":/a::b:"))
            .unwrap()
            .unwrap();
        assert_eq!(env.path, [PathBuf::from("/a"), PathBuf::from("b")]);
        let e = err(&with(full("ADD"), PATH, ":::"));
        assert!(e.to_string().starts_with("CNI_PATH is invalid"));
    }

    #[test]
    fn non_utf8_values_are_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff]);
        let e = Environment::from_vars(|k| match k {
            COMMAND => Some("DEL".into()),
            CONTAINER_ID => Some(bad.clone()),
            _ => Some("x".into()),
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "CNI_CONTAINERID is invalid: not valid UTF-8");
    }
}
