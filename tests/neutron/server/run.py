"""Start a throwaway OpenStack Neutron (Zed, Debian's python3-neutron) for tests.

    /usr/bin/python3 tests/neutron/server/run.py --dir DIR --port PORT \
        [--token TOKEN | --keystone URL --keystone-password PW] \
        [--keystone-token-cache-time SECONDS] [--forbid-host-binding] \
        [--forbid RULE ...] [--tls-cert FILE --tls-key FILE] \
        [--page-size N] [--schema-template FILE] [--drop-posted-tags] \
        [--stop-with-stdin]

Everything the server keeps (config, SQLite database, locks, log, caches)
goes into DIR. The server listens on 127.0.0.1:PORT, runs in the
foreground and is ready once `GET /v2.0/networks` answers 200 (401 with
--token or --keystone: tokens go to the Keystone of keystone.py). Stop it by
sending SIGTERM to its process group (start it with setsid): Neutron runs
as three processes.

Run with Debian's /usr/bin/python3: another python3 in PATH does not see
Debian's modules. See README.md beside this file for the flags.
"""

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

import harness_lifeline  # noqa: E402  (beside this file)

# The paste pipeline. Without Keystone (noauth): fake_project_id gives
# every request a project and admin rights; our token filter (when asked
# for) sits where keystonemiddleware's auth_token would. With Keystone
# (--keystone): keystonemiddleware's auth_token validates X-Auth-Token
# against Keystone (configured by [keystone_authtoken] in neutron.conf),
# and keystonecontext makes the request's user, project and roles from it.
# Requests are served one at a time (harness_serial.py: SQLite under
# eventlet).
PASTE = """\
[composite:neutron]
use = egg:Paste#urlmap
/: neutronversions
/v2.0: neutronapi_v2_0

[pipeline:neutronapi_v2_0]
pipeline = request_id catch_errors serial {auth_filters} extensions neutronapiapp_v2_0

[filter:request_id]
paste.filter_factory = oslo_middleware:RequestId.factory

[filter:catch_errors]
paste.filter_factory = oslo_middleware:CatchErrors.factory

[filter:serial]
paste.filter_factory = harness_serial:filter_factory

[filter:token]
paste.filter_factory = harness_token:filter_factory
token = {token}

[filter:fake_project_id]
paste.filter_factory = neutron.auth:NoauthFakeProjectId.factory

[filter:authtoken]
paste.filter_factory = keystonemiddleware.auth_token:filter_factory

[filter:keystonecontext]
paste.filter_factory = neutron.auth:NeutronKeystoneContext.factory

[filter:extensions]
paste.filter_factory = neutron.api.extensions:plugin_aware_extension_middleware_factory

[app:neutronversions]
paste.app_factory = neutron.pecan_wsgi.app:versions_factory

[app:neutronapiapp_v2_0]
paste.app_factory = neutron.api.v2.router:APIRouter.factory
"""

CONF = """\
[DEFAULT]
bind_host = 127.0.0.1
bind_port = {port}
auth_strategy = {auth_strategy}
core_plugin = ml2
# Empty, yet with ML2 Neutron always adds its default service plugins:
# tag (the "tags" attribute, its filters, /ports/ID/tags), timestamp
# (created_at, updated_at), network_ip_availability, revisions, flavors
# and auto_allocate (which logs an ERROR that it lacks a router plugin).
service_plugins =
api_paste_config = {dir}/api-paste.ini
state_path = {dir}
log_file = {dir}/neutron.log
# No message bus, no agents, no Nova: a fake transport and no workers.
transport_url = fake://
api_workers = 0
rpc_workers = 0
rpc_state_report_workers = 0
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
dhcp_agent_notification = false
# At most this many items an answer (--page-size; -1: no limit).
pagination_max_limit = {page_size}
# HTTPS with the [ssl] files (--tls-cert, --tls-key).
use_ssl = {use_ssl}

[database]
connection = sqlite:///{dir}/neutron.sqlite
# Do not wait for the disk on each commit: about 45 ms less per create.
sqlite_synchronous = false

[oslo_concurrency]
lock_path = {dir}/lock

[ml2]
type_drivers = local
tenant_network_types = local
# Stores the "tags" of a port POST. Without it Neutron accepts "tags" in
# the POST, answers 201 and silently drops them (--drop-posted-tags).
extension_drivers = {extension_drivers}
mechanism_drivers = harness_active

[quotas]
# Unlimited: the default of 500 ports per project is reachable in tests.
quota_network = -1
quota_subnet = -1
quota_port = -1
{policy}{keystone}{ssl}"""

