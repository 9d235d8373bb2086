//! ipam-da-neutron with Keystone application credentials, against a real
//! Keystone (Debian's python3-keystone) and a Neutron that validates
//! every token with it (keystonemiddleware).

use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use crate::common::neutron::{Keystone, Neutron, Options};
use crate::proxy::Proxy;
use crate::{says, Net};

#[test]
#[ignore = "needs python3-neutron and python3-keystone"]
fn application_credentials_get_a_token_kept_until_it_ends_and_asked_anew_when_refused() {
    let keystone = Keystone::start(3600);
    let neutron = Neutron::start(Options {
        keystone: Some(keystone.for_neutron()),
        ..Options::default()
    });
    // Keystone through a proxy that counts its requests.
    let counted = Proxy::to(keystone.port);
    let auth_url = format!("http://127.0.0.1:{}/v3", counted.port);
    let mut net = Net::on(&neutron, "credentialed");
    let secret = net.data.path().join("secret");
    std::fs::write(
        &secret,
        format!("{}\n", keystone.credential["secret"].as_str().unwrap()),
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let id = keystone.credential["id"].as_str().unwrap().to_owned();
    net.extra =
        json!({"auth": {"url": auth_url, "applicationCredentialId": id, "secretFile": secret}});
    let config = net.config();

    // The first command asks Keystone; the next ones use the kept token.
    for container in ["c-k1", "c-k2"] {
        let add = net.run("ADD", container, config.as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    net.run("DEL", "c-k2", config.as_bytes())
        .assert_silent_success();
    assert_eq!(counted.requests(), 1, "one token for three commands");
    let kept = net.data.path().join("keystone").join(&id);
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o077,
        0
    );

    // A kept token about to end is asked for anew.
    let mut token: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    token["expires"] = json!(now + 30);
    std::fs::write(&kept, token.to_string()).unwrap();
    let add = net.run("ADD", "c-k3", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    assert_eq!(counted.requests(), 2);

    // One the controller refuses (revoked, say) is asked for anew, once.
    token["token"] = json!("not-a-token");
    token["expires"] = json!(now + 3600);
    std::fs::write(&kept, token.to_string()).unwrap();
    let add = net.run("ADD", "c-k4", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    assert_eq!(counted.requests(), 3);
    assert_eq!(net.ports(&neutron).len(), 3);

    // A wrong secret: Keystone refuses it, code 5, naming Keystone.
    std::fs::write(&secret, "wrong\n").unwrap();
    std::fs::remove_file(&kept).unwrap();
    let refused = net.run("ADD", "c-k5", config.as_bytes());
    let error = refused.assert_error(5);
    let msg = error["msg"].as_str().unwrap();
    assert!(
        msg.contains(&auth_url) && msg.contains("application credential"),
        "{error}"
    );

    // A revoked credential gets no token.
    std::fs::write(
        &secret,
        format!("{}\n", keystone.credential["secret"].as_str().unwrap()),
    )
    .unwrap();
    net.run("DEL", "c-k1", config.as_bytes())
        .assert_silent_success();
    keystone.revoke();
    std::fs::remove_file(&kept).unwrap();
    let revoked = net.run("DEL", "c-k3", config.as_bytes());
    // Keystone no longer has it: code 7, as for a network that is gone.
    let error = revoked.assert_error(7);
    let msg = error["msg"].as_str().unwrap();
    let says = format!("Keystone at {auth_url} has no application credential {id}");
    assert!(msg.starts_with(&says), "{error}");
    assert_eq!(net.ports(&neutron).len(), 2);
}

#[test]
#[ignore = "needs python3-neutron and python3-keystone"]
fn keystone_out_of_reach_is_code_11_and_status_50() {
    let neutron = crate::shared();
    let mut net = Net::on(neutron, "keystoneless");
    let secret = net.data.path().join("secret");
    std::fs::write(&secret, "s\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let nothing = crate::common::neutron::free_port();
    net.extra = json!({"auth": {"url": format!("http://127.0.0.1:{nothing}/v3"), "applicationCredentialId": "ac", "secretFile": secret}});
    let config = net.config();
    let add = net.run("ADD", "c-n1", config.as_bytes());
    says(&add, 11, "asking Keystone for a token");
    net.run("STATUS", "c-n1", config.as_bytes())
        .assert_error(50);
    assert!(net.ports(neutron).is_empty());
}
