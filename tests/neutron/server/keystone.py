"""Start a throwaway OpenStack Keystone (Zed, Debian's python3-keystone).

    /usr/bin/python3 tests/neutron/server/keystone.py --dir DIR --port PORT \
        [--template TEMPLATE_DIR] [--token-expiration SECONDS] \
        [--stop-with-stdin]

Everything Keystone keeps (config, SQLite database, key repositories, log)
goes into DIR. It listens on 127.0.0.1:PORT (0: a free port) and runs in
the foreground, in one process. Before it serves it makes an application
credential for the admin user and writes DIR/credential.json:

    {"auth_url": "http://127.0.0.1:PORT/v3", "port": PORT,
     "id": ..., "secret": ..., "name": ..., "user_id": ..., "project_id": ...,
     "admin_password": ...}

The file appears (temp name + rename) once the socket is listening, so a
test that sees it may connect at once. Stop the server with SIGTERM to its
process group (start it with setsid), or with --stop-with-stdin.

Run with Debian's /usr/bin/python3: another python3 in PATH does not see
Debian's modules. See README.md beside this file.
"""

import argparse
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import traceback
import wsgiref.simple_server

# This file's own name hides the keystone package: Python puts the
# script's directory first in sys.path. Take it out before any import of
# keystone.
HERE = os.path.dirname(os.path.abspath(__file__))
import harness_lifeline  # noqa: E402  (beside this file, before it leaves sys.path)
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or os.curdir) != HERE]

# Only the default domain, one project and one user, all named by
# keystone-manage bootstrap's defaults. The password is fixed, so that a
# test may start Neutron (run.py --keystone-password) before this server
# is ready; it is in every template, and credential.json repeats it.
ADMIN = 'admin'
ADMIN_PASSWORD = 'harness-admin-password'
REGION = 'RegionOne'

# The whole configuration. Fernet tokens, as every Keystone since Ocata;
# the cheapest bcrypt (4 rounds, its minimum) since nothing here needs a
# slow hash; an in-process cache, so that repeated validations are cheap.
CONF = """\
[DEFAULT]
log_file = {dir}/keystone.log
use_stderr = false

[database]
connection = sqlite:///{dir}/keystone.db

[token]
provider = fernet
expiration = {expiration}

[fernet_tokens]
key_repository = {dir}/fernet-keys

[fernet_receipts]
key_repository = {dir}/fernet-keys

[credential]
key_repository = {dir}/credential-keys

[identity]
password_hash_rounds = 4

[cache]
enabled = true
backend = dogpile.cache.memory
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True,
                   help='where config, database, keys and log go')
    p.add_argument('--port', required=True, type=int,
                   help='TCP port on 127.0.0.1 (0: any free one)')
    p.add_argument('--template',
                   help='directory holding a bootstrapped database to start '
                        'from (made here if missing)')
    p.add_argument('--token-expiration', type=int, default=3600,
                   metavar='SECONDS',
                   help='lifetime of the tokens it issues (default 3600, '
                        "as Keystone's)")
    p.add_argument('--stop-with-stdin', action='store_true',
                   help='stop the server when stdin reaches its end '
                        '(a test holds the pipe)')
    return p.parse_args()


def write(path, text, mode=0o644):
    """Write a whole file under a temporary name, then rename it.

    A reader that polls for the file sees either none or all of it.
    """
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                               prefix='.' + os.path.basename(path) + '-')
    with os.fdopen(fd, 'w') as f:
        f.write(text)
    os.chmod(tmp, mode)  # mkstemp made it private
    os.replace(tmp, path)


class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    """Log each request to keystone.log rather than to stderr."""

    def log_message(self, format, *args):
        logging.getLogger('keystone.access').info(
            '%s %s', self.address_string(), format % args)


def listen(port):
    """Bind and listen before anything else: a port in use fails at once.

    Connections that come before serve_forever wait in the backlog.
    wsgiref serves one request at a time, with HTTP/1.0 (the connection
    closes after each answer): enough for one test and its Neutron.
    """
    return wsgiref.simple_server.make_server(
        '127.0.0.1', port, None, handler_class=QuietHandler)


def copy_template(template, d):
    """Start from the template's database."""
    shutil.copyfile(os.path.join(template, 'keystone.db'),
                    os.path.join(d, 'keystone.db'))


def save_template(template, d):
    """Copy DIR's freshly bootstrapped database to the template directory.

    Written as a temporary directory renamed into place: a racer sees no
    template or a whole one. If a racer got there first, rename fails
    and ours is thrown away.
    """
    parent = os.path.dirname(template) or '.'
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix='.keystone-template-')
    shutil.copyfile(os.path.join(d, 'keystone.db'),
                    os.path.join(tmp, 'keystone.db'))
    os.chmod(tmp, 0o755)  # mkdtemp made it private
    try:
        os.rename(tmp, template)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def setup_keys():
    """Make the Fernet key repositories, as keystone-manage fernet_setup
    and credential_setup do (and skip any that already holds keys).

    Each server gets keys of its own, even from a template: a token from
    one test's Keystone is worthless at another's.
    """
    import keystone.conf
    from keystone.common import fernet_utils
    from keystone.credential.providers import fernet as credential_fernet
    conf = keystone.conf.CONF
    uid, gid = os.getuid(), os.getgid()
    for repo, keys, group in (
            (conf.fernet_tokens.key_repository,
             conf.fernet_tokens.max_active_keys, 'fernet_tokens'),
            (conf.credential.key_repository,
             credential_fernet.MAX_ACTIVE_KEYS, 'credential')):
        futils = fernet_utils.FernetUtils(repo, keys, group)
        futils.create_key_directory(uid, gid)
        os.chmod(repo, 0o700)  # Keystone refuses keys others may read
        futils.initialize_key_repository(uid, gid)


