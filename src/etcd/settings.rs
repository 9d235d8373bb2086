//! How to reach an etcd cluster, as `ipam.pool.etcd` says: its endpoints,
//! the key prefix, TLS with a client certificate, the timeout of a call,
//! the user to sign in as and its password's file.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::http::tls::TlsFiles;

/// How long one call may take unless the settings say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where keys go unless the settings say.
const DEFAULT_PREFIX: &str = "/ipam-da-pool";

/// The keys of the settings.
const KEYS: [&str; 6] = [
    "endpoints",
    "prefix",
    "tls",
    "timeout",
    "username",
    "passwordFile",
];

/// How to reach a cluster: `{"endpoints", "prefix"?, "tls"?: {"ca", "cert"?,
/// "key"?}, "timeout"?, "username"?, "passwordFile"?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// The members' client addresses, tried in turn.
    pub endpoints: Vec<Endpoint>,
    /// Every key the pools keep starts with it.
    pub prefix: String,
    /// The CA, and this client's certificate, for HTTPS endpoints.
    pub tls: Option<TlsFiles>,
    /// How long one call may take, across endpoints.
    pub timeout: Duration,
    /// The user to sign in as, and the file that holds its password,
    /// when the cluster has authentication enabled.
    pub credentials: Option<(String, PathBuf)>,
}

/// One member's client address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// A name or an address (IPv6 without brackets).
    pub host: String,
    /// The client port.
    pub port: u16,
    /// Whether it speaks HTTPS.
    pub tls: bool,
}

