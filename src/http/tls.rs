//! TLS for the plugins' HTTPS peers (etcd's members, a network
//! controller): the PEM files a configuration names (`tls: {"ca",
//! "cert"?, "key"?}`), and the client configuration they make. The CA
//! given is the only root trusted: an image built from scratch has no
//! system roots, and a private CA is what these peers use.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use serde_json::Value;

/// PEM files: the CA that signed the server's certificate, and this
/// client's certificate and key, when the server asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA's certificate(s).
    pub ca: PathBuf,
    /// This client's certificate and key, if the server asks for one.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// Reads `{"ca", "cert"?, "key"?}`; the error names the key.
    pub fn parse(value: &Value) -> Result<TlsFiles, String> {
        let keys = ["ca", "cert", "key"];
        if let Some(key) = value
            .as_object()
            .ok_or("\"tls\" must be an object")?
            .keys()
            .find(|k| !keys.contains(&k.as_str()))
        {
            return Err(format!(
                "unknown key \"tls.{key}\": \"tls\" has \"ca\", \"cert\", \"key\""
            ));
        }
        let path = |key: &str| -> Result<Option<PathBuf>, String> {
            match value.get(key) {
                None => Ok(None),
                Some(Value::String(path)) => Ok(Some(path.into())),
                Some(other) => Err(format!("\"tls.{key}\" must be a file's path, not {other}")),
            }
        };
        let ca = path("ca")?.ok_or(
            "\"tls\" needs \"ca\", the file of the CA that signed the server's certificate",
        )?;
        let client = match (path("cert")?, path("key")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("\"tls.cert\" and \"tls.key\" go together".into()),
        };
        Ok(TlsFiles { ca, client })
    }

    /// The TLS client configuration these files make: the CA the only
    /// root trusted, the client certificate presented if there is one.
    pub fn load(&self) -> Result<Arc<ClientConfig>, String> {
        let read_failed =
            |path: &PathBuf, e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let mut roots = RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(&self.ca).map_err(|e| read_failed(&self.ca, &e))?
        {
            let cert = cert.map_err(|e| read_failed(&self.ca, &e))?;
            roots.add(cert).map_err(|e| read_failed(&self.ca, &e))?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no certificate in it", self.ca.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| read_failed(cert, &e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| read_failed(cert, &e))?;
                let key_der =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| read_failed(key, &e))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| read_failed(cert, &e))?
            }
        };
        Ok(Arc::new(config))
    }
}