# With --keystone: how keystonemiddleware reaches Keystone. It logs in as
# Keystone's admin (a service user would do; this Keystone has only
# admin), finds the identity endpoint in the catalog (only a "public" one
# exists; the default interface is "internal") and validates each new
# token with GET /v3/auth/tokens. A valid token is cached in the process
# for token_cache_time seconds: a token revoked meanwhile still passes.
KEYSTONE_CONF = """
[keystone_authtoken]
www_authenticate_uri = {url}
auth_url = {url}
auth_type = password
username = admin
password = {password}
user_domain_id = default
project_name = admin
project_domain_id = default
interface = public
token_cache_time = {cache_time}
"""

# With --forbid-host-binding nobody may set or see binding:host_id. In Zed
# an admin context skips every policy rule unless enforce_new_defaults is
# on, and noauth makes every request admin, so turn it on; the admin role
# still passes every other admin-only rule.
POLICY_CONF = """
[oslo_policy]
policy_file = {dir}/policy.yaml
enforce_new_defaults = true
enforce_scope = false
"""

# The rules --forbid-host-binding sets to "!", which never passes, admin
# included.
HOST_BINDING_RULES = [
    'create_port:binding:host_id',
    'update_port:binding:host_id',
    'get_port:binding:host_id',
]

SSL_CONF = """
[ssl]
cert_file = {cert}
key_file = {key}
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True,
                   help='where config, database, locks and log go')
    p.add_argument('--port', required=True, type=int,
                   help='TCP port on 127.0.0.1')
    auth = p.add_mutually_exclusive_group()
    auth.add_argument('--token',
                      help='answer 401 unless X-Auth-Token equals this')
    auth.add_argument('--keystone', metavar='URL',
                      help='validate tokens with the Keystone at URL '
                           '(e.g. http://127.0.0.1:5000/v3)')
    p.add_argument('--keystone-password', metavar='PW',
                   help="password of Keystone's admin user (with "
                        '--keystone)')
    p.add_argument('--keystone-token-cache-time', type=int, default=300,
                   metavar='SECONDS',
                   help='how long a validated token is trusted without '
                        'asking Keystone again (0 or -1: never cached; '
                        'default 300, as keystonemiddleware)')
    p.add_argument('--forbid-host-binding', action='store_true',
                   help='policy: binding:host_id may not be set or read')
    p.add_argument('--forbid', action='append', default=[],
                   metavar='RULE',
                   help='a policy rule no one passes, admin included '
                        '(repeatable)')
    p.add_argument('--tls-cert',
                   help='serve HTTPS with this certificate (PEM)')
    p.add_argument('--tls-key',
                   help="the certificate's key (PEM)")
    p.add_argument('--page-size', type=int, default=-1,
                   help='answer lists in pages of at most this many items '
                        '(pagination_max_limit), with a link to the next')
    p.add_argument('--drop-posted-tags', action='store_true',
                   help='drop the tags of a port POST, as Neutron does '
                        'without the tag_ports_during_bulk_creation driver')
    p.add_argument('--stop-with-stdin', action='store_true',
                   help='stop the whole server when stdin reaches its end '
                        '(a test holds the pipe)')
    p.add_argument('--schema-template',
                   help='copy of an empty database to start from (made '
                        'here if missing)')
    args = p.parse_args()
    if args.keystone and args.keystone_password is None:
        p.error('--keystone needs --keystone-password')
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error('--tls-cert and --tls-key go together')
    return args


def write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def write_config(args, d):
    os.makedirs(os.path.join(d, 'lock'), exist_ok=True)
    policy = ''
    forbidden = list(args.forbid)
    if args.forbid_host_binding:
        forbidden += HOST_BINDING_RULES
    if forbidden:
        write(os.path.join(d, 'policy.yaml'),
              ''.join('"%s": "!"\n' % rule for rule in forbidden))
        policy = POLICY_CONF.format(dir=d)
    ssl = ''
    if args.tls_cert:
        ssl = SSL_CONF.format(cert=os.path.abspath(args.tls_cert),
                              key=os.path.abspath(args.tls_key))
    keystone = ''
    if args.keystone:
        keystone = KEYSTONE_CONF.format(
            url=args.keystone.rstrip('/'),
            # oslo.config reads "$name" in values: a literal $ is doubled.
            password=args.keystone_password.replace('$', '$$'),
            # keystonemiddleware's in-process cache reads 0 as memcached
            # does, "keep forever"; -1 turns it off.
            cache_time=max(args.keystone_token_cache_time, 0) or -1)
        auth_filters = 'authtoken keystonecontext'
    elif args.token is not None:
        auth_filters = 'token fake_project_id'
    else:
        auth_filters = 'fake_project_id'
    write(os.path.join(d, 'neutron.conf'),
          CONF.format(port=args.port, dir=d, policy=policy, ssl=ssl,
                      use_ssl='true' if args.tls_cert else 'false',
                      page_size=args.page_size,
                      keystone=keystone,
                      auth_strategy='keystone' if args.keystone
                      else 'noauth',
                      extension_drivers='' if args.drop_posted_tags
                      else 'tag_ports_during_bulk_creation'))
    write(os.path.join(d, 'api-paste.ini'), PASTE.format(
        # paste.deploy reads "%(name)s" in values: a literal % is doubled.
        token=(args.token or '').replace('%', '%%'),
        auth_filters=auth_filters))


def create_schema(db):
    """Make the tables from the models.

    `neutron-db-manage upgrade heads` fails on SQLite (it cannot ALTER
    constraints); Neutron's own unit tests build the schema this way.
    """
    import sqlalchemy
    from neutron.db.migration.models import head
    engine = sqlalchemy.create_engine('sqlite:///' + db)
    head.get_metadata().create_all(engine)
    engine.dispose()


def prepare_db(db, template):
    if os.path.exists(db):
        return  # a restart on the same DIR keeps its data
    if template and os.path.exists(template):
        shutil.copyfile(template, db)
        return
    create_schema(db)
    if template:
        # Write under a temporary name and rename: a server that races us
        # sees either no template or a whole one.
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(template) or '.',
                                   prefix='.schema-')
        os.close(fd)
        shutil.copyfile(db, tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it private
        os.replace(tmp, template)


def main():
    args = parse_args()
    if args.stop_with_stdin:
        harness_lifeline.stop_with_stdin()
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    write_config(args, d)

    # stevedore caches entry points under XDG_CACHE_HOME (else ~/.cache).
    os.environ['XDG_CACHE_HOME'] = os.path.join(d, 'cache')
    # Neutron reads its config files from these, instead of /etc/neutron.
    os.environ['OS_NEUTRON_CONFIG_DIR'] = d
    os.environ['OS_NEUTRON_CONFIG_FILES'] = 'neutron.conf'
    # HERE holds our mechanism driver, token filter and the dist-info that
    # registers the driver. It is already sys.path[0] when run as a script;
    # PYTHONPATH is for any process Neutron might exec.
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    os.environ['PYTHONPATH'] = os.pathsep.join(
        [HERE] + [p for p in os.environ.get('PYTHONPATH', '').split(
            os.pathsep) if p])
    # Neutron parses sys.argv itself; it must not see our flags.
    sys.argv = [sys.argv[0]]

    # Eventlet's monkey-patching must come before Neutron's other modules
    # and SQLAlchemy are imported.
    import neutron.cmd.eventlet  # noqa: F401
    from neutron.cmd.eventlet import server
    from neutron.db.migration.models import head  # noqa: F401  all models
    import sqlalchemy.orm

    template = (os.path.abspath(args.schema_template)
                if args.schema_template else None)
    prepare_db(os.path.join(d, 'neutron.sqlite'), template)

    # Without this, the first GET /v2.0/ports of a fresh server fails with
    # 500 ("type object 'Port' has no attribute 'port_forwardings'") until
    # some other call has configured SQLAlchemy's mappers.
    sqlalchemy.orm.configure_mappers()

    server.main()


if __name__ == '__main__':
    main()
