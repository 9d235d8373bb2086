//! deploy/kubernetes: `kubectl kustomize` renders it, and every object it
//! renders parses as a Kubernetes object of its kind with the models of
//! the Kubernetes Python client (python3-kubernetes), which refuse a
//! field of the wrong type or a required one missing; the DaemonSet is as
//! the README says (the keeper and the installer side by side, neither
//! waiting for the other, both pinning the node's name from the downward
//! API, the host's directories, every node, small requests); the
//! network is a second one, through Multus: a NetworkAttachmentDefinition
//! that names the configuration the installer writes where Multus reads
//! it, macvlan on each node's default-route interface. The Neutron
//! keeper's DaemonSet (deploy/kubernetes/neutron) renders and parses too,
//! and its pod, played by podman, fills its node's warm pool on a real
//! Neutron.

use std::io::Write;
use std::process::{Command, Stdio};

/// What every check script begins with: the client's models, and `api`,
/// which parses an object as the API server would (`Answer`).
const MODELS: &str = r#"
import json, sys, yaml
from kubernetes import client

class Answer:
    def __init__(self, obj):
        self.data = json.dumps(obj)

api = client.ApiClient()
seen = {}
"#;

/// Reads the rendered objects on stdin; prints one line per object, or
/// fails saying what is wrong.
const CHECK: &str = r#"
for obj in yaml.safe_load_all(sys.stdin):
    kind = obj["kind"]
    if kind == "NetworkAttachmentDefinition":
        # Multus's own resource, which the client has no model of.
        assert obj["apiVersion"] == "k8s.cni.cncf.io/v1", obj
        seen[kind] = obj
        print(kind, obj["metadata"]["name"])
        continue
    model = {"Namespace": "V1Namespace", "ConfigMap": "V1ConfigMap", "DaemonSet": "V1DaemonSet"}[kind]
    parsed = api.deserialize(Answer(obj), model)
    seen[kind] = parsed
    print(kind, parsed.metadata.name)

ds = seen["DaemonSet"]
assert ds.metadata.namespace == "ipam-delegated", ds.metadata.namespace
pod = ds.spec.template.spec
assert pod.host_network
assert any(t.operator == "Exists" and t.key is None for t in pod.tolerations)
# Neither waits for the other: a failed install must not keep the node
# unregistered, and reclaimable, with its pods running.
assert not pod.init_containers, pod.init_containers
keeper, install = pod.containers
assert "--node-name=$(NODE_NAME)" in install.args, install.args
assert "--wait" in install.args, install.args
assert "--into=/host/opt/cni/bin" in install.args
# Where Multus reads a network whose NetworkAttachmentDefinition has no
# spec.config; never the runtime's own net.d.
assert "--conf-dir=/host/etc/cni/multus/net.d" in install.args, install.args
assert "--conflist=/config/shared.conflist" in install.args, install.args
env = {e.name: e.value_from.field_ref.field_path for e in install.env}
assert env == {"NODE_NAME": "spec.nodeName"}, env
env = {e.name: e.value_from.field_ref.field_path for e in keeper.env}
assert env == {"NODE_NAME": "spec.nodeName", "NODE_IP": "status.hostIP"}, env
# The metrics on the node's address, at the port named and annotated.
assert "--metrics-listen=$(NODE_IP):9641" in keeper.command, keeper.command
assert [(p.name, p.container_port) for p in keeper.ports] == [("metrics", 9641)], keeper.ports
annotations = ds.spec.template.metadata.annotations
assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9641", "prometheus.io/path": "/metrics"}, annotations
# The counts the plugins leave on the host, read by the keeper, which
# sets a grown file aside: written to.
counts = [m for m in keeper.volume_mounts if m.name == "counts"]
assert [(m.mount_path, m.read_only) for m in counts] == [("/run/ipam-da-pool/counts", None)], counts
paths = sorted(v.host_path.path for v in pod.volumes if v.host_path)
assert paths == ["/etc/cni/ipam-delegated/etcd", "/etc/cni/multus/net.d", "/opt/cni/bin", "/run/ipam-da-pool/counts", "/var/lib/cni"], paths
assert keeper.command[:2] == ["/ipam-da-pool", "node-keeper"], keeper.command
assert "--node-name=$(NODE_NAME)" in keeper.command, keeper.command
assert keeper.resources.requests == {"cpu": "5m", "memory": "16Mi"}, keeper.resources.requests
assert keeper.image == install.image == "localhost/ipam-delegated:0.1.0", keeper.image
config = seen["ConfigMap"]
assert any(v.config_map and v.config_map.name == config.metadata.name for v in pod.volumes)
conflist = json.loads(config.data["shared.conflist"])
assert keeper.command[2] == "--config=/config/shared.conflist", keeper.command
plugin = conflist["plugins"][0]
assert plugin["ipam"]["delegates"] == ["ipam-ds-static", "ipam-da-pool"]
assert "etcd" in plugin["ipam"]["pool"], plugin
# macvlan on the nodes' shared network, through each node's default-route
# interface whatever its name there: no "master" that one node has and
# another lacks, and no bridge claiming the pool as its own subnet.
assert plugin["type"] == "macvlan" and "master" not in plugin, plugin
nad = seen["NetworkAttachmentDefinition"]
assert nad["metadata"]["name"] == conflist["name"], nad
assert nad["metadata"]["namespace"] == "ipam-delegated", nad
assert "spec" not in nad, nad
"#;

