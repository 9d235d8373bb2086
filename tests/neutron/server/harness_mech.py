"""An ML2 mechanism driver that binds every port at once and makes it ACTIVE.

Without any mechanism driver, Neutron cannot bind a port that has a
binding:host_id: it stays DOWN with vif_type "binding_failed", ML2 retries
the binding ten times per create and logs about 10 KB of errors. This
driver stands in for a real agent: it accepts the first segment and says
the port is up. Ports without binding:host_id are not bound at all (ML2
does not call bind_port for them) and stay DOWN, as in real Neutron.

It is found through the entry point in harness_plugins-0.dist-info/, which
run.py puts on sys.path along with this module.
"""

from neutron_lib.api.definitions import portbindings
from neutron_lib import constants
from neutron_lib.plugins.ml2 import api


class ActiveMechanismDriver(api.MechanismDriver):

    def initialize(self):
        pass

    @property
    def connectivity(self):
        # L2: no layer-3 routing needed to reach the port.
        return portbindings.CONNECTIVITY_L2

    def bind_port(self, context):
        # Bind to the first segment we are offered; vif_type "other" is
        # the catch-all type, and no VIF details are needed.
        for segment in context.segments_to_bind:
            context.set_binding(segment[api.ID], portbindings.VIF_TYPE_OTHER,
                                {}, status=constants.PORT_STATUS_ACTIVE)
            return