impl EtcdSettings {
    /// Reads the settings; the error says which one is wrong.
    pub fn parse(value: &Value) -> Result<EtcdSettings, String> {
        let object = value.as_object().ok_or("must be an object")?;
        if let Some(key) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key {key:?}: the settings have {}",
                KEYS.map(|k| format!("{k:?}")).join(", ")
            ));
        }
        let tls = match object.get("tls") {
            None => None,
            Some(tls) => Some(TlsFiles::parse(tls)?),
        };
        let endpoints = object
            .get("endpoints")
            .and_then(Value::as_array)
            .filter(|list| !list.is_empty())
            .ok_or("\"endpoints\" must be a non-empty array of addresses")?
            .iter()
            .map(|endpoint| {
                let text = endpoint
                    .as_str()
                    .ok_or_else(|| format!("endpoint {endpoint} is not a string"))?;
                Endpoint::parse(text, tls.is_some())
            })
            .collect::<Result<Vec<_>, String>>()?;
        if endpoints.iter().any(|e| e.tls) && tls.is_none() {
            return Err("an https endpoint needs \"tls\" with the cluster's \"ca\"".into());
        }
        let prefix = match object.get("prefix") {
            None => DEFAULT_PREFIX.to_owned(),
            Some(Value::String(prefix)) if prefix.starts_with('/') && !prefix.ends_with('/') => {
                prefix.clone()
            }
            Some(other) => {
                return Err(format!(
                    "\"prefix\" must start with '/' and not end with one, not {other}"
                ))
            }
        };
        let timeout = match object.get("timeout") {
            None => DEFAULT_TIMEOUT,
            Some(seconds) => seconds
                .as_f64()
                .filter(|s| (0.001..=3600.0).contains(s))
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    format!("\"timeout\" must be seconds from 0.001 to 3600, not {seconds}")
                })?,
        };
        let credentials = match (object.get("username"), object.get("passwordFile")) {
            (None, None) => None,
            (Some(Value::String(user)), Some(Value::String(file)))
                if !user.is_empty() && file.starts_with('/') =>
            {
                Some((user.clone(), file.into()))
            }
            (user, file) => {
                return Err(format!(
                    "\"username\" (a name) and \"passwordFile\" (an absolute file name) go together, not {} and {}",
                    user.unwrap_or(&Value::Null),
                    file.unwrap_or(&Value::Null)
                ))
            }
        };
        // A password sent in clear would be anyone's on the way; on this
        // host's own loopback nothing is on the way.
        if credentials.is_some() {
            if let Some(clear) = endpoints.iter().find(|e| !e.tls && !e.is_loopback()) {
                return Err(format!(
                    "endpoint {clear} is plain HTTP: the password of \"username\" would cross the network in clear; give the endpoints as https:// with \"tls\""
                ));
            }
        }
        Ok(EtcdSettings {
            endpoints,
            prefix,
            tls,
            timeout,
            credentials,
        })
    }

    /// The endpoints, as a list for messages.
    pub fn described(&self) -> String {
        let list: Vec<String> = self.endpoints.iter().map(ToString::to_string).collect();
        list.join(", ")
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl Endpoint {
    /// Whether it is this host's own loopback (127.0.0.0/8, ::1 or
    /// localhost), which no other host sees.
    fn is_loopback(&self) -> bool {
        crate::http::client::is_loopback(&self.host)
    }

    /// `http://HOST:PORT`, `https://HOST:PORT`, or `HOST:PORT` (TLS when
    /// the settings have `tls`); an IPv6 host in brackets.
    fn parse(text: &str, tls_by_default: bool) -> Result<Endpoint, String> {
        let (tls, rest) = match text.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => {
                return Err(format!(
                    "endpoint {text}: scheme {scheme} is neither http nor https"
                ))
            }
            None => (tls_by_default, text),
        };
        let rest = rest.trim_end_matches('/');
        let bad = || format!("endpoint {text} is not HOST:PORT");
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port.parse().map_err(|_| bad())?;
        if host.is_empty() || host.contains('/') {
            return Err(bad());
        }
        Ok(Endpoint {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_are_checked_and_named() {
        let s = EtcdSettings::parse(&json!({"endpoints": ["127.0.0.1:2379", "http://[::1]:2379"]}))
            .unwrap();
        assert_eq!(s.endpoints[1].host, "::1");
        assert_eq!(
            (s.prefix.as_str(), s.timeout),
            (DEFAULT_PREFIX, DEFAULT_TIMEOUT)
        );
        let s = EtcdSettings::parse(&json!({"endpoints": ["10.0.0.1:2379"], "tls": {"ca": "/ca.pem", "cert": "/c.pem", "key": "/k.pem"}})).unwrap();
        assert!(s.endpoints[0].tls, "TLS settings make TLS the default");
        for (settings, said) in [
            (json!({"endpoints": []}), "\"endpoints\""),
            (
                json!({"endpoints": ["ftp://x:1"]}),
                "neither http nor https",
            ),
            (json!({"endpoints": ["x"]}), "not HOST:PORT"),
            (json!({"endpoints": ["https://x:1"]}), "needs \"tls\""),
            (
                json!({"endpoints": ["x:1"], "tls": {"cert": "/c"}}),
                "needs \"ca\"",
            ),
            (
                json!({"endpoints": ["x:1"], "tls": {"ca": "/a", "cert": "/c"}}),
                "go together",
            ),
            (json!({"endpoints": ["x:1"], "prefix": "p/"}), "\"prefix\""),
            (json!({"endpoints": ["x:1"], "timeout": 0}), "\"timeout\""),
            (
                json!({"endpoints": ["x:1"], "endpionts": ["y:1"]}),
                "unknown key \"endpionts\"",
            ),
            (
                json!({"endpoints": ["x:1"], "tls": {"ca": "/a", "crt": "/c"}}),
                "unknown key \"tls.crt\"",
            ),
            (
                json!({"endpoints": ["x:1"], "username": "ipam"}),
                "\"username\" (a name) and \"passwordFile\"",
            ),
            (
                json!({"endpoints": ["x:1"], "username": "ipam", "passwordFile": "pw"}),
                "an absolute file name",
            ),
        ] {
            let e = EtcdSettings::parse(&settings).unwrap_err();
            assert!(e.contains(said), "{settings}: {e}");
        }
    }

    #[test]
    fn a_password_is_never_sent_in_clear_beyond_this_host() {
        let with = |endpoints: Value| {
            EtcdSettings::parse(&json!({
                "endpoints": endpoints, "username": "ipam", "passwordFile": "/pw",
                "tls": {"ca": "/ca.pem"},
            }))
        };
        let e = with(json!(["https://10.0.0.5:2379", "http://10.0.0.6:2379"])).unwrap_err();
        assert!(
            e.starts_with("endpoint http://10.0.0.6:2379 is plain HTTP: the password"),
            "{e}"
        );
        for fine in [
            json!(["10.0.0.5:2379"]),
            json!(["https://etcd.example:2379"]),
            json!([
                "http://127.0.0.1:2379",
                "http://[::1]:2379",
                "http://localhost:2379"
            ]),
        ] {
            assert!(with(fine.clone()).is_ok(), "{fine}");
        }
        // Without a password, plain HTTP is the operator's choice.
        assert!(EtcdSettings::parse(&json!({"endpoints": ["http://10.0.0.6:2379"]})).is_ok());
    }
}