/// What `check` (a Python script) prints of the objects `kubectl
/// kustomize` renders of `dir` (under the repository), once it passes.
fn rendered_and_checked(dir: &str, check: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let rendered = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl runs (./.ci/test installs kubernetes-client)");
    assert!(rendered.status.success(), "{rendered:?}");
    // Debian's python3, where python3-kubernetes is.
    let mut checking = Command::new("/usr/bin/python3")
        .args(["-c", &format!("{MODELS}{check}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    checking
        .stdin
        .take()
        .unwrap()
        .write_all(&rendered.stdout)
        .unwrap();
    let out = checking.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
#[ignore = "needs kubectl (kubernetes-client) and python3-kubernetes"]
fn the_manifests_render_and_parse_as_kubernetes_objects() {
    let said = rendered_and_checked("deploy/kubernetes", CHECK);
    let kinds: Vec<&str> = said.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ConfigMap",
            "DaemonSet",
            "NetworkAttachmentDefinition"
        ],
        "{said}"
    );
}

/// What every playable script ends with: the pod template `spec` as a Pod
/// named `ipam-delegated-test`, every host path under `root`, no
/// priority class (podman has none), written with the ConfigMap
/// `config` beside it.
const WRITE_POD: &str = r#"
for v in spec["volumes"]:
    if "hostPath" in v:
        v["hostPath"]["path"] = root + v["hostPath"]["path"]
spec.pop("priorityClassName", None)
pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "ipam-delegated-test"}, "spec": spec}
with open(root + "/pod.yaml", "w") as f:
    yaml.safe_dump(pod, f)
with open(root + "/configmap.yaml", "w") as f:
    yaml.safe_dump(config, f)
"#;

/// A pod played by podman from what `kubectl kustomize` renders of `dir`
/// (under the repository), made playable by the Python `script` with
/// argv the image's tag, the host's root (`work`/host) and `args`, then
/// [`WRITE_POD`]. Whatever happens, the pod goes when this is dropped:
/// none of its processes, mounts or cgroups outlives the test.
struct Played {
    podman: crate::image::Podman,
    tag: String,
    pod: std::path::PathBuf,
    // kube play takes no cgroup parent: its pod's go under libpod_parent,
    // removed afterwards unless the machine had one before.
    _cgroups: Option<crate::common::Cgroups>,
}

