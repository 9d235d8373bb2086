//! deploy/kubernetes: `kubectl kustomize` renders it, and every object it
//! renders parses as a Kubernetes object of its kind with the models of
//! the Kubernetes Python client (python3-kubernetes), which refuse a
//! field of the wrong type or a required one missing; the DaemonSet is as
//! the README says (the installer first, the node's name from the
//! downward API, the host's directories, every node, small requests).

use std::io::Write;
use std::process::{Command, Stdio};

/// Reads the rendered objects on stdin; prints one line per object, or
/// fails saying what is wrong.
const CHECK: &str = r#"
import json, sys, yaml
from kubernetes import client

class Answer:
    def __init__(self, obj):
        self.data = json.dumps(obj)

api = client.ApiClient()
seen = {}
for obj in yaml.safe_load_all(sys.stdin):
    kind = obj["kind"]
    model = {"Namespace": "V1Namespace", "ConfigMap": "V1ConfigMap", "DaemonSet": "V1DaemonSet"}[kind]
    parsed = api.deserialize(Answer(obj), model)
    seen[kind] = parsed
    print(kind, parsed.metadata.name)

ds = seen["DaemonSet"]
assert ds.metadata.namespace == "ipam-delegated", ds.metadata.namespace
pod = ds.spec.template.spec
assert pod.host_network
assert any(t.operator == "Exists" and t.key is None for t in pod.tolerations)
install = pod.init_containers[0]
assert "--node-name=$(NODE_NAME)" in install.args, install.args
assert "--into=/host/opt/cni/bin" in install.args
env = {e.name: e.value_from.field_ref.field_path for e in install.env}
assert env == {"NODE_NAME": "spec.nodeName"}, env
paths = sorted(v.host_path.path for v in pod.volumes if v.host_path)
assert paths == ["/etc/cni/ipam-delegated/etcd", "/etc/cni/net.d", "/opt/cni/bin", "/var/lib/cni"], paths
keeper = pod.containers[0]
assert keeper.command[:2] == ["/ipam-da-pool", "node-keeper"], keeper.command
assert keeper.resources.requests == {"cpu": "5m", "memory": "16Mi"}, keeper.resources.requests
assert keeper.image == install.image == "localhost/ipam-delegated:0.1.0", keeper.image
config = seen["ConfigMap"]
assert any(v.config_map and v.config_map.name == config.metadata.name for v in pod.volumes)
conflist = json.loads(config.data["10-pods.conflist"])
assert conflist["plugins"][0]["ipam"]["delegates"] == ["ipam-ds-static", "ipam-da-pool"]
"#;

#[test]
#[ignore = "needs kubectl (kubernetes-client) and python3-kubernetes"]
fn the_manifests_render_and_parse_as_kubernetes_objects() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");
    let rendered = Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
        .expect("kubectl runs (./.ci/test installs kubernetes-client)");
    assert!(rendered.status.success(), "{rendered:?}");
    // Debian's python3, where python3-kubernetes is.
    let mut check = Command::new("/usr/bin/python3")
        .args(["-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(&rendered.stdout)
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8(out.stdout).unwrap();
    let kinds: Vec<&str> = said.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(kinds, ["Namespace", "ConfigMap", "DaemonSet"], "{said}");
}