def bootstrap(password, url):
    """Do keystone-manage bootstrap: domain, project admin, user admin with
    role admin on it, region and the identity endpoint in the catalog.

    It is idempotent, so it runs on every start: on a copied template or
    a restart it only points the public endpoint at this server's URL
    (keystonemiddleware reaches Keystone through the catalog).
    """
    from keystone.cmd import bootstrap as ks_bootstrap
    b = ks_bootstrap.Bootstrapper()  # also loads Keystone's backends
    b.admin_username = ADMIN
    b.admin_password = password
    b.project_name = ADMIN
    b.admin_role_name = ADMIN
    b.service_name = 'keystone'
    b.public_url = url
    b.region_id = REGION
    b.immutable_roles = True
    b.bootstrap()
    return b.admin_user_id, b.project_id


def make_app():
    """The WSGI application, as keystone-wsgi-public builds it (the backends
    are already loaded: a second load is refused)."""
    from keystone.server.flask import application
    from keystone.server.flask import core as flask_core
    return flask_core.setup_app_middleware(
        application.application_factory('public'))


class Unauthorized(Exception):
    pass


def call(app, method, path, token=None, body=None):
    """One request to the application in-process (no socket)."""
    import werkzeug.test
    headers = {'X-Auth-Token': token} if token else {}
    r = werkzeug.test.Client(app).open(path, method=method, json=body,
                                      headers=headers)
    if r.status_code == 401:
        raise Unauthorized(r.get_data(as_text=True))
    if r.status_code >= 300:
        raise RuntimeError('%s %s: %s %s' % (method, path, r.status,
                                             r.get_data(as_text=True)))
    return r


def make_credential(app, user_id, project_id, password):
    """An application credential of admin on project admin, through the API.

    Its name is unique per start: names are unique per user, and a
    restart on the same DIR keeps the earlier ones.
    """
    try:
        return try_make_credential(app, user_id, project_id, password)
    except Unauthorized:
        # bootstrap reset the password (a database made with another
        # one): that revokes the user's tokens issued up to this second,
        # with one-second precision, so our fresh token too. A second
        # later all is well.
        time.sleep(1.1)
        return try_make_credential(app, user_id, project_id, password)


def try_make_credential(app, user_id, project_id, password):
    r = call(app, 'POST', '/v3/auth/tokens', body={'auth': {
        'identity': {'methods': ['password'], 'password': {'user': {
            'id': user_id, 'password': password}}},
        'scope': {'project': {'id': project_id}}}})
    token = r.headers['X-Subject-Token']
    name = 'harness-' + secrets.token_hex(4)
    r = call(app, 'POST', '/v3/users/%s/application_credentials' % user_id,
             token, {'application_credential': {'name': name}})
    return r.get_json()['application_credential']


def skip_saml_schemas():
    """Spare a second of start-up: pysaml2 compiles its XML schemas on
    import (about 1 s), and Keystone imports it for SAML federation, which
    no test uses. A stand-in module without schemas takes its place.
    """
    import types
    from xmlschema.exceptions import XMLSchemaException
    stub = types.ModuleType('saml2.xml.schema')
    stub.XMLSchemaError = XMLSchemaException
    stub.node_to_schema = {}
    sys.modules['saml2.xml.schema'] = stub


def main():
    args = parse_args()
    if args.stop_with_stdin:
        harness_lifeline.stop_with_stdin()
    try:
        server = setup(args)
    except Exception:
        # Keystone's logging sends a failure to keystone.log only: the test
        # that waits for credential.json should see why it never comes.
        traceback.print_exc()
        print('keystone.py: set-up failed; see %s'
              % os.path.join(args.dir, 'keystone.log'), file=sys.stderr)
        sys.exit(1)
    server.serve_forever()


def setup(args):
    """Everything before serving; returns the server, ready to serve."""
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    cred_file = os.path.join(d, 'credential.json')
    if os.path.exists(cred_file):
        os.unlink(cred_file)  # a restart: the file must mean "ready"
    server = listen(args.port)
    port = server.server_address[1]
    url = 'http://127.0.0.1:%d/v3' % port
    write(os.path.join(d, 'keystone.conf'),
          CONF.format(dir=d, expiration=args.token_expiration))

    # Keystone parses sys.argv itself; it must not see our flags.
    sys.argv = [sys.argv[0]]
    skip_saml_schemas()
    import keystone.server
    keystone.server.configure(
        config_files=[os.path.join(d, 'keystone.conf')])
    log = logging.getLogger('keystone.harness')
    started = time.monotonic()

    db = os.path.join(d, 'keystone.db')
    template = os.path.abspath(args.template) if args.template else None
    made_db = False
    if not os.path.exists(db):
        if template and os.path.exists(os.path.join(template,
                                                    'keystone.db')):
            copy_template(template, d)
        else:
            from keystone.common.sql import upgrades
            upgrades.offline_sync_database_to_version()
            made_db = True
    password = ADMIN_PASSWORD
    setup_keys()
    user_id, project_id = bootstrap(password, url)
    if made_db and template:
        save_template(template, d)
    app = make_app()
    cred = make_credential(app, user_id, project_id, password)
    server.set_app(app)

    write(cred_file, json.dumps({
        'auth_url': url,
        'port': port,
        'id': cred['id'],
        'secret': cred['secret'],
        'name': cred['name'],
        'user_id': user_id,
        'project_id': project_id,
        'admin_password': password,
    }, indent=1) + '\n', 0o600)
    log.info('Set up in %.2f s; serving %s', time.monotonic() - started, url)
    return server


if __name__ == '__main__':
    main()