impl Played {
    fn start(work: &std::path::Path, dir: &str, script: &str, args: &[String]) -> Played {
        use std::path::Path;
        let (podman, tag) = crate::image::build_image(work, "test", b"");
        let cgroups = (!Path::new("/sys/fs/cgroup/memory/libpod_parent").exists()
            && !Path::new("/sys/fs/cgroup/libpod_parent").exists())
        .then(|| crate::common::Cgroups("libpod_parent".into()));
        let root = work.join("host");
        std::fs::create_dir_all(&root).unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let rendered = Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(rendered.status.success(), "{rendered:?}");
        let mut playable = Command::new("/usr/bin/python3")
            .args([
                "-c",
                &format!("{script}{WRITE_POD}"),
                &tag,
                root.to_str().unwrap(),
            ])
            .args(args)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        playable
            .stdin
            .take()
            .unwrap()
            .write_all(&rendered.stdout)
            .unwrap();
        assert!(playable.wait().unwrap().success());
        let pod = root.join("pod.yaml");
        let config_arg = format!("--configmap={}", root.join("configmap.yaml").display());
        let played = Played {
            podman,
            tag,
            pod,
            _cgroups: cgroups,
        };
        played
            .podman
            .run(&["kube", "play", &config_arg, played.pod.to_str().unwrap()]);
        played
    }

    /// The pod's logs, for a failure's message.
    fn logs(&self) -> String {
        format!(
            "{:?}",
            self.podman.output(&["pod", "logs", "ipam-delegated-test"])
        )
    }

    /// Stops the pod as a node would (SIGTERM), and removes the image.
    fn down(&self) {
        self.podman
            .run(&["kube", "down", self.pod.to_str().unwrap()]);
        self.podman.run(&["rmi", "--force", &self.tag]);
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        let _ = self.podman.output(&["pod", "rm", "--force", "--all"]);
    }
}

/// Makes, from the rendered objects on stdin and argv (the image's tag,
/// the host's root, the etcd endpoint, the node's name), what podman 4.3
/// can play: the DaemonSet's pod template as a Pod (podman plays no
/// DaemonSet), the host's directories under the test's, the Secret an
/// empty directory (the test's etcd asks for no credentials), the
/// configuration naming the test's etcd; and the ConfigMap beside it.
/// podman does not expand `$(NODE_NAME)` from a fieldRef to spec.nodeName
/// (it has no node): the name is written in, and the metrics' address
/// made loopback, at a port of the test's; podman maps no port of a pod
/// on the host's network, so the port's declaration goes.
const PLAYABLE: &str = r#"
import json, sys, yaml
tag, root, endpoint, node, metrics = sys.argv[1:6]
objects = {o["kind"]: o for o in yaml.safe_load_all(sys.stdin)}
config = objects["ConfigMap"]
conflist = json.loads(config["data"]["shared.conflist"])
conflist["plugins"][0]["ipam"]["pool"]["etcd"] = {"endpoints": [endpoint], "prefix": "/ipamd-kube"}
config["data"]["shared.conflist"] = json.dumps(conflist)
spec = objects["DaemonSet"]["spec"]["template"]["spec"]
for c in spec["containers"]:
    c["image"] = tag
    c.pop("env", None)
    # Host networking: its ports are the host's, which podman will not map.
    c.pop("ports", None)
    for key in ("args", "command"):
        if key in c:
            c[key] = [a.replace("$(NODE_NAME)", node).replace("$(NODE_IP):9641", metrics)
                      for a in c[key]]
for v in spec["volumes"]:
    if "secret" in v:
        del v["secret"]
        v["emptyDir"] = {}
"#;

