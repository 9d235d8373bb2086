"""A paste filter that demands one fixed X-Auth-Token.

Real deployments put keystonemiddleware's auth_token in front of the API;
it needs a Keystone server. For tests we only need to tell "right token"
from "wrong or no token", so this filter compares the header with the
token written in api-paste.ini, and refuses with the same 401 answer
keystonemiddleware gives (body and content type copied from its
auth_token/__init__.py).
"""

import json

import webob.dec
import webob.exc


def filter_factory(global_conf, token):
    def make_filter(app):
        return TokenFilter(app, token)
    return make_filter


class TokenFilter(object):

    def __init__(self, app, token):
        self.app = app
        self.token = token

    @webob.dec.wsgify
    def __call__(self, req):
        if req.headers.get('X-Auth-Token') != self.token:
            body = {'error': {
                'code': 401,
                'title': 'Unauthorized',
                'message': 'The request you have made requires '
                           'authentication.',
            }}
            return webob.exc.HTTPUnauthorized(
                body=json.dumps(body), charset='UTF-8',
                content_type='application/json')
        return self.app