#[test]
#[ignore = "needs root, podman, kubectl, python3-kubernetes, etcd-server and a static build"]
fn the_daemonsets_pod_installs_the_family_and_registers_the_node_under_podman() {
    use crate::common::etcd::Cluster;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    let work = crate::common::temp_dir("kube");
    let cluster = Cluster::start(1, None);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let root = work.path().join("host");
    // The node's own plugin, which the configuration names too.
    let bin = root.join("opt/cni/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let macvlan = bin.join("macvlan");
    std::fs::write(&macvlan, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&macvlan, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = [
        cluster.endpoints()[0].clone(),
        "node-kube".into(),
        format!("127.0.0.1:{metrics}"),
    ];
    let played = Played::start(work.path(), "deploy/kubernetes", PLAYABLE, &args);
    let alive = "/ipamd-kube/nodes/node-kube/alive";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster.keys(alive).iter().any(|k| k == alive) {
        if Instant::now() > deadline {
            panic!("the keeper did not register the node: {}", played.logs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the installer put on the "host" (the keeper need not wait for
    // it, so it may still be at work).
    let installed = root.join("etc/cni/multus/net.d/shared.conflist");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !installed.exists() {
        assert!(Instant::now() < deadline, "the installer did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    for binary in [
        "ipam-delegated",
        "ipam-ds-static",
        "ipam-da-pool",
        "ipam-da-neutron",
        "ipam-delegated-docker",
    ] {
        assert!(bin.join(binary).exists(), "{binary}");
    }
    let conflist = root.join("etc/cni/multus/net.d/shared.conflist");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(written["name"], "shared");
    let pinned = root.join("var/lib/cni/ipam-da-pool/node-name");
    assert_eq!(std::fs::read_to_string(pinned).unwrap(), "node-kube\n");
    // The keeper's metrics: the node registered, as the next refresh
    // (every 10 s) reads it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut text = String::new();
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", metrics)) {
            use std::io::Read;
            let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
            let _ = stream.read_to_string(&mut text);
        }
        if text.contains("ipam_da_pool_node_registered{node=\"node-kube\"} 1\n") {
            break;
        }
        assert!(Instant::now() < deadline, "the keeper's metrics: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
    played.down();
    assert!(root.exists());
}

/// Reads deploy/kubernetes/neutron's rendered objects on stdin, as
/// [`CHECK`] does the main ones: the keeper's DaemonSet on the host's
/// network, on every node, with the host's state and token directories,
/// its configuration a network with warm pools.
const CHECK_NEUTRON: &str = r#"
for obj in yaml.safe_load_all(sys.stdin):
    model = {"ConfigMap": "V1ConfigMap", "DaemonSet": "V1DaemonSet"}[obj["kind"]]
    seen[obj["kind"]] = api.deserialize(Answer(obj), model)
ds, config = seen["DaemonSet"], seen["ConfigMap"]
assert ds.metadata.namespace == "ipam-delegated", ds.metadata.namespace
pod = ds.spec.template.spec
assert pod.host_network
assert any(t.operator == "Exists" and t.key is None for t in pod.tolerations)
(keeper,) = pod.containers
assert keeper.command == ["/ipam-da-neutron", "keeper", "--config=/config/tenants.conflist", "--node-name=$(NODE_NAME)"], keeper.command
env = {e.name: e.value_from.field_ref.field_path for e in keeper.env}
assert env == {"NODE_NAME": "spec.nodeName"}, env
mounts = sorted((m.mount_path, bool(m.read_only)) for m in keeper.volume_mounts)
assert mounts == [("/config", True), ("/etc/cni/ipam-delegated/neutron", True), ("/var/lib/cni", False)], mounts
assert keeper.image == "localhost/ipam-delegated:0.1.0", keeper.image
paths = sorted(v.host_path.path for v in pod.volumes if v.host_path)
assert paths == ["/etc/cni/ipam-delegated/neutron", "/var/lib/cni"], paths
assert any(v.config_map and v.config_map.name == config.metadata.name for v in pod.volumes)
conflist = json.loads(config.data["tenants.conflist"])
neutron = conflist["plugins"][0]["ipam"]["neutron"]
assert conflist["plugins"][0]["ipam"]["delegates"] == ["ipam-da-neutron"]
assert neutron["warm"]["min"] <= neutron["warm"]["max"], neutron
assert neutron["tokenFile"].startswith("/etc/cni/ipam-delegated/neutron/"), neutron
print("ok")
"#;

#[test]
#[ignore = "needs kubectl (kubernetes-client) and python3-kubernetes"]
fn the_neutron_keepers_manifests_render_and_parse_as_kubernetes_objects() {
    assert_eq!(
        rendered_and_checked("deploy/kubernetes/neutron", CHECK_NEUTRON),
        "ok\n"
    );
}

/// Makes, from deploy/kubernetes/neutron's rendered objects on stdin and
/// argv (the image's tag, the host's root, the controller's url, its
/// network), what podman 4.3 plays, as [`PLAYABLE`] does: the keeper's
/// pod as a Pod, the host's directories under the test's, and the
/// configuration naming the test's controller (no token, no CA: it
/// takes none) and a small pool; the node's name written in, as podman
/// has no spec.nodeName.
const PLAYABLE_NEUTRON: &str = r#"
import json, sys, yaml
tag, root, url, network = sys.argv[1:5]
objects = {o["kind"]: o for o in yaml.safe_load_all(sys.stdin)}
config = objects["ConfigMap"]
conflist = json.loads(config["data"]["tenants.conflist"])
neutron = conflist["plugins"][0]["ipam"]["neutron"]
for key in ("tls", "tokenFile"):
    del neutron[key]
neutron.update({"url": url, "network": network,
                "warm": {"min": 2, "max": 3, "batch": 3}})
config["data"]["tenants.conflist"] = json.dumps(conflist)
spec = objects["DaemonSet"]["spec"]["template"]["spec"]
for c in spec["containers"]:
    c["image"] = tag
    c.pop("env", None)
    c["command"] = [a.replace("$(NODE_NAME)", "node-kube") for a in c["command"]]
"#;

#[test]
#[ignore = "needs root, podman, kubectl, python3-neutron and a static build"]
fn the_neutron_keepers_pod_fills_its_nodes_warm_pool_under_podman() {
    use crate::common::neutron::{Neutron, Options};
    use std::time::{Duration, Instant};

    let work = crate::common::temp_dir("kube-neutron");
    let neutron = Neutron::start(Options::default());
    let network = neutron.network("kube-tenants");
    neutron.subnet(
        &network,
        serde_json::json!({"cidr": "10.79.0.0/24", "allocation_pools": [{"start": "10.79.0.10", "end": "10.79.0.99"}]}),
    );
    let args = [neutron.url(), network.clone()];
    let played = Played::start(
        work.path(),
        "deploy/kubernetes/neutron",
        PLAYABLE_NEUTRON,
        &args,
    );
    let root = work.path().join("host");
    // Its pool filled to max: three free pooled ports of the node.
    let free = || {
        neutron
            .ports_of(&network)
            .iter()
            .filter(|p| {
                let tags = p["tags"].as_array().unwrap();
                tags.iter().any(|t| t == "cni-free")
                    && tags.iter().any(|t| t == "cni-node=node-kube")
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while free() < 3 {
        if Instant::now() > deadline {
            panic!("the keeper did not fill the pool: {}", played.logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Its ledger on the host, where the node's ADDs read it.
    let ledger = root.join("var/lib/cni/ipam-da-neutron/warm/tenants.ledger");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&ledger).is_ok_and(|l| l.matches("10.79.0.").count() >= 3) {
        assert!(
            Instant::now() < deadline,
            "no ledger at {}",
            ledger.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The node's name pinned on the host, where the plugin reads it.
    let pinned = root.join("var/lib/cni/ipam-da-pool/node-name");
    assert_eq!(std::fs::read_to_string(pinned).unwrap(), "node-kube\n");
    // Stopped (SIGTERM), it leaves its free ports for its next start.
    played.down();
    assert_eq!(free(), 3, "its free ports stay for its next start");
}
